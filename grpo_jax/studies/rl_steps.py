"""Prolonged RL: does held-out pass@1 keep rising with RL steps, and does pass@k at large k
(the reasoning boundary) move past the base's? (the lecture on RL for LLMs; ProRL, Liu et
al. 2025, arXiv:2505.24864).

One run per (base, seed): the main job's GRPO stage (accuracy + 0.2 x format reward, groups
of 8, its learning-rate schedule stretched over the run) at `FACTOR` times its steps, from
the main base (the main job's pretraining, `common.main_base`), with a checkpoint kept every
main-job step count (`rl.checkpoint_every` = the main job's `rl.steps`), so the run keeps
`FACTOR` checkpoints and the first of them is at the main job's step count.

After the runs, `measure` samples, for each (base, seed), the base model and every kept
checkpoint on the same held-out problems (fixed across seeds: task.eval_seed) with the same
key (a function of the seed, as pass_at_k's: `measure.sample_problems`), `_sizes` problems x
completions at temperature 1 with the main job's evaluation budget (`eval_final`), and
writes each checkpoint's per-problem counts to the run's `rl_steps.json` (the base model's
draws under `<study>/base_model/<base>,seed=<s>.json`); a measured checkpoint is not
sampled again. The checkpoints are read as length_growth reads its own (`measure.kept_rl_steps`,
`measure.params_at`).

The analysis's policies, paired by (base, seed): `base model` (the base's draw with the
seed's key), `main steps` (the run's checkpoint at the main job's step count), `last` (its
last checkpoint) and `base redraw` (the base's draw with the next seed's key, cyclic over
the tier's seeds as `measure.redraw_seed` (sharpening's): an independent second sample of the base,
the noise floor of what is measured against the base's draw). Per policy: pass@k (the
unbiased estimator of Chen et al. 2021) for k = 1, 2, 4, ... up to the samples drawn; the
share of problems it never solves; the share it solves and the base's draw with the same key
never does (`only_solves_rate`); format rate and length. Every kept checkpoint's figures are
in the table and the plot.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time

from grpo_jax import storage
from grpo_jax.stats import interval
from grpo_jax.studies import common, tiers
from grpo_jax.studies import measure as measure_lib

RUN = "prolonged"  # the one configured arm: the long GRPO run
BASE, MAIN, LAST, REDRAW = "base model", "main steps", "last", "base redraw"
POLICIES = (BASE, REDRAW, MAIN, LAST)
FACTOR = 5  # the run's steps, in main-job step counts
FILE = "rl_steps.json"
PASS_MARGIN = 0.02  # held-out pass@1, as pass_at_k's
BOUNDARY_MARGIN = 0.02  # pass@K and the solved-only share: sharpening's margin, its opposite
SHOWN_KS = (1, 4, 16)  # the table's and plot's k besides the largest


def _sizes(tier: str) -> dict:
    """Problems and completions per problem of the measurement (the mini tier draws as many
    completions, so its metrics have the full tier's names)."""
    if tier == "full":
        return {"problems": 128, "samples": 128, "batch_rows": 1024}
    return {"problems": 4, "samples": 128, "batch_rows": 512}


K = _sizes("full")["samples"]  # the largest k: every draw's completions per problem
KS = tuple(2 ** i for i in range(int(math.log2(K)) + 1))

base_config = common.main_base


def arm_config(tier: str = "full"):
    """The long run: the main job's RL stage alone from the base (model.init_from, set per
    base) at FACTOR x its steps, a checkpoint every main-job step count, all of them kept."""
    config = common.main_arm(tier, "rl")
    del config.eval_base, config.eval_final  # measured after training (`measure`)
    main_steps = int(config.rl.steps)
    config.rl.steps = FACTOR * main_steps
    config.rl.checkpoint_every = main_steps
    config.checkpoint.max_to_keep = FACTOR + 1
    return config


def arm_configs(tier: str) -> dict:
    return {RUN: arm_config(tier)}


# ---- the measurement --------------------------------------------------------------------------

def _load(path: str) -> dict:
    return json.loads(storage.read_text(path)) if storage.isfile(path) else {}


def measure(runs: common.StudyRuns) -> None:
    """The base model's draw with each seed's key, and for every finished run each kept
    checkpoint's draw with the run's seed's key, into the run's rl_steps.json (written after
    each checkpoint; a measured checkpoint is skipped, a complete file is not opened)."""
    sizes = _sizes(runs.tier)
    study = runs.study.name
    complete = lambda workdir: _load(storage.join(workdir, FILE)).get("complete")  # noqa: E731
    for key, base, todo, base_todo in measure_lib.pending(runs, complete, measure_lib.base_path):
        setup = measure_lib.held_out(base["workdir"], sizes["problems"])
        max_new = int(setup.run.config.eval_final.max_new_tokens)

        def draw(params, seed, setup=setup, max_new=max_new):
            return measure_lib.sample_problems(setup, params, samples=sizes["samples"],
                                               seed=seed, max_new_tokens=max_new,
                                               batch_rows=sizes["batch_rows"])

        storage.makedirs(storage.join(runs.root, "base_model"))
        for seed in base_todo:
            t0 = time.time()
            storage.write_text(measure_lib.base_path(runs, key, seed), json.dumps(
                {"model": base["workdir"], "seed": seed, "key": measure_lib.KEY,
                 "eval_seed": setup.eval_seed, "problems": draw(setup.run.params, seed)},
                indent=1))
            print(f"[studies] {study}: base model {key} seed={seed} sampled in "
                  f"{time.time() - t0:.0f}s", flush=True)
        for record in todo:
            path = storage.join(record.workdir, FILE)
            data = _load(path) or {
                "key": measure_lib.KEY, "seed": record.seed, "eval_seed": setup.eval_seed,
                "samples": sizes["samples"], "rl_steps": int(record.config.rl.steps),
                "main_steps": int(record.config.rl.checkpoint_every), "steps": {}}
            for step, checkpoint in sorted(measure_lib.kept_rl_steps(record.workdir).items()):
                if str(step) in data["steps"]:
                    continue
                t0 = time.time()
                params = measure_lib.params_at(record.workdir, checkpoint, setup.run.params)
                data["steps"][str(step)] = draw(params, record.seed)
                storage.write_text(path, json.dumps(data, indent=1))
                print(f"[studies] {study}: {key} seed={record.seed} step {step} sampled in "
                      f"{time.time() - t0:.0f}s", flush=True)
            data["complete"] = True
            storage.write_text(path, json.dumps(data, indent=1))


# ---- the analysis -----------------------------------------------------------------------------

def figures(problems: list[dict], reference: list[dict] | None, ks=KS) -> dict:
    """A policy's figures over the held-out problems (each {"samples", "correct",
    "formatted", "tokens"}): pass@k at each of `ks` not above its samples (mean over
    problems), the share of problems with no correct sample (`never_solved_rate`), format
    rate and mean length per completion; against `reference` (another draw of the same
    problems, in the same order), the share of problems this policy solves at least once and
    the reference never does (`only_solves_rate`)."""
    from grpo_jax.evals.metrics import pass_at_k

    n = len(problems)
    out = {f"pass@{k}": sum(pass_at_k(p["samples"], p["correct"], k) for p in problems) / n
           for k in ks if all(k <= p["samples"] for p in problems)}
    total = sum(p["samples"] for p in problems)
    out["never_solved_rate"] = sum(p["correct"] == 0 for p in problems) / n
    out["format_rate"] = sum(p["formatted"] for p in problems) / total
    out["mean_length"] = sum(p["tokens"] for p in problems) / total
    if reference is not None:
        out["only_solves_rate"] = sum(p["correct"] > 0 and q["correct"] == 0
                                      for p, q in zip(problems, reference)) / n
    return out


def analyze(runs: common.StudyRuns) -> common.Analysis:
    seeds = sorted({r.seed for r in runs.runs})
    rows = common.ArmRows()
    by_step: dict[int, list[dict]] = {}  # RL step (0: the base's draw) -> per-run figures
    for record in runs.arm(RUN):
        if not record.finished:
            continue
        data = _load(storage.join(record.workdir, FILE))
        reference = measure_lib.base_problems(runs, record.base, record.seed)
        redraw = (measure_lib.base_problems(runs, record.base,
                                            measure_lib.redraw_seed(record.seed, seeds))
                  if len(seeds) > 1 else None)
        steps = {int(k): v for k, v in data.get("steps", {}).items()}
        main = data.get("main_steps")
        if not data.get("complete") or reference is None or redraw is None \
                or main not in steps:
            continue
        own = {step: figures(problems, reference) for step, problems in steps.items()}
        own[0] = figures(reference, None)
        for step, values in own.items():
            by_step.setdefault(step, []).append(values)
        for name, values in ((BASE, own[0]), (REDRAW, figures(redraw, reference)),
                             (MAIN, own[main]), (LAST, own[max(steps)])):
            rows.add(name, record.base, record.seed, values)
    arms = rows.arms(POLICIES)
    sizes = _sizes(runs.tier)
    held_out = {str(step): {name: interval([v.get(name) for v in values])
                            for name in (*(f"pass@{k}" for k in KS), "never_solved_rate",
                                         "only_solves_rate", "format_rate", "mean_length")}
                for step, values in sorted(by_step.items())}
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, by_step),
        extra={"sampling_key": measure_lib.KEY, "factor": FACTOR,
               "held_out_by_step": held_out},
        protocol={"problems": sizes["problems"], "samples_per_problem": sizes["samples"],
                  "notes": (f"measured after training: each (base, seed) samples the base "
                            f"model and every kept checkpoint of its run with one key "
                            f"({measure_lib.KEY} folded with the seed), {sizes['samples']} "
                            "completions per problem at temperature 1; the base redraw is "
                            "the base's draw with the next seed's key")},
        plots=lambda out: plot(by_step, out))


def _cell(values, scale=100.0, digits=1) -> str:
    values = [v for v in values if v is not None]
    return common.cell(values, scale, digits) if values else "-"


COLUMNS = (*((f"pass@{k}", f"pass@{k}") for k in (*SHOWN_KS, K)),
           ("never solved", "never_solved_rate"),
           ("solved, the base's draw never", "only_solves_rate"))


def table(arms: dict, by_step: dict) -> str:
    """Held-out figures of the base's draw and of every kept checkpoint (RL step), and of the
    base's redraw: % over (base, seed), mean ± 95% half-width."""
    if not by_step:
        return ""
    lines = ["| policy (RL step) | runs | " + " | ".join(c for c, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]

    def row(label, rows):
        cells = [_cell([r.get(metric) for r in rows]) for _, metric in COLUMNS]
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(cells) + " |")

    for step in sorted(by_step):
        row("base model (0)" if step == 0 else f"checkpoint ({step})", by_step[step])
    if REDRAW in arms:
        metrics = arms[REDRAW]["metrics"]
        n = len(arms[REDRAW]["seeds"])
        row("base redraw (0)", [{m: metrics.get(m, [None] * n)[i] for _, m in COLUMNS}
                                for i in range(n)])
    lines += ["", (f"Held-out pass@k (%) from {K} completions per problem at temperature 1 "
                   "(the unbiased estimator); never solved: problems without a correct "
                   "completion; the last column: problems the policy solves and the base's "
                   "draw with the same key never does. The base redraw is the base sampled "
                   "with another seed's key: the noise floor of that column.")]
    return "\n".join(lines) + "\n"


def plot(by_step: dict, out: str) -> None:
    """rl_steps.png: held-out pass@k against the RL step (k in SHOWN_KS and K, 95% bands
    over (base, seed)), and pass@k against k for the base and every checkpoint."""
    if not by_step:
        return
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = sorted(by_step)
    ax = axes[0]
    for i, k in enumerate((*SHOWN_KS, K)):
        stats = [interval([r.get(f"pass@{k}") for r in by_step[s]]) for s in steps]
        common.interval_line(ax, steps, stats, color=f"C{i}", label=f"pass@{k}")
    ax.set_xlabel("RL step (0: the base)")
    ax.set_ylabel("held-out pass@k (%)")
    ax.set_title("along the run, mean and 95% over (base, seed)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    cmap = plt.get_cmap("viridis")
    for i, step in enumerate(steps):
        mean = [interval([r.get(f"pass@{k}") for r in by_step[step]])["mean"] * 100
                for k in KS]
        ax.plot(KS, mean, marker="o", ms=3, color=cmap(i / max(1, len(steps) - 1)),
                label="base" if step == 0 else f"step {step}")
    common.k_axis(ax, KS)
    ax.set_ylabel("held-out pass@k (%)")
    ax.set_title("pass@k against k, per checkpoint", fontsize=9)
    ax.legend(fontsize=7)
    common.save_figure(fig, out, "rl_steps.png")


# ---- claims -----------------------------------------------------------------------------------

SPECS = [(MAIN, BASE, "pass@1"), (LAST, MAIN, "pass@1"), (LAST, BASE, f"pass@{K}"),
         (LAST, MAIN, f"pass@{K}"), (LAST, REDRAW, "only_solves_rate")]

LECTURE = "the lecture on RL for LLMs (a seed document; close paraphrase)"
PRORL = ("Liu et al. 2025, \"ProRL: Prolonged Reinforcement Learning Expands Reasoning "
         "Boundaries in Large Language Models\", arXiv:2505.24864, abstract")

def _claim(why: str, **fields) -> common.Claim:
    """A claim whose can_fail says how its test could fail here (`why`), then the rule's own
    statement."""
    claim = common.Claim(**fields)
    return dataclasses.replace(claim, can_fail=f"{why}; {claim.failure()}")


CEILING = ("not testable here when {what} (the headroom, from {whose} draw, before the "
           "verdict)")

CLAIMS = (
    _claim(
        "it can fail if the run's first stretch, under the schedule stretched over the long "
        "run (a longer warmup, the learning rate not yet decayed), does not gain on the base "
        "what the main job's run gains",
        text="performance keeps improving with RL steps",
        source=LECTURE + "; tested on the first stretch: held-out pass@1 of the run's "
               "checkpoint at the main job's step count against the base",
        test=(MAIN, BASE, "pass@1"), expect=">", margin=PASS_MARGIN),
    _claim(
        "it fails if held-out pass@1 levels off (or falls) after the main job's step count: "
        "the KL penalty to the base and the learning rate's cosine decay slow the later "
        "steps, and a policy that has moved its mass onto the answers the base can reach "
        "has little left to gain on problems of the training distribution",
        text="performance keeps improving with RL steps",
        source=LECTURE + "; tested on the prolonged stretch: held-out pass@1 of the run's "
               "last checkpoint against its checkpoint at the main job's step count",
        test=(LAST, MAIN, "pass@1"), expect=">", margin=PASS_MARGIN),
    _claim(
        CEILING.format(what=f"the base's pass@{K} lies within the margin of 1",
                       whose="the base's")
        + "; otherwise it fails if RL only sharpens: mass moved onto answers the base "
        f"already samples raises pass@1 and leaves pass@{K}, which the base's many samples "
        "already reach, where it was",
        text="RL-trained models consistently outperform base models across a wide range of "
             "pass@k evaluations",
        source=PRORL + f" (quoted); tested at the largest k measured (pass@{K}): the last "
               "checkpoint against the base",
        test=(LAST, BASE, f"pass@{K}"), expect=">", margin=BOUNDARY_MARGIN,
        headroom=(BASE, f"pass@{K}", 1.0)),
    _claim(
        CEILING.format(what="the base's draw leaves fewer problems unsolved than the margin",
                       whose="the base's")
        + "; otherwise it fails unless the last checkpoint solves more of them than a second "
        "draw of the base does by chance (a problem the base solves rarely is solved by one "
        "draw and missed by the other)",
        text="including scenarios where base models fail entirely regardless of the number "
             "of attempts",
        source=PRORL + f" (quoted, the same sentence); tested as the problems the last "
               f"checkpoint solves in {K} samples and the base's draw never does, against "
               "the same share for a second draw of the base (the noise floor)",
        test=(LAST, REDRAW, "only_solves_rate"), expect=">", margin=BOUNDARY_MARGIN,
        headroom=(BASE, "never_solved_rate", 0.0)),
    _claim(
        CEILING.format(what=f"the pass@{K} of the checkpoint at the main job's step count "
                            "lies within the margin of 1", whose="that checkpoint's")
        + "; otherwise it fails if the boundary stops moving after the main job's step "
        "count, or shrinks as the policy's entropy falls (a sharper policy samples fewer "
        "distinct answers)",
        text="reasoning boundary improvements correlates strongly with task competence of "
             "base model and training duration",
        source=PRORL + f" (quoted); tested on training duration alone: pass@{K} of the "
               "last checkpoint against the checkpoint at the main job's step count",
        test=(LAST, MAIN, f"pass@{K}"), expect=">", margin=BOUNDARY_MARGIN,
        headroom=(MAIN, f"pass@{K}", 1.0)),
    common.Claim(
        text="prolonged RL (ProRL) training can uncover novel reasoning strategies that are "
             "inaccessible to base models, even under extensive sampling",
        source=PRORL + " (quoted)",
        test=None,
        untestable="the arithmetic task has one way to solve a problem (its worked "
                   "solution's steps, which the base was pretrained on): a new strategy "
                   "cannot be told from the old one at a new problem; the problem-level "
                   "counterpart (problems the base never solves) is the claim above"),
)


STUDY = common.Study(
    name="rl_steps",
    question="does held-out pass@1 keep rising through a GRPO run five times the main job's "
             "length, and does pass@k at large k (the boundary) move past the base's, on "
             "problems the base never solves too? Checkpoints of one run per (base, seed), "
             "paired with the base's draw",
    tiers=tiers.standard(
        full="about 2 h 20 min on 2 cores, estimated: 8 runs of 400 GRPO steps at about "
             "15 min each (the main job's 80-step GRPO stage takes about 3 min, "
             "ppo_vs_grpo's measured runs), and 48 samplings of 128 x 128 completions "
             "(5 checkpoints per run and the base's draw per (base, seed)) at about "
             "20-30 s each (half of sharpening's measured 35-57 s for 128 x 256); plus "
             "the shared main bases when not built yet",
        mini="about 20-50 s on 2 cores, measured (13 s of CPU, 35 s wall under a load of 8: "
             "one toy base, two seeds (the redraw needs two), 10 toy RL steps each with 5 "
             "checkpoints, 12 samplings of 4 x 128)",
        mini_seeds=(0, 1), full_sized=True),
    arms=(RUN,), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
