"""Do the few high-entropy "forking" tokens carry what RL changes, and is a policy gradient on
them alone enough?

The main job (configs/default.py: arithmetic, the tiny-1m model) from the main base (1500
pretraining steps; the full tier's base seeds, `tiers.FULL_BASES`), three arms of the same GRPO
stage that differ only in the tokens whose policy-gradient term counts (`rl.entropy_tokens`,
`rl.entropy_side`; chosen in each update by the current policy's entropy over the batch's
tokens):

* `all`: every token (the main job);
* `top20`: the 20% highest-entropy tokens;
* `bottom80`: the 80% lowest-entropy tokens.

After training, each run's final policy samples 4 completions of every held-out problem;
at each sampled token the exact KL(pi_RL || pi_base) of the next-token distributions and the
base's entropy are measured (`evals.token_analysis`), and `kl_top20_share` is the share of
the summed KL on the tokens whose base entropy is in the top 20%. The pseudo-arm
`even spread` holds 0.2 for every (base, seed): the share of tokens, what the KL share would
be if the change were spread evenly.
"""

from __future__ import annotations

import json
import math

from grpo_jax import storage
from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies import measure as measure_lib
from grpo_jax.studies.arms import per_arm

ALL, TOP, BOTTOM, EVEN = "all", "top20", "bottom80", "even spread"
SELECTION = {ALL: (1.0, "top"), TOP: (0.2, "top"), BOTTOM: (0.8, "bottom")}
FRACTION = 0.2  # the forking tokens' share of the tokens
SAMPLES = {"full": 4, "mini": 2}
KEY = 20260  # the measurement's sampling key, the same for every policy
MEASURED = ("kl_top20_share", "kl_mean", "entropy_mean", "base_entropy_mean",
            "kl_digit_share", "digit_share")
PASS_MARGIN = 0.03

SPECS = [(TOP, ALL, "pass@1"), (BOTTOM, ALL, "pass@1"), (ALL, EVEN, "kl_top20_share"),
         (TOP, BOTTOM, "pass@1"), (ALL, "base", "pass@1")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run: the held-out evaluation, the main job's GRPO stage with the arm's
    token selection, the evaluation again, from the base in model.init_from."""
    config = common.main_arm(tier, "eval_base,rl,eval_final")
    config.rl.entropy_tokens, config.rl.entropy_side = SELECTION[arm]
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in SELECTION}


# ---- the post-hoc measurement ----------------------------------------------------------------

def _measure_run(record, base: str, samples: int) -> dict:
    """The final policy's samples on the held-out problems, the KL to the base and both
    entropies at each sampled token."""
    import jax
    import numpy as np

    from grpo_jax.evals.token_analysis import token_divergence, top_share

    held_out = measure_lib.held_out(base)
    run = held_out.run
    config, tokenizer, policy, base_params = run.config, run.tokenizer, run.policy, run.params
    params = common.load_run_params(record.workdir, tokenizer)
    rows = [ex for ex in held_out.examples for _ in range(samples)]
    sampling = measure_lib.sampling_config(run, int(config.rl.max_new_tokens), group=samples)
    prompt_len = int(config.task.prompt_len)
    ro = measure_lib.sample(run, params, rows, jax.random.key(KEY), sampling=sampling,
                            weights={"accuracy": 1.0})
    tokens = np.concatenate([ro.prompt_tokens, ro.tokens], 1)
    attention = np.concatenate([ro.prompt_mask, ro.attention_mask], 1)
    out = token_divergence(policy, params, base_params, tokens, attention, prompt_len)
    mask = np.asarray(ro.loss_mask, bool)
    digits = np.isin(np.asarray(ro.tokens), [tokenizer.token_to_id(str(d)) for d in range(10)])
    kl = out["kl"]
    total = kl[mask].sum()
    return {"kl_top20_share": top_share(kl, out["base_entropy"], mask, FRACTION),
            "kl_mean": float(kl[mask].mean()), "entropy_mean": float(out["entropy"][mask].mean()),
            "base_entropy_mean": float(out["base_entropy"][mask].mean()),
            "kl_digit_share": float(kl[mask & digits].sum() / total) if total else math.nan,
            "digit_share": float((mask & digits).sum() / max(mask.sum(), 1)),
            "tokens": int(mask.sum()), "samples": samples, "key": KEY}


def measure(runs: common.StudyRuns) -> None:
    """tokens.json in every finished run without one."""
    for record in runs.runs:
        path = storage.join(record.workdir, "tokens.json")
        if not record.finished or storage.isfile(path):
            continue
        row = _measure_run(record, runs.bases[record.base]["workdir"], SAMPLES[runs.tier])
        storage.write_text(path, json.dumps(row, indent=2, allow_nan=True))
        print(f"[studies] forking_tokens {record.arm} seed={record.seed}: KL share of the "
              f"top-20% entropy tokens {row['kl_top20_share']:.3f}", flush=True)


# ---- the analysis ---------------------------------------------------------------------------

def _values(record) -> dict:
    values = common.eval_values(record, ("pass@1",))
    path = storage.join(record.workdir, "tokens.json")
    if storage.isfile(path):
        measured = json.loads(storage.read_text(path))
        values.update({name: measured.get(name) for name in MEASURED})
    rows = [r for r in common.training_rows(record) if "token_frac" in r]
    values["token_frac"] = sum(r["token_frac"] for r in rows) / len(rows) if rows else 1.0
    return values


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, SELECTION)
    common.add_base_arm(arms, ALL, ("pass@1",))
    common.constant_arm(arms, ALL, EVEN, "kl_top20_share", FRACTION)
    panels = (("reward_mean", "training reward"),
              ("entropy", "policy entropy (training tokens)"))
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           protocol={"notes": f"token measurement: the held-out problems, "
                                              f"{SAMPLES[runs.tier]} samples each from the "
                                              f"final policy, key {KEY}"},
                           plots=tables.curve_plots(runs, SELECTION, panels))


def table(arms: dict) -> str:
    def row(m):
        cell = tables.optional_cells(m)
        return [cell("pass@1"), cell("token_frac"), cell("kl_top20_share"),
                f"{cell('kl_digit_share')} ({cell('digit_share')})", cell("kl_mean", 1.0, 4),
                f"{cell('entropy_mean', 1.0, 3)} ({cell('base_entropy_mean', 1.0, 3)})"]

    return tables.arm_table(
        arms, (*SELECTION, "base"),
        ("pass@1", "tokens trained", "KL share of the top-20% entropy tokens",
         "KL share of digits (digits' share of tokens)", "mean KL per token", "entropy (base)"),
        row,
        "pass@1 and shares in %, mean ± 95% half-width over (base, seed) runs; KL in nats per "
        "sampled token. \"tokens trained\" is the share of the loss mask's tokens that carried "
        "the policy gradient (training mean). The KL columns measure the final policy against "
        "its base on its own samples of the held-out problems; the base row is the runs' "
        "evaluation before RL.", first="arm")


SOURCE = ("Wang et al. 2025, \"Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive "
          "Effective Reinforcement Learning for LLM Reasoning\", arXiv:2506.01939, abstract "
          "(close paraphrase)")
CLAIMS = (
    common.Claim("restricting policy-gradient updates to the 20% highest-entropy (forking) "
                 "tokens keeps performance comparable to full-gradient updates",
                 SOURCE + "; their comparable result is on Qwen3-8B, larger models gain more",
                 (TOP, ALL, "pass@1"), "=", margin=PASS_MARGIN,
                 why="the loss keeps the whole mask's token counts, so top20's gradient is "
                     "all's without the terms of the 80% it drops, at the same learning "
                     "rate: the test fails if those terms carried learning that matters "
                     "(the answer's digits, the tags the format reward acts on) or their "
                     "loss slows the 80 steps enough to move pass@1 by 3 points or more"),
    common.Claim("training only on the 80% lowest-entropy tokens leads to a marked decline in "
                 "performance", SOURCE, (BOTTOM, ALL, "pass@1"), "<", margin=PASS_MARGIN,
                 why="the entropy ranking is over the whole batch's tokens: in short worked "
                     "arithmetic the tokens where a step can go either way (an operator's "
                     "result the base sometimes confuses) may be more than a fifth of them, "
                     "or crowd into the hardest problems' completions, so the bottom 80% "
                     "keeps many forks and its gradient can move pass@1 to within 3 points "
                     "of the full one"),
    common.Claim("RLVR mainly adjusts the high-entropy tokens: they carry more of the change "
                 "than their share", SOURCE + "; tested as the KL(pi_RL || pi_base) share of "
                 "the tokens in the base's top 20% of entropy against 20%",
                 (ALL, EVEN, "kl_top20_share"), ">", margin=0.05,
                 why="the share is taken by the base's entropy at the RL policy's samples: "
                     "the test fails if GRPO's change sits on tokens the base was sure of "
                     "(a step it takes confidently and wrongly, the tags the format reward "
                     "acts on) or spreads over the digits of every step, leaving the top "
                     "20% less than 25% of the KL",
                 note="a token's entropy is the base's, at the RL policy's samples"),
)

STUDY = common.Study(
    name="forking_tokens",
    question="do the high-entropy minority of tokens carry what GRPO changes, and does a "
             "policy gradient on the top 20% by entropy match the full one while the bottom "
             "80% falls short, paired by seed?",
    tiers=tiers.standard(
        full="about 35 min on 2 cores (estimated: 2 main bases of 1500 "
             "steps, shared with the other studies of the main base; 18 "
             "runs of the main job's GRPO stage with two evaluations and "
             "the token measurement)"),
    arms=tuple(SELECTION), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
