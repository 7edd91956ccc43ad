"""GAE's lambda in PPO with a critic: the bias and variance of the advantage, and pass@1.

From the main base (configs/default.py's pretraining; the full tier's base seeds,
`tiers.FULL_BASES`), arms of the PPO stage as ppo_vs_grpo runs it (`config_presets.with_ppo`: a
critic initialised from the policy, a per-token KL reward, gamma 1) that differ only in the GAE
lambda (`ppo.lam`): 0, 0.5, 0.95 (the stage's default: the run is ppo_vs_grpo's PPO arm) and 1
(the Monte-Carlo return minus the critic's value).

Measured per run after training (`measure`): the final policy samples `SAMPLES` completions
of each of `PROBLEMS` held-out problems (the eval seed's; one key per seed, shared by arms);
the run's final critic (its full-state checkpoint) gives V(s_t) at every completion token;
the outcome reward (the task's accuracy + 0.2 format, on the last token; no KL term) gives
the return G_t (gamma 1). Over the valid tokens, un-whitened:

* `adv_bias`: |mean of A_lambda - A_MC|, A_MC = G_t - V(s_t) (A_lambda at lambda 1): the
  mean gap between the lambda-return and the Monte-Carlo return, an unbiased estimate of
  the lambda-return's bias against Q (G_t is unbiased for Q(s_t, a_t));
* `adv_var`: the variance of A_lambda over the tokens;

and held-out pass@1 from the run's final evaluation.
"""

from __future__ import annotations

import json
import os

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm

LAMBDAS = {"lambda=0": 0.0, "lambda=0.5": 0.5, "lambda=0.95": 0.95, "lambda=1": 1.0}
ARMS = tuple(LAMBDAS)
METRICS = ("pass@1", "format_rate")
FILE = "gae_advantages.json"
PROBLEMS, SAMPLES = {"full": 64, "mini": 4}, {"full": 8, "mini": 2}
PASS_MARGIN = 0.03  # held-out pass@1, as the other studies
VAR_MARGIN = 0.01  # reward^2: the outcome reward's variance is ~0.2 at 30% pass@1
BIAS_MARGIN = 0.01  # reward units
SPECS = [("lambda=0", "lambda=1", "adv_var"), ("lambda=0", "lambda=0.95", "adv_bias"),
         ("lambda=0.5", "lambda=1", "adv_var"), ("lambda=0.95", "lambda=0", "pass@1"),
         ("lambda=0.95", "lambda=1", "pass@1")]

base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from, evaluated before and after: the PPO
    stage of `config_presets.with_ppo` with the arm's lambda."""
    from grpo_jax import config_presets

    config = config_presets.with_ppo(common.main_arm(tier, "eval_base,rl,eval_final"))
    config.ppo.lam = LAMBDAS[arm]
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def _critic(workdir: str):
    """The critic's parameters of the run's last full-state checkpoint (the PPO stage's)."""
    from grpo_jax.checkpoint import Checkpointer

    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=None)
    try:
        for step in reversed(ckpt.all_steps()):
            state, _ = ckpt.restore(step)
            if "critic_params" in state:
                return state["critic_params"]
    finally:
        ckpt.close()
    raise FileNotFoundError(f"{workdir}: no checkpoint holds the critic")


def measure_advantages(record, tier: str) -> dict:
    """`adv_bias` and `adv_var` (the module's docstring) of one finished PPO run."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax import losses
    from grpo_jax.rl.ppo import completion_values, ppo_token_rewards
    from grpo_jax.rl.reward_model import scalar_head_policy
    from grpo_jax.runner.model_init import load_run_policy
    from grpo_jax.studies import measure

    setup = measure.held_out(record.workdir, PROBLEMS[tier])
    run, section = setup.run, setup.run.config.ppo
    samples = SAMPLES[tier]
    sampling = measure.sampling_config(run, section.max_new_tokens, group=samples)
    rows = [ex for ex in setup.examples for _ in range(samples)]
    key = jax.random.fold_in(jax.random.key(measure.KEY), record.seed)
    ro = measure.sample(run, run.params, rows, key, sampling=sampling,
                        weights=measure.WEIGHTS)
    model_config = load_run_policy(record.workdir, tokenizer=run.tokenizer)[0]
    critic = scalar_head_policy(model_config)
    tokens = jnp.concatenate([jnp.asarray(ro.prompt_tokens), jnp.asarray(ro.tokens)], 1)
    attn = jnp.concatenate([jnp.asarray(ro.prompt_mask, bool),
                            jnp.asarray(ro.attention_mask, bool)], 1)
    mask = jnp.asarray(ro.loss_mask, bool) & jnp.asarray(ro.attention_mask, bool)
    prompt_len = int(np.shape(ro.prompt_tokens)[1])
    values = jnp.where(mask, completion_values(critic, _critic(record.workdir), tokens, attn,
                                               prompt_len), 0.0)
    zeros = jnp.zeros(mask.shape, jnp.float32)
    rewards = ppo_token_rewards(jnp.asarray(ro.rewards, jnp.float32), zeros, zeros, mask,
                                beta=0.0)
    gae = {lam: losses.token_gae(rewards, values, mask, gamma=section.gamma, lambda_=lam)[0]
           for lam in (float(section.lam), 1.0)}
    valid = np.asarray(mask)
    adv = np.asarray(gae[float(section.lam)])[valid]
    gap = adv - np.asarray(gae[1.0])[valid]
    return {"adv_bias": float(abs(gap.mean())), "adv_var": float(adv.var()),
            "tokens": int(valid.sum()), "problems": len(setup.examples), "samples": samples}


def measure_runs(runs: common.StudyRuns) -> None:
    """`measure_advantages` of each finished run, written beside it (skipped if there)."""
    for record in runs.runs:
        path = os.path.join(record.workdir, FILE)
        if record.finished and not os.path.exists(path):
            data = measure_advantages(record, runs.tier)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)


def _values(record) -> dict:
    with open(os.path.join(record.workdir, FILE), encoding="utf-8") as f:
        data = json.load(f)
    return {**common.eval_values(record, METRICS),
            **{k: data[k] for k in ("adv_bias", "adv_var")}}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    common.add_base_arm(arms, "lambda=0.95", METRICS)
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, runs.tier),
                           plots=tables.bar_plots(arms, (
                               ("adv_bias", "|mean A_lambda - A_MC|", 1.0),
                               ("adv_var", "variance of A_lambda", 1.0), tables.PASS_AT_1)))


def table(arms: dict, tier: str) -> str:
    return tables.arm_table(
        arms, ("base", *ARMS), ("pass@1", "advantage bias", "advantage variance"),
        tables.metric_row("pass@1", ("adv_bias", 1.0, 4), ("adv_var", 1.0, 4)),
        "pass@1 in %; advantage bias |mean(A_lambda - A_MC)| in reward units and the "
        f"advantage variance in reward^2, over the valid tokens of the final policy's "
        f"{SAMPLES[tier]} samples of each of {PROBLEMS[tier]} held-out problems with the "
        "run's final critic (un-whitened); mean ± 95% half-width over (base, seed) runs.")


TUTORIAL = ("the tutorial on policy gradient to R1 (paraphrase): \"small k high bias / low "
            "variance, lambda -> 1 Monte Carlo\" (Schulman et al. 2016, arXiv:1506.02438, "
            "sec. 3)")
GAE = ("Schulman et al. 2016, \"High-Dimensional Continuous Control Using Generalized "
       "Advantage Estimation\", arXiv:1506.02438, sec. 6 (close paraphrase)")
CLAIMS = (
    common.Claim("small lambda: low variance (lambda -> 1: the Monte-Carlo return, high "
                 "variance)", TUTORIAL + "; tested as the token variance of the advantage "
                 "at lambda 0 against lambda 1", ("lambda=0", "lambda=1", "adv_var"), "<",
                 margin=VAR_MARGIN,
                 why="lambda 0's advantage at a token is the critic's change of value to the "
                     "next token (the outcome reward added at the last), lambda 1's the "
                     "return minus the value: a critic whose values swing from token to "
                     "token gives the first a variance as high as the return's, and one that "
                     "reads the outcome off the trace written so far leaves little variance "
                     "in either, so the two can lie within the margin",
                 note="can fail: a critic whose values swing from token to token gives "
                      "lambda 0 a variance as high as the return's"),
    common.Claim("small lambda: high bias", TUTORIAL + "; tested as the bias against the "
                 "Monte-Carlo return at lambda 0 against lambda 0.95 (lambda 1's is 0 by "
                 "construction, not a test)", ("lambda=0", "lambda=0.95", "adv_bias"), ">",
                 margin=BIAS_MARGIN,
                 why="lambda 0's gap to the Monte-Carlo advantage is the critic's error at "
                     "the next token (its value there minus the return from there), and each "
                     "arm's critic is measured on its own final policy's samples, the states "
                     "it was last fitted to: a critic calibrated on them has no mean error, "
                     "so the one-step arm's bias can stay within the margin of the default's",
                 note="can fail: a critic calibrated on its own policy's states has no mean "
                      "bias at any lambda"),
    common.Claim("intermediate lambda (0.92 to 0.98) works best; lambda 1 (high variance) "
                 "and small lambda (high bias) do worse", GAE + "; tested as held-out pass@1, "
                 "lambda 0.95 against lambda 1", ("lambda=0.95", "lambda=1", "pass@1"), ">",
                 margin=PASS_MARGIN,
                 why="each completion has one outcome reward at its end, at most 40 tokens "
                     "away, and no discount, so the Monte-Carlo return varies only with the "
                     "outcome and the small per-token KL reward: lambda 0.95 has little "
                     "variance to remove, the advantages are whitened over each batch in "
                     "both arms, and the two can train alike within the margin"),
    common.Claim("intermediate lambda (0.92 to 0.98) works best; small lambda (high bias) "
                 "does worse", GAE + "; tested as held-out pass@1, lambda 0.95 against "
                 "lambda 0", ("lambda=0.95", "lambda=0", "pass@1"), ">", margin=PASS_MARGIN,
                 why="the critic starts from the pretrained policy, a model of these very "
                     "traces, and is refitted on every batch at five times the policy's "
                     "learning rate: if its values track the outcome closely, lambda 0's "
                     "bias costs little and the one-step arm trains as well as the default"),
)

STUDY = common.Study(
    name="gae_lambda",
    question="does GAE's lambda trade the advantage's bias against its variance in PPO with "
             "a critic (lambda 0, 0.5, 0.95, 1), and which lambda trains best, paired by "
             "seed?",
    tiers=tiers.standard(
        full="estimated 3.5 hours on 2 cores, not yet run (24 PPO runs of about 11 "
             "min, ppo_vs_grpo's figure; lambda 0.95's six are its PPO arm's)",
        mini="about 23 s of CPU on 2 cores, measured (23 s for its test alone, which "
             "compiles every program itself): one toy base, one seed, lambda 0 and 0.95 "
             "(ppo_vs_grpo's PPO run, made once in a shared workdir)",
        mini_arms=("lambda=0", "lambda=0.95")),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure_runs, claims=CLAIMS,
)
