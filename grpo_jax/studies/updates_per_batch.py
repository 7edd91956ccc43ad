"""When does reusing a rollout batch help, and when does the clip start to bind?

The main job (configs/default.py: arithmetic, the tiny-1m model) from the main base (1500
pretraining steps), arms of the same GRPO stage (80 rollout batches of 32 prompts x 8
completions) that differ in mu, the passes over each batch (`rl.num_iterations`, one
optimizer step per pass), in the clip and in the learning rate:

* `mu=1`: one step per batch (the main job: the ratio is 1, the clip never binds);
* `mu=2`, `mu=4`: two and four steps per batch with PPO's clip (epsilon 0.2);
* `mu=4, no clip`: four steps with epsilon 1e6 (the ratio unclipped: the plain importance-
  weighted policy gradient);
* `mu=4, lr=1e-3` and `mu=4, lr=4e-3`, each with and without the clip: the same four
  steps at 5 and 20 times the main job's learning rate (2e-4), where each step moves the
  token ratios further, so the clip binds on a larger share of tokens.

Every arm sees the same rollouts' budget (80 x 256 completions); the learning-rate schedule
spans each arm's own number of optimizer steps. Logged per run: held-out pass@1 and the
training clip fraction (the share of the tokens of a step's updates where the clip binds,
averaged over the steps; the first pass's ratio is 1, so it never binds there) and the KL
to the reference over the steps.
"""

from __future__ import annotations

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm, training_means

# (passes per batch, clip epsilon, learning rate); None keeps the algorithm's own epsilon
# (0.2) and the main job's learning rate (2e-4), so the mu=1 arm is the same run as
# ppo_vs_grpo's G=8 and is computed once in a shared workdir
NO_CLIP = 1e6
ARMS = {"mu=1": (1, None, None), "mu=2": (2, None, None), "mu=4": (4, None, None),
        "mu=4, no clip": (4, NO_CLIP, None),
        "mu=4, lr=1e-3": (4, None, 1e-3), "mu=4, lr=1e-3, no clip": (4, NO_CLIP, 1e-3),
        "mu=4, lr=4e-3": (4, None, 4e-3), "mu=4, lr=4e-3, no clip": (4, NO_CLIP, 4e-3)}
# the learning rates beyond the main job's: each has a clipped and an unclipped arm
HIGH_LRS = ("1e-3", "4e-3")
METRICS = ("pass@1", "format_rate")
PASS_MARGIN = 0.03

SPECS = [("mu=2", "mu=1", "pass@1"), ("mu=4", "mu=1", "pass@1"),
         ("mu=4, no clip", "mu=4", "pass@1"), ("mu=4", "mu=2", "clip_frac"),
         ("mu=1", "base", "pass@1"),
         *[(f"mu=4, lr={lr}, no clip", f"mu=4, lr={lr}", "pass@1") for lr in HIGH_LRS],
         *[(f"mu=4, lr={lr}", "mu=4", "clip_frac") for lr in HIGH_LRS]]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: the held-out evaluation, GRPO with the
    arm's passes per batch, clip range and learning rate, the evaluation again (host loop:
    several passes per batch)."""
    config = common.main_arm(tier, "eval_base,rl,eval_final")
    config.rl.num_iterations, config.rl.epsilon, lr = ARMS[arm]
    if lr is not None:
        config.rl.lr = lr
    config.rl.fused_steps = 0  # the device loop takes one update per iteration
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def _values(record) -> dict:
    return {**common.eval_values(record, METRICS),
            **training_means(record, ("clip_frac", "kl_ref"))}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    common.add_base_arm(arms, "mu=1", METRICS)
    panels = (("reward_mean", "training reward"),
              ("clip_frac", "clip fraction"),
              ("kl_ref", "KL to the reference"))
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.curve_plots(runs, ARMS, panels),
                           scales={"clip_frac": (100.0, 2)})


def table(arms: dict) -> str:
    return tables.arm_table(
        arms, ("base", *ARMS),
        ("pass@1", "format rate", "clip fraction (training mean)",
         "KL to the reference (training mean)"),
        tables.metric_row("pass@1", "format_rate", ("clip_frac", 100.0, 2), ("kl_ref", 1.0, 4)),
        "pass@1, format and clip fraction in %, the KL in nats per token; mean ± 95% "
        "half-width over (base, seed) runs.")


PPO = "Schulman et al. 2017, \"Proximal Policy Optimization Algorithms\", arXiv:1707.06347"
EXCESSIVE = ("Without a constraint, maximization of L^CPI would lead to an excessively large "
             "policy update")


def _excessive_source(lr: str | None = None) -> str:
    where = "at the main job's learning rate" if lr is None else \
        f"at learning rate {lr}, where the clip binds on more tokens"
    return (PPO + ", sec. 3 (quotation; L^CPI is the unclipped surrogate, the ratio times the "
            "advantage, which the no-clip arms maximise over their passes); tested as: the "
            "'No clipping or penalty' row of table 1 scores below clipping, so mu = 4 "
            f"without the clip ends below mu = 4 with it in held-out pass@1, {where}")


CLAIMS = (
    common.Claim("Whereas standard policy gradient methods perform one gradient update per "
                 "data sample, we propose a novel objective function that enables multiple "
                 "epochs of minibatch updates",
                 PPO + ", abstract (quotation); tested as: mu = 4 with the clip (one "
                 "optimizer step per pass, no minibatches) ends above mu = 1 in held-out "
                 "pass@1 at the same rollouts",
                 ("mu=4", "mu=1", "pass@1"), ">", margin=PASS_MARGIN,
                 why="four passes take four optimizer steps on each batch where mu = 1 takes "
                     "one, but from the same samples: where the gain is bounded by what the "
                     "rollouts show (groups all right or all wrong carry no advantage) the "
                     "extra steps add little, and at the main job's small learning rate the "
                     "clip may bind on few tokens, so they can also fit one batch's chance "
                     "split of right and wrong completions; mu = 4 can end within the margin "
                     "of mu = 1 or below it"),
    common.Claim(EXCESSIVE, _excessive_source(), ("mu=4, no clip", "mu=4", "pass@1"), "<",
                 margin=PASS_MARGIN,
                 why="at the main job's small learning rate (2e-4) four Adam steps may move "
                     "the token ratios little, so the clip binds on few tokens and removing "
                     "it changes few updates; GRPO's KL penalty to the reference stays in "
                     "both arms, so the unclipped arm can end within the margin of the "
                     "clipped one",
                 note="at the main job's learning rate the clip binds on few tokens (the "
                      "clipped arm's clip fraction in the table): the arms at 1e-3 and 4e-3 "
                      "test the claim where it binds on more"),
    *[common.Claim(EXCESSIVE, _excessive_source(lr),
                   (f"mu=4, lr={lr}, no clip", f"mu=4, lr={lr}", "pass@1"), "<",
                   margin=PASS_MARGIN,
                   headroom=(f"mu=4, lr={lr}", "pass@1", 0.0),
                   why=f"at lr {lr} each Adam step moves the token ratios further, and the "
                       "clip, which only takes the gradient off tokens already past its "
                       "range, cannot stop one step from carrying many past it: the clipped "
                       "arm can degrade as the unclipped one does (the pilot's clipped arm "
                       "at 4e-3 did in its first steps), leaving both near the same pass@1; "
                       "and GRPO's KL penalty to the reference, in both arms, can hold the "
                       "unclipped arm back. The test also means something only where the "
                       "clipped arm's clip fraction (the table; its contrast with mu=4) is a "
                       "share of tokens the clip can change, which this design measures but "
                       "cannot fix before the runs",
                   note="the room below is the clipped arm's own pass@1 (the unclipped arm "
                        "cannot end below zero): where the clipped arm collapsed to less "
                        "than the margin the claim is not testable")
      for lr in HIGH_LRS],
)

STUDY = common.Study(
    name="updates_per_batch",
    question="does GRPO gain from 2 or 4 passes over each rollout batch, and what does the "
             "clip do at 4, at learning rates where it binds on few and on more tokens, "
             "paired by seed?",
    tiers=tiers.standard(
        full="about 5.7 hours on 2 cores (the first four arms measured "
             "beside another study process, the 2 main bases already "
             "built: 24 runs on the host loop, about 3 min at mu = 1, 5 "
             "at mu = 2, 8 at mu = 4, 2.5 hours; the four arms at 1e-3 "
             "and 4e-3 estimated at mu = 4's 8 min a run, 3.2 hours)",
        mini="seconds on 2 cores: one toy base, one seed, "
             "a subset of the arms",
        mini_arms=("mu=1", "mu=4", "mu=4, lr=4e-3", "mu=4, lr=4e-3, no clip")),
    arms=tuple(ARMS), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
