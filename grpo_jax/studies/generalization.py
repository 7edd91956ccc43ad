"""SFT memorizes, RL generalizes? SFT and GRPO post-trained on one operator set, tested on
another (Chu et al. 2025, arXiv:2501.17161).

From the main base (configs/default.py's pretraining on the whole task: one or two of + - *
on operands 1-9; the full tier's base seeds, `tiers.FULL_BASES`), two arms post-trained on the
in-distribution slice, the problems written with + and - only (task.kwargs.operators =
`SLICE`), at the same budget (update_sparsity's two arms: the same steps, sequences per step
and learning rate, Adam, from the same base):

* `grpo`: the main job's GRPO stage on the slice's training problems;
* `sft`: supervised fine-tuning on the slice's clean worked solutions, as many sequences.

Two held-out sets, both of the held-out split (which never shares a problem with training: a
problem's id decides its split) and the same problems for every seed (task.eval_seed):

* in distribution: the slice's held-out problems, the runs' own `eval_base` and `eval_final`
  (pass@1, format rate; `eval_base` gives the `base` arm, paired by (base, seed));
* out of distribution: held-out problems of products only (operators `OOD`: the operator the
  post-training never shows), measured after training (`measure`): each run's final policy
  and the base model sampled with one key per seed (`measure.KEY` folded with the seed, so
  the arms and the base of a seed share it), `OOD_SAMPLES` completions of each of
  `OOD_PROBLEMS` problems at temperature 1 within the eval's token limit: `pass@1_ood` and
  `ood_format_rate`.

Per run, `pass@1_gap` = (pass@1 - the base's) - (pass@1_ood - the base's): the in-distribution
gain less the out-of-distribution change; the pseudo-arm `no gap` holds 0 for every (base,
seed), the bar a memorizing SFT clears. "Out of distribution" means outside the post-training
slice: the base was pretrained on products too.
"""

from __future__ import annotations

import json

from grpo_jax import storage
from grpo_jax.studies import common, tables, tiers, update_sparsity
from grpo_jax.studies import measure as measure_lib

GRPO, SFT, BASE, NO_GAP = "grpo", "sft", "base", "no gap"
ARMS = (GRPO, SFT)
SLICE, OOD = "+-", "*"  # the post-training slice's operators; the held-out operator
OOD_PROBLEMS = {"full": 64, "mini": 4}  # the task holds 87 held-out problems of products only
OOD_SAMPLES = {"full": 16, "mini": 2}
BATCH_ROWS = {"full": 256, "mini": 8}
FILE = "generalization_ood.json"
METRICS = ("pass@1", "format_rate")
PASS_MARGIN = 0.03  # held-out pass@1, as the other studies
SPECS = [(GRPO, SFT, "pass@1_ood"), (GRPO, BASE, "pass@1_ood"), (SFT, BASE, "pass@1_ood"),
         (SFT, NO_GAP, "pass@1_gap"), (GRPO, BASE, "pass@1"), (SFT, BASE, "pass@1")]

base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: update_sparsity's arm of the same name
    (GRPO, or SFT of the same steps, sequences per step and learning rate), its training and
    in-distribution evaluations on the slice's problems."""
    config = update_sparsity.arm_config(update_sparsity.RL if arm == GRPO else arm, tier)
    config.task.kwargs.operators = SLICE
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


# ---- the out-of-distribution measurement ------------------------------------------------------

def ood_examples(config, problems: int) -> list:
    """`problems` held-out problems of `config`'s task drawn with operators `OOD` only (its
    other keywords kept), chosen by its task.eval_seed: the same for every seed."""
    from grpo_jax import tasks as tasks_lib

    kwargs = {**config.task.kwargs.to_dict(), "operators": OOD}
    task = tasks_lib.task_of(config.task.name, kwargs)[0]
    return task.examples("test", problems, seed=common.eval_seed(config))


def base_ood_path(runs: common.StudyRuns, key: str, seed: int) -> str:
    """Where the study keeps the base model's out-of-distribution draw with `seed`'s key."""
    return storage.join(runs.root, "base_model", f"ood,{key},seed={seed}.json")


def measure(runs: common.StudyRuns) -> None:
    """FILE in every finished run without one, and the base model's draw with each seed's key
    (`base_ood_path`): per problem, the correct and well-formed completions of
    `OOD_SAMPLES` (`measure.sample_problems`); a finished measurement is not made again."""
    import time

    tier = runs.tier
    for key, base, todo, base_todo in measure_lib.pending(runs, measure_lib.has_file(FILE),
                                                          base_ood_path):
        run = common.load_finished(base["workdir"])
        eval_seed = common.eval_seed(run.config)
        setup = measure_lib.HeldOut(run, ood_examples(run.config, OOD_PROBLEMS[tier]),
                                    eval_seed)
        max_new = int(run.config.eval_final.max_new_tokens)

        def write(path, params, seed, model, setup=setup, max_new=max_new):
            t0 = time.time()
            problems = measure_lib.sample_problems(
                setup, params, samples=OOD_SAMPLES[tier], seed=seed, max_new_tokens=max_new,
                batch_rows=BATCH_ROWS[tier])
            storage.write_text(path, json.dumps(
                {"model": model, "seed": seed, "key": measure_lib.KEY,
                 "eval_seed": setup.eval_seed, "operators": OOD, "problems": problems},
                indent=1))
            print(f"[studies] generalization: {model} seed={seed} sampled out of "
                  f"distribution in {time.time() - t0:.0f}s", flush=True)

        storage.makedirs(storage.join(runs.root, "base_model"))
        for seed in base_todo:
            write(base_ood_path(runs, key, seed), run.params, seed, base["workdir"])
        for record in todo:
            params = common.load_run_params(record.workdir, run.tokenizer)
            write(storage.join(record.workdir, FILE), params, record.seed, record.workdir)


def ood_figures(problems: list[dict] | None) -> dict:
    """pass@1 and the format rate over a draw's completions (every problem has the same
    number of samples); None for both without a draw."""
    if not problems:
        return {"pass@1_ood": None, "ood_format_rate": None}
    total = sum(p["samples"] for p in problems)
    return {"pass@1_ood": sum(p["correct"] for p in problems) / total,
            "ood_format_rate": sum(p["formatted"] for p in problems) / total}


def gain_gap(after: float | None, before: float | None, after_ood: float | None,
             before_ood: float | None) -> float | None:
    """(after - before) - (after_ood - before_ood): the gain on the slice less the change out
    of it; None when a value is missing."""
    if None in (after, before, after_ood, before_ood):
        return None
    return (after - before) - (after_ood - before_ood)


# ---- the analysis -----------------------------------------------------------------------------

def analyze(runs: common.StudyRuns) -> common.Analysis:
    rows = common.ArmRows()

    def add(name, record, values):
        rows.add(name, record.base, record.seed, values)

    based = set()
    for record in runs.runs:
        if not record.finished or record.arm not in ARMS:
            continue
        values = common.eval_values(record, METRICS)
        path = storage.join(record.workdir, FILE)
        ood = ood_figures(measure_lib.load_problems(path) if storage.isfile(path) else None)
        base_ood = ood_figures(measure_lib.load_problems(
            base_ood_path(runs, record.base, record.seed)))
        gap = gain_gap(values["pass@1"], values["base_pass@1"], ood["pass@1_ood"],
                       base_ood["pass@1_ood"])
        add(record.arm, record, {**{m: values[m] for m in METRICS}, **ood, "pass@1_gap": gap})
        if (record.base, record.seed) not in based:  # the base model, once per (base, seed)
            based.add((record.base, record.seed))
            add(BASE, record, {**{m: values[f"base_{m}"] for m in METRICS}, **base_ood})
    arms = rows.arms((BASE, *ARMS))
    common.constant_arm(arms, SFT, NO_GAP, "pass@1_gap", 0.0)
    tier = runs.tier
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, tier),
        extra={"slice_operators": SLICE, "ood_operators": OOD,
               "ood_problems": OOD_PROBLEMS[tier], "ood_samples": OOD_SAMPLES[tier],
               "sampling_key": measure_lib.KEY},
        protocol={"notes": (
            f"in distribution: the runs' eval stages on the held-out problems of operators "
            f"{SLICE!r} (the post-training slice); out of distribution: {OOD_PROBLEMS[tier]} "
            f"held-out problems of operators {OOD!r} x {OOD_SAMPLES[tier]} samples at "
            f"temperature 1, measured after training with one key per seed "
            f"({measure_lib.KEY} folded with the seed) shared by the arms and the base model")},
        plots=tables.bar_plots(arms, (
            ("pass@1", f"pass@1 in distribution ({SLICE}), %", 100.0),
            ("pass@1_ood", f"pass@1 out of distribution ({OOD}), %", 100.0))))


def table(arms: dict, tier: str) -> str:
    return tables.arm_table(
        arms, (BASE, *ARMS),
        (f"pass@1, slice ({SLICE})", f"format rate, slice ({SLICE})",
         f"pass@1, out of distribution ({OOD})", f"format rate, out of distribution ({OOD})",
         "slice gain - OOD change"),
        tables.metric_row("pass@1", "format_rate", "pass@1_ood", "ood_format_rate",
                          "pass@1_gap"),
        f"All in %, mean ± 95% half-width over (base, seed) runs. Slice: the runs' own "
        f"held-out evaluation of the post-training slice's problems; out of distribution: "
        f"{OOD_PROBLEMS[tier]} held-out problems of products only x {OOD_SAMPLES[tier]} "
        f"samples, measured after training. The last column: each run's gain on the slice "
        f"less its change out of it, both against the base model.", first="arm")


SOURCE = ("Chu et al. 2025, \"SFT Memorizes, RL Generalizes: A Comparative Study of "
          "Foundation Model Post-training\", arXiv:2501.17161v1, abstract")
CLAIMS = (
    common.Claim("RL, especially when trained with an outcome-based reward, generalizes "
                 "across both rule-based textual and visual variants. SFT, in contrast, tends "
                 "to memorize training data and struggles to generalize out-of-distribution "
                 "scenarios",
                 SOURCE + " (quoted); tested as GRPO's out-of-distribution pass@1 above SFT's "
                 "(both from one base: RL's gain out of the slice above SFT's)",
                 (GRPO, SFT, "pass@1_ood"), ">", margin=PASS_MARGIN,
                 can_fail="fails if GRPO on sums and differences does not raise products' "
                          "pass@1 more than SFT does, by the margin: e.g. when what GRPO "
                          "sharpens (the operator confusions of +/- steps) is specific to "
                          "those steps, or when SFT's clean traces carry over to products as "
                          "well"),
    common.Claim("RL, especially when trained with an outcome-based reward, generalizes "
                 "across both rule-based textual and visual variants", SOURCE +
                 " (quoted); tested as GRPO's out-of-distribution pass@1 above the base's",
                 (GRPO, BASE, "pass@1_ood"), ">", margin=PASS_MARGIN,
                 headroom=(BASE, "pass@1_ood", 1.0),
                 can_fail="fails unless GRPO's pass@1 on products lies above the base's by the "
                          "margin (Holm p < 0.05, no base the other way): when what GRPO "
                          "sharpens on sums and differences (choosing the written operator "
                          "over a confused one) does not reach the product steps, or moves the "
                          "shared trace layout against them; not testable when the base's "
                          "pass@1 on products leaves less than the margin below 1 (the "
                          "headroom, from the base arm)"),
    common.Claim("SFT, in contrast, tends to memorize training data and struggles to "
                 "generalize out-of-distribution scenarios", SOURCE + " (quoted); tested as "
                 "SFT's out-of-distribution pass@1 not above the base's by the margin or more",
                 (SFT, BASE, "pass@1_ood"), "<=", margin=PASS_MARGIN,
                 can_fail="fails if SFT's out-of-distribution gain over the base reaches the "
                          "margin (the 95% interval's lower end at or above it): clean "
                          "worked solutions of sums may teach the step layout and the format "
                          "that products share"),
    common.Claim("SFT, in contrast, tends to memorize training data and struggles to "
                 "generalize out-of-distribution scenarios", SOURCE + " (quoted); tested as "
                 "SFT's gain on the slice's held-out problems less its change out of the "
                 "slice, above zero",
                 (SFT, NO_GAP, "pass@1_gap"), ">", margin=PASS_MARGIN,
                 can_fail="fails if SFT's gain on the slice does not exceed its change on "
                          "products by the margin: when SFT raises neither (the base already "
                          "writes clean traces) or raises both alike (what it teaches is not "
                          "specific to + and -)"),
    common.Claim("SFT remains essential for effective RL training; SFT stabilizes the model's "
                 "output format, enabling subsequent RL to achieve its performance gains",
                 SOURCE + " (quoted)", None,
                 untestable="the base is pretrained on the task's own worked solutions, so "
                            "it already writes the output format RL is scored on: the "
                            "unstable format the paper's SFT fixes is absent here "
                            "(cold_start tests SFT before RL on this base)"),
)

STUDY = common.Study(
    name="generalization",
    question="post-trained on sums and differences only at the same budget from one base, "
             "does GRPO raise pass@1 on held-out products (an operator outside the slice) "
             "more than SFT on clean worked solutions does, and does SFT's gain stay on the "
             "slice, paired by seed?",
    tiers=tiers.standard(
        full="about 35 min on 2 cores, estimated, not yet run (12 runs: 6 of the main "
             "job's GRPO stage with two evaluations at about 2-2.5 min each, one_shot's "
             "61 min measured for 24 such runs; 6 SFT runs of as many sequences, estimated "
             "no longer, update_sparsity's 12 runs of both kinds in about 20 min; 18 "
             "out-of-distribution draws of 64 x 16 completions, about 20 s each with the "
             "loading, from sharpening's 35-57 s per 32,768 completions; plus the main "
             "bases, about 9 min each, when not built yet, shared with the other studies of "
             "the main base)",
        mini="about 30 s on 2 cores, measured (25 s for `run --tier=mini`, 37 s in the "
             "test beside other jobs): one toy base, one seed, both arms and the draws"),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
