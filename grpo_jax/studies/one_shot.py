"""How few training problems does GRPO need: RL on 1, 4 and 16 problems against the full set?

The main job (configs/default.py: arithmetic, the tiny-1m model) from the main base (1500
pretraining steps; the full tier's base seeds, `tiers.FULL_BASES`), four arms of the same GRPO
stage (80 steps, 32 prompts x 8 completions) that differ only in the training problems the
prompts are drawn from (`task.train_size`; the held-out problems are the same 128 for every
arm):

* `1 problem`: the problem the paper's selection rule picks (below), the same for every seed
  of a base;
* `4 problems`, `16 problems`: the first problems of the full set's seeded order, for a given
  seed (so the 4 are among the 16);
* `full set`: 20,000 problems (the main job's).

The one problem is chosen as Wang et al. (2025, arXiv:2504.20571) choose theirs, by
the historical variance score: a prior GRPO run on a candidate pool records each problem's
training accuracy in each epoch, and the problem whose accuracy varies most over the epochs
(variance over epochs; the first in pool order on a tie) is the one. Fixed in advance here:
the pool is the first 128 training problems of seed `POOL_SEED`'s order (`prior_sizes`),
the same for every base; the prior run is the main job's GRPO stage from the base on that
pool for 20 epochs (each pool entry once per epoch, 8 completions each; a problem the
training split repeats is scored on all its completions), host rewards, every completion
logged (`rl_samples_logged = -1`); `select` reads its samples.jsonl.
"""

from __future__ import annotations

import json

from grpo_jax import storage
from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm

SIZES = {"1 problem": 1, "4 problems": 4, "16 problems": 16, "full set": 20000}
ONE, FULL = "1 problem", "full set"
METRICS = ("pass@1", "pass@8", "format_rate")
PASS_MARGIN = 0.03
POOL_SEED = 0  # the candidate pool: the first POOL training problems of this seed's order
PRIOR_STAGE = "rl"


def prior_sizes(tier: str) -> tuple[int, int]:
    """(POOL, PRIOR_EPOCHS) of a tier: 128 problems for 20 epochs (80 steps of 32 prompts,
    the arms' own length) at full; 8 for 3 epochs at mini."""
    return (128, 20) if tier == "full" else (8, 3)

SPECS = [(ONE, "base", "pass@1"), (ONE, FULL, "pass@1"), ("16 problems", FULL, "pass@1"),
         ("4 problems", FULL, "pass@1"), (FULL, "base", "pass@1")]


def prior_config(tier: str, roles: dict):
    """The selection's prior run: the main job's GRPO stage from the base (roles["base"]) on
    the candidate pool for the tier's epochs, host rewards, every completion logged."""
    config = common.main_arm(tier, PRIOR_STAGE)
    config.model.init_from = roles["base"]
    pool, epochs = prior_sizes(tier)
    config.task.train_seed = POOL_SEED
    config.task.train_size = pool
    config.rl.steps = epochs * pool // config.rl.num_prompts
    config.rl.fused_steps = 0  # host rollouts: each completion with its reward components
    config.rl_samples_logged = -1
    return config


def base_config(tier: str) -> dict:
    """The main base, then the selection's prior run from it."""
    return {"base": common.main_base(tier), "prior": lambda roles: prior_config(tier, roles)}


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: the held-out evaluation, the main
    job's GRPO stage on the arm's training problems, the evaluation again. `1 problem`
    trains on the candidate pool narrowed to the selected problem (task.train_pick, set
    per base by `attach`)."""
    config = common.main_arm(tier, "eval_base,rl,eval_final")
    if arm == ONE:
        config.task.train_seed = POOL_SEED
        config.task.train_size = prior_sizes(tier)[0]
    else:
        config.task.train_size = SIZES[arm]
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in SIZES}


def historical_variance(rows: list[dict], prompts: list[str], steps_per_epoch: int
                        ) -> tuple[list[float], list[list[float]]]:
    """Each pool problem's historical variance score from a run's logged completions.

    `rows`: samples.jsonl lines of the prior stage ({"step", "prompt", "accuracy", ...}),
    every completion of every step; `prompts`: the pool's prompts in pool order. Epoch e
    holds the steps at positions [e * steps_per_epoch, (e + 1) * steps_per_epoch) of the
    stage; s_ie is problem i's mean accuracy over its completions in epoch e and its score
    is var_e(s_ie), the population variance over the epochs it was seen in (0 when seen in
    fewer than two). Returns (scores, accuracies per epoch), in pool order."""
    import numpy as np

    steps = sorted({int(r["step"]) for r in rows})
    epoch_of = {step: i // steps_per_epoch for i, step in enumerate(steps)}
    sums: dict[str, dict[int, list[float]]] = {}
    for row in rows:
        by_epoch = sums.setdefault(row["prompt"], {})
        by_epoch.setdefault(epoch_of[int(row["step"])], []).append(float(row["accuracy"]))
    scores, curves = [], []
    for prompt in prompts:
        by_epoch = sums.get(prompt, {})
        curve = [float(np.mean(by_epoch[e])) for e in sorted(by_epoch)]
        curves.append(curve)
        scores.append(float(np.var(curve)) if len(curve) > 1 else 0.0)
    return scores, curves


def top(scores: list[float]) -> int:
    """The position of the highest score, the first one on a tie (the paper's pi_1)."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def select(prior_workdir: str) -> dict:
    """The selected problem of a finished prior run: {"index" (in the pool), "prompt",
    "score", "accuracy_by_epoch", "pool", "epochs", "scored" (problems with a score > 0),
    "scores"}: the highest historical variance score, the first in pool order on a tie."""
    from grpo_jax.metrics import SAMPLES_FILENAME
    from grpo_jax.results import FinishedRun
    from grpo_jax.runner.inputs import build_task, train_examples
    from grpo_jax.runner.prompts import prompt_of

    config = FinishedRun(prior_workdir).config
    task = build_task(config)
    pool = train_examples(config, task)
    prompts = [prompt_of(config, task, None, ex) for ex in pool]
    text = storage.read_text(storage.join(prior_workdir, SAMPLES_FILENAME))
    rows = [row for row in map(json.loads, text.splitlines())
            if row.get("stage") == PRIOR_STAGE]
    steps_per_epoch = len(pool) // config.rl.num_prompts
    scores, curves = historical_variance(rows, prompts, steps_per_epoch)
    index = top(scores)
    return {"index": index, "prompt": pool[index].prompt, "answer": pool[index].answer,
            "score": scores[index], "accuracy_by_epoch": curves[index], "pool": len(pool),
            "epochs": max((len(c) for c in curves), default=0),
            "scored": sum(v > 0 for v in scores), "scores": scores}


def attach(config, base: dict) -> None:
    """Every arm from the main base; `1 problem` (the arm with task.train_seed) trains on the
    problem `select` picks from the base's prior run."""
    roles = base["roles"]
    config.model.init_from = roles["base"]
    if "train_seed" in config.task:
        config.task.train_pick = (select(roles["prior"])["index"],)


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, lambda r: common.eval_values(r, METRICS), SIZES)
    common.add_base_arm(arms, FULL, METRICS)
    panels = (("reward_mean", "training reward"), ("reward_std", "reward std within groups"))
    selection = {key: {k: v for k, v in select(base["roles"]["prior"]).items() if k != "scores"}
                 for key, base in runs.bases.items()}
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, runs.runs[0].config),
                           extra={"selection": selection},
                           plots=tables.curve_plots(runs, SIZES, panels))


def table(arms: dict, config) -> str:
    return tables.arm_table(
        arms, ("base", *SIZES), ("pass@1", "pass@8", "format rate"),
        tables.metric_row("pass@1", "pass@8", "format_rate"),
        f"In %, mean ± 95% half-width over (base, seed) runs, on {tables.rl_caption(config)} "
        "(the base: before).")


SOURCE = ("Wang et al. 2025, \"Reinforcement Learning for Reasoning in Large Language Models "
          "with One Training Example\", arXiv:2504.20571, abstract (close paraphrase)")
CLAIMS = (
    common.Claim("RLVR with one training example raises held-out performance substantially",
                 SOURCE + "; the one example chosen by the paper's historical variance score "
                 "over a prior run on a 128-problem pool",
                 (ONE, "base", "pass@1"), ">", margin=PASS_MARGIN,
                 can_fail="fails unless GRPO on the selected problem ends at least 3 points of "
                          "held-out pass@1 above the base, Holm p < 0.05, no base the other "
                          "way; the selection makes the problem's groups carry a signal (its "
                          "training accuracy moved over the prior run), not that what it "
                          "teaches carries over to other problems"),
    common.Claim("1-shot RLVR performs comparably to RLVR on a large training set", SOURCE +
                 "; their comparison set is 1.2k problems; here the full 20,000",
                 (ONE, FULL, "pass@1"), "=", margin=PASS_MARGIN,
                 why="every prompt of the one-problem arm is the same short expression, "
                     "whose groups carry no advantage once all their completions are right, "
                     "while the full set keeps supplying groups of mixed scores over every "
                     "operator combination: what the one problem teaches (dropping its own "
                     "operators' confusions) may not reach the held-out problems' other "
                     "operators, or sharpening one answer may disturb them, and either "
                     "puts the arms more than the margin apart"),
    common.Claim("test performance keeps improving after the training accuracy on the one "
                 "example saturates (post-saturation generalization)", SOURCE, None,
                 untestable="the held-out problems are evaluated once, after the 80 steps; "
                            "a curve would need evaluations during the stage"),
)

STUDY = common.Study(
    name="one_shot",
    question="does GRPO on 1 training problem (chosen by the 1-shot paper's historical "
             "variance score), 4 or 16 raise held-out pass@1 as much as on the full 20,000, "
             "paired by seed?",
    tiers=tiers.standard(
        full="about 70 min on 2 cores (61 min measured beside another "
             "study process and the test suite for the 24 runs of the "
             "main job's GRPO stage with two evaluations, the 2 main bases "
             "shared with the other studies of the main base; plus an "
             "estimated 4 min per base for the prior run, 80 GRPO steps "
             "with host rewards)",
        mini="seconds on 2 cores: one toy base, one seed, "
             "a subset of the arms",
        mini_arms=(ONE, FULL)),
    arms=tuple(SIZES), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=attach, claims=CLAIMS,
)
