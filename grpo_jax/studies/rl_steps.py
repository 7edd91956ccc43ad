"""Prolonged RL: does held-out pass@1 keep rising with RL steps, and does pass@k at large k
(the reasoning boundary) move past the base's? (the lecture on RL for LLMs; ProRL, Liu et
al. 2025, arXiv:2505.24864). Asked on two task families (`TASKS`): arithmetic (the main job)
and reasoning-gym's `spell_backward` (`families.SECOND`: a word of 3-5 letters spelled
backward), whose base is far from its coverage ceiling (docs/reasoning_gym.md's Results), so
that a result can be told from a property of the arithmetic task.

One run per (base, seed) and family, each from its family's base (`families.with_family`: the
base set of the main base, role "base", and the family's base, role "spell_backward:base";
`families.attach` sends each arm to its role):

  prolonged                  the main job's GRPO stage (accuracy + 0.2 x format reward,
                             groups of 8) at `FACTOR` times its steps, from the main base
                             (the main job's pretraining, `common.main_base`)
  spell_backward: prolonged  the preset's GRPO stage (configs/reasoning_gym_tasks.py: the
                             dataset's partial-credit scorer as the accuracy reward + 0.2 x
                             format, host rewards) at `FACTOR` times its steps, from the
                             family's base (the preset's pretraining, shared with every study
                             that runs the family)

Each run's learning-rate schedule (a warmup fraction, then a cosine decay) is stretched over
the whole run, and a checkpoint is kept every job step count (`rl.checkpoint_every` = the
job's `rl.steps`), so each run keeps `FACTOR` checkpoints and the first of them is at its
job's step count. The mini tier runs arithmetic only (its base set is the main base alone);
the family's path is covered by tests/test_rl_steps_study.py without training.

After the runs, `measure` samples, for each (base, seed) and family, the family's base model
and every kept checkpoint of the family's run on the family's held-out problems (fixed across
seeds: task.eval_seed) with the same key (a function of the seed, as pass_at_k's:
`measure.sample_problems`), `_sizes` problems x completions at temperature 1 with the
family's evaluation budget (the base's `eval_final.max_new_tokens`), and writes each
checkpoint's per-problem counts to the run's `rl_steps.json` (the base model's draws under
`<study>/base_model/<base>,seed=<s>.json` for arithmetic and
`<study>/base_model/spell_backward/<base>,seed=<s>.json` for the family: `_base_file`); a
measured checkpoint is not sampled again. A completion counts as correct when the task's
accuracy reward is 1 (`metrics.solved`: for spell_backward, every letter in place). The
checkpoints are read as length_growth reads its own (`measure.kept_rl_steps`,
`measure.params_at`).

The analysis's policies, paired by (base, seed) within a family (the family's are named
"spell_backward: <policy>"): `base model` (the base's draw with the seed's key), `main steps`
(the run's checkpoint at its job's step count), `last` (its last checkpoint) and `base
redraw` (the base's draw with the next seed's key, cyclic over the tier's seeds as
`measure.redraw_seed` (sharpening's): an independent second sample of the base, the noise
floor of what is measured against the base's draw). Per policy: pass@k (the unbiased
estimator of Chen et al. 2021) for k = 1, 2, 4, ... up to the samples drawn; the share of
problems it never solves; the share it solves and the base's draw with the same key never
does (`only_solves_rate`); format rate and length. Every kept checkpoint's figures are in the
table and the plot, a section per family.

Claims: each arithmetic claim with a test has a twin on spell_backward (`_twin`: the same
text and margin, the source with "; rerun on reasoning-gym's spell_backward", the test on the
family's policies, its own can-fail statement); the contrasts stay within a family and the
Holm family holds both families' contrasts. The claim of novel reasoning strategies is not
tested on arithmetic and has no twin: a spell_backward problem has one way to be solved too
(the word's letters from last to first, the worked solution the base was pretrained on), so a
new strategy cannot be told from the old one there either.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time

from grpo_jax import storage
from grpo_jax.stats import interval
from grpo_jax.studies import common, families, tiers
from grpo_jax.studies import measure as measure_lib

RUN = "prolonged"  # the configured arm of each family: the long GRPO run
BASE, MAIN, LAST, REDRAW = "base model", "main steps", "last", "base redraw"
POLICIES = (BASE, REDRAW, MAIN, LAST)
MAIN_TASK = "arithmetic"  # the main job's task: its arms and policies are named bare
FAMILY = families.SECOND
TASKS = (MAIN_TASK, FAMILY)
FACTOR = 5  # the run's steps, in its job's step counts
FILE = "rl_steps.json"
PASS_MARGIN = 0.02  # held-out pass@1, as pass_at_k's
BOUNDARY_MARGIN = 0.02  # pass@K and the solved-only share: sharpening's margin, its opposite
SHOWN_KS = (1, 4, 16)  # the table's and plot's k besides the largest


def name(task: str, policy: str) -> str:
    """An arm or policy of a task family: bare on arithmetic, "<family>: <name>" else."""
    return policy if task == MAIN_TASK else families.arm_name(task, policy)


FAMILY_RUN = name(FAMILY, RUN)


def _role(task: str) -> str:
    """The task's role in the base set."""
    return families.MAIN_ROLE if task == MAIN_TASK else families.role(task)


def _sizes(tier: str) -> dict:
    """Problems and completions per problem of the measurement (the mini tier draws as many
    completions, so its metrics have the full tier's names); the same for both families."""
    if tier == "full":
        return {"problems": 128, "samples": 128, "batch_rows": 1024}
    return {"problems": 4, "samples": 128, "batch_rows": 512}


K = _sizes("full")["samples"]  # the largest k: every draw's completions per problem
KS = tuple(2 ** i for i in range(int(math.log2(K)) + 1))


def base_config(tier: str):
    """The full tier: the base set of the main base and the family's base
    (`families.with_family`); the mini tier: the main base alone (its arms are arithmetic's)."""
    main = common.main_base(tier)
    return families.with_family(main, tier, FAMILY) if tier == "full" else main


def arm_config(tier: str = "full", task: str = MAIN_TASK):
    """The long run on `task`: its job's RL stage alone from the task's base (model.init_from,
    set per base; the family's: its role until `attach`) at FACTOR x its steps, a checkpoint
    every job step count, all of them kept."""
    if task == MAIN_TASK:
        config = common.main_arm(tier, "rl")
    else:
        config = families.grpo(tier, task, stages="rl")
    del config.eval_base, config.eval_final  # measured after training (`measure`)
    main_steps = int(config.rl.steps)
    config.rl.steps = FACTOR * main_steps
    config.rl.checkpoint_every = main_steps
    config.checkpoint.max_to_keep = FACTOR + 1
    return config


def arm_configs(tier: str) -> dict:
    return {name(task, RUN): arm_config(tier, task) for task in TASKS}


# ---- the measurement --------------------------------------------------------------------------

def _load(path: str) -> dict:
    return json.loads(storage.read_text(path)) if storage.isfile(path) else {}


def _base_dir(runs: common.StudyRuns, task: str) -> str:
    """The folder of the task's base model's draws: arithmetic's `measure.base_path`'s, a
    family's a folder of its own in it."""
    folder = storage.join(runs.root, "base_model")
    return folder if task == MAIN_TASK else storage.join(folder, task)


def _base_file(runs: common.StudyRuns, key: str, seed: int, task: str = MAIN_TASK) -> str:
    """Where the study keeps the task's base model's draw with `seed`'s key (arithmetic's:
    `measure.base_path`)."""
    return storage.join(_base_dir(runs, task), f"{key},seed={seed}.json")


def _base_problems(runs: common.StudyRuns, key: str, seed: int, task: str) -> list | None:
    return measure_lib.load_problems(_base_file(runs, key, seed, task))


def _base_model(base: dict, task: str) -> str:
    """The directory of the task's base model in a base (set)."""
    roles = base.get("roles") or {families.MAIN_ROLE: base["workdir"]}
    return roles[_role(task)]


def measure(runs: common.StudyRuns) -> None:
    """Per family with runs: the family's base model's draw with each seed's key, and for
    every finished run each kept checkpoint's draw with the run's seed's key, on the family's
    held-out problems with its evaluation budget, into the run's rl_steps.json (written after
    each checkpoint; a measured checkpoint is skipped, a complete file is not opened)."""
    sizes = _sizes(runs.tier)
    study = runs.study.name
    complete = lambda workdir: _load(storage.join(workdir, FILE)).get("complete")
    for task in TASKS:
        records = runs.arm(name(task, RUN))
        if not records:
            continue
        base_file = functools.partial(_base_file, task=task)
        label = "" if task == MAIN_TASK else f"{task} "
        view = dataclasses.replace(runs, runs=records)
        for key, base, todo, base_todo in measure_lib.pending(view, complete, base_file):
            model = _base_model(base, task)
            setup = measure_lib.held_out(model, sizes["problems"])
            max_new = int(setup.run.config.eval_final.max_new_tokens)

            def draw(params, seed, setup=setup, max_new=max_new):
                return measure_lib.sample_problems(setup, params, samples=sizes["samples"],
                                                   seed=seed, max_new_tokens=max_new,
                                                   batch_rows=sizes["batch_rows"])

            for seed in base_todo:
                t0 = time.time()
                storage.makedirs(_base_dir(runs, task))
                storage.write_text(base_file(runs, key, seed), json.dumps(
                    {"model": model, "task": task, "seed": seed, "key": measure_lib.KEY,
                     "eval_seed": setup.eval_seed, "problems": draw(setup.run.params, seed)},
                    indent=1))
                print(f"[studies] {study}: {label}base model {key} seed={seed} sampled in "
                      f"{time.time() - t0:.0f}s", flush=True)
            for record in todo:
                path = storage.join(record.workdir, FILE)
                data = _load(path) or {
                    "task": task, "key": measure_lib.KEY, "seed": record.seed,
                    "eval_seed": setup.eval_seed, "samples": sizes["samples"],
                    "rl_steps": int(record.config.rl.steps),
                    "main_steps": int(record.config.rl.checkpoint_every), "steps": {}}
                for step, checkpoint in sorted(measure_lib.kept_rl_steps(record.workdir).items()):
                    if str(step) in data["steps"]:
                        continue
                    t0 = time.time()
                    params = measure_lib.params_at(record.workdir, checkpoint, setup.run.params)
                    data["steps"][str(step)] = draw(params, record.seed)
                    storage.write_text(path, json.dumps(data, indent=1))
                    print(f"[studies] {study}: {label}{key} seed={record.seed} step {step} "
                          f"sampled in {time.time() - t0:.0f}s", flush=True)
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


def _task_rows(runs: common.StudyRuns, task: str, rows: common.ArmRows,
               seeds: list[int]) -> dict[int, list[dict]]:
    """The task's policies added to `rows`, paired by (base, seed); returns RL step (0: the
    base's draw) -> per-run figures."""
    by_step: dict[int, list[dict]] = {}
    for record in runs.arm(name(task, RUN)):
        if not record.finished:
            continue
        data = _load(storage.join(record.workdir, FILE))
        reference = _base_problems(runs, record.base, record.seed, task)
        redraw = (_base_problems(runs, record.base,
                                 measure_lib.redraw_seed(record.seed, seeds), task)
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
        for policy, values in ((BASE, own[0]), (REDRAW, figures(redraw, reference)),
                               (MAIN, own[main]), (LAST, own[max(steps)])):
            rows.add(name(task, policy), record.base, record.seed, values)
    return by_step


HELD_OUT = (*(f"pass@{k}" for k in KS), "never_solved_rate", "only_solves_rate",
            "format_rate", "mean_length")


def analyze(runs: common.StudyRuns) -> common.Analysis:
    seeds = sorted({r.seed for r in runs.runs})
    rows = common.ArmRows()
    by_task = {task: _task_rows(runs, task, rows, seeds) for task in TASKS}
    by_task = {task: by_step for task, by_step in by_task.items() if by_step}
    arms = rows.arms([name(task, p) for task in TASKS for p in POLICIES])
    sizes = _sizes(runs.tier)
    held_out = {task: {str(step): {m: interval([v.get(m) for v in values]) for m in HELD_OUT}
                       for step, values in sorted(by_step.items())}
                for task, by_step in by_task.items()}
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, by_task),
        extra={"sampling_key": measure_lib.KEY, "factor": FACTOR,
               "held_out_by_step": held_out},
        protocol={"problems": sizes["problems"], "samples_per_problem": sizes["samples"],
                  "notes": (f"measured after training, per task family "
                            f"({', '.join(by_task) or 'none measured'}) on its own held-out "
                            f"problems: each (base, seed) samples the family's base model "
                            f"and every kept checkpoint of its run with one key "
                            f"({measure_lib.KEY} folded with the seed), {sizes['samples']} "
                            "completions per problem at temperature 1; the base redraw is "
                            "the base's draw with the next seed's key")},
        plots=lambda out: plot(by_task, out))


def _cell(values, scale=100.0, digits=1) -> str:
    values = [v for v in values if v is not None]
    return common.cell(values, scale, digits) if values else "-"


COLUMNS = (*((f"pass@{k}", f"pass@{k}") for k in (*SHOWN_KS, K)),
           ("never solved", "never_solved_rate"),
           ("solved, the base's draw never", "only_solves_rate"))


def _task_table(arms: dict, task: str, by_step: dict) -> list[str]:
    lines = ["| policy (RL step) | runs | " + " | ".join(c for c, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]

    def row(label, rows):
        cells = [_cell([r.get(metric) for r in rows]) for _, metric in COLUMNS]
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(cells) + " |")

    for step in sorted(by_step):
        row("base model (0)" if step == 0 else f"checkpoint ({step})", by_step[step])
    redraw = name(task, REDRAW)
    if redraw in arms:
        metrics = arms[redraw]["metrics"]
        n = len(arms[redraw]["seeds"])
        row("base redraw (0)", [{m: metrics.get(m, [None] * n)[i] for _, m in COLUMNS}
                                for i in range(n)])
    return lines


def table(arms: dict, by_task: dict) -> str:
    """Per task family, held-out figures of the base's draw and of every kept checkpoint (RL
    step), and of the base's redraw: % over (base, seed), mean ± 95% half-width."""
    if not by_task:
        return ""
    lines = []
    for task, by_step in by_task.items():
        what = "the main job" if task == MAIN_TASK else "reasoning-gym"
        lines += [f"**{task}** ({what}), on its own held-out problems:", ""]
        lines += _task_table(arms, task, by_step) + [""]
    lines += [(f"Held-out pass@k (%) from {K} completions per problem at temperature 1 "
               "(the unbiased estimator; a completion is correct when the task's accuracy "
               "reward is 1); never solved: problems without a correct completion; the last "
               "column: problems the policy solves and the base's draw with the same key "
               "never does. The base redraw is the base sampled with another seed's key: the "
               "noise floor of that column.")]
    return "\n".join(lines) + "\n"


def plot(by_task: dict, out: str) -> None:
    """rl_steps.png, a row per task family: held-out pass@k against the RL step (k in
    SHOWN_KS and K, 95% bands over (base, seed)), and pass@k against k for the base and
    every checkpoint."""
    if not by_task:
        return
    plt = common.pyplot()
    fig, axes = plt.subplots(len(by_task), 2, figsize=(11, 4 * len(by_task)), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for (task, by_step), (left, right) in zip(by_task.items(), axes):
        steps = sorted(by_step)
        for i, k in enumerate((*SHOWN_KS, K)):
            stats = [interval([r.get(f"pass@{k}") for r in by_step[s]]) for s in steps]
            common.interval_line(left, steps, stats, color=f"C{i}", label=f"pass@{k}")
        left.set_xlabel("RL step (0: the base)")
        left.set_ylabel("held-out pass@k (%)")
        left.set_title(f"{task}: along the run, mean and 95% over (base, seed)", fontsize=9)
        left.legend(fontsize=7)
        for i, step in enumerate(steps):
            mean = [interval([r.get(f"pass@{k}") for r in by_step[step]])["mean"] * 100
                    for k in KS]
            right.plot(KS, mean, marker="o", ms=3, color=cmap(i / max(1, len(steps) - 1)),
                       label="base" if step == 0 else f"step {step}")
        common.k_axis(right, KS)
        right.set_ylabel("held-out pass@k (%)")
        right.set_title(f"{task}: pass@k against k, per checkpoint", fontsize=9)
        right.legend(fontsize=7)
    common.save_figure(fig, out, "rl_steps.png")


# ---- claims -----------------------------------------------------------------------------------

def _specs(task: str) -> list[tuple[str, str, str]]:
    n = functools.partial(name, task)
    return [(n(MAIN), n(BASE), "pass@1"), (n(LAST), n(MAIN), "pass@1"),
            (n(LAST), n(BASE), f"pass@{K}"), (n(LAST), n(MAIN), f"pass@{K}"),
            (n(LAST), n(REDRAW), "only_solves_rate")]


SPECS = [spec for task in TASKS for spec in _specs(task)]

LECTURE = "the lecture on RL for LLMs (a seed document; close paraphrase)"
PRORL = ("Liu et al. 2025, \"ProRL: Prolonged Reinforcement Learning Expands Reasoning "
         "Boundaries in Large Language Models\", arXiv:2505.24864, abstract")


def _claim(why: str, **fields) -> common.Claim:
    """A claim whose can_fail says how its test could fail here (`why`), then the rule's own
    statement."""
    return common.Claim(**fields, why=why)


CEILING = ("not testable here when {what} (the headroom, from {whose} draw, before the "
           "verdict)")

ARITHMETIC_CLAIMS = (
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

# Why each arithmetic claim's test could fail on the family (keyed by its test), before the
# runs. The family's figures: docs/reasoning_gym.md's Results (the preset, seed 0, its own
# unstretched 40-step schedule): pass@1 0.10 -> 0.84, pass@8 0.55 -> 0.99.
FAMILY_WHY = {
    (MAIN, BASE, "pass@1"):
        "on spell_backward the preset's own 40-step run lifts pass@1 from about 0.10 to 0.84 "
        "(docs/reasoning_gym.md), so the first stretch has room; it can fail if that stretch, "
        "under the schedule stretched over the long run (a warmup of several times as many "
        "steps, the learning rate not yet decayed), gains less, or if the partial-credit "
        "reward (the share of letters in place) is raised by more letters in place in words "
        "still wrong as a whole, which pass@1 (every letter in place) does not count",
    (LAST, MAIN, "pass@1"):
        "it fails if pass@1 levels off after the preset's step count: there the preset's own "
        "run already has most words right (pass@1 0.84 in docs/reasoning_gym.md), a group "
        "of 8 completions that all score 1 carries no advantage, the partial-credit reward "
        "of the rest is near its top (mean 0.95 there), and the KL penalty to the base and "
        "the decaying learning rate slow the late steps",
    (LAST, BASE, f"pass@{K}"):
        f"the family's base is far from its ceiling at small k (pass@8 0.55 in "
        f"docs/reasoning_gym.md), but a completion is a few letters and the base samples "
        f"them at temperature 1, so {K} draws may spell most words by chance and leave the "
        f"base's pass@{K} near 1: then it is not testable here (the headroom, from the "
        f"base's draw, before the verdict); otherwise it fails if RL only sharpens, moving "
        f"mass onto spellings the base already samples and leaving pass@{K} where it was",
    (LAST, REDRAW, "only_solves_rate"):
        f"not testable here when the family's base, in {K} draws of a few letters each, "
        "leaves fewer words unsolved than the margin (the headroom, from the base's draw, "
        "before the verdict); otherwise it fails unless the last checkpoint spells more of "
        "the words the base's draw never does than a second draw of the base does by "
        "chance (a word with a letter the base rarely places right is spelled by one draw "
        "and missed by the other)",
    (LAST, MAIN, f"pass@{K}"):
        f"the preset's own 40-step run reaches pass@8 0.99 (docs/reasoning_gym.md), so the "
        f"checkpoint at the preset's step count may already be at the ceiling at k = {K}: "
        f"then it is not testable here (the headroom, from that checkpoint's draw, before "
        f"the verdict); otherwise it fails if the boundary stops moving after that step "
        f"count, or shrinks where the sharpened policy settles on a wrong spelling of a word "
        f"and stops sampling the right one",
}


def _twin(claim: common.Claim, task: str = FAMILY) -> common.Claim:
    """An arithmetic claim rerun on the family: the same text, expectation and margin, the
    source with the family said, the test and headroom on the family's policies and its own
    can-fail statement (`FAMILY_WHY`)."""
    a, b, metric = claim.test
    headroom = (None if claim.headroom is None
                else (name(task, claim.headroom[0]), *claim.headroom[1:]))
    return dataclasses.replace(
        claim, test=(name(task, a), name(task, b), metric), headroom=headroom, can_fail="",
        why=FAMILY_WHY[claim.test], source=f"{claim.source}; rerun on reasoning-gym's {task}")


CLAIMS = (*ARITHMETIC_CLAIMS,
          *(_twin(claim) for claim in ARITHMETIC_CLAIMS if claim.test is not None))


STUDY = common.Study(
    name="rl_steps",
    question="does held-out pass@1 keep rising through a GRPO run five times its job's "
             "length, and does pass@k at large k (the boundary) move past the base's, on "
             "problems the base never solves too? On arithmetic and on reasoning-gym's "
             "spell_backward (a base far from its coverage ceiling), checkpoints of one run "
             "per (base, seed) and family, paired with the family's base's draw",
    tiers=tiers.standard(
        full="about 3 h 15 min to 3 h 50 min on 2 cores, estimated: arithmetic, 8 runs of "
             "400 GRPO steps at about 15 min each (the main job's 80-step GRPO stage takes "
             "about 3 min, ppo_vs_grpo's measured runs) and 48 samplings of 128 x 128 "
             "completions (5 checkpoints per run and the base's draw per (base, seed)) at "
             "about 20-30 s each (half of sharpening's measured 35-57 s for 128 x 256): "
             "about 2 h 20 min; spell_backward, 8 runs of 200 GRPO steps at about 5-8 min "
             "each (the preset's 40-step GRPO run takes about 1-1.5 min, docs/"
             "reasoning_gym.md) and 48 samplings of 128 x 128 completions of at most 32 "
             "tokens at about 20-30 s each: about 1-1.5 h; plus the shared main bases and "
             "the 4 spell_backward bases when not built yet (the preset's 800 pretraining "
             "steps, measured at 158-938 s in docs/reasoning_gym.md: 10-60 min; shared with "
             "the other studies that run the family)",
        mini="about 20-50 s on 2 cores, measured (13 s of CPU, 35 s wall under a load of 8: "
             "one toy base, two seeds (the redraw needs two), 10 toy RL steps each with 5 "
             "checkpoints, 12 samplings of 4 x 128); arithmetic only",
        mini_seeds=(0, 1), mini_arms=(RUN,), full_sized=True),
    arms=(RUN, FAMILY_RUN), base_config=base_config, arm_configs=arm_configs,
    analyze=analyze, measure=measure, attach=families.attach, claims=CLAIMS,
)
