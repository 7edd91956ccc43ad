"""Response-length growth over RL (DeepSeek-R1, arXiv:2501.12948, sec. 2.2.4, Fig. 3), where a
longer trace pays by construction and where it does not.

Two arms, the same GRPO run (length_bias's `grpo` arm: 120 steps of 16 prompts x 8, rl.beta
0, completions of at most 48 tokens, every 20th step's parameters kept) from two bases that
differ only in their pretraining traces:

  redo_rate=0.3  the base pretrained on traces in which each step is redone with
                 probability 0.3 (a redone step is always right, so a longer trace is more
                 often right): length_bias's base and its `grpo` arm, the same configs
  redo_rate=0    the main job's base (no redos: every trace of a problem has the same
                 steps, so nothing longer pays): the control

The growth in the first arm is built in: the base already redoes about a third of its steps
and a redo makes a trace more often right. What the study can show is whether GRPO
amplifies a length-for-accuracy behaviour the base has (against the control, where there is
none), and whether the length keeps growing through training as in R1-Zero's curve; not
whether such a behaviour emerges from RL.

After the runs, `measure` samples every kept checkpoint (step 0 = the base, 20, 40, ...,
120) on the 128 held-out problems (task.eval_seed) x 8 at temperature 1, with one fixed key
for every policy (the same samples' randomness along training, across arms and seeds), and
writes each run's figures per checkpoint to its `growth.json` (a run with one is not
measured again; a base's figures go to `<study>/growth/<base>.json`).
"""

from __future__ import annotations

import json
import math
import os

from grpo_jax import storage, sweep
from grpo_jax.stats import interval
from grpo_jax.studies import common, tiers
from grpo_jax.studies import measure as measure_lib
from grpo_jax.studies.arms import per_arm
from grpo_jax.studies.length_bias import arm_config as length_bias_arm
from grpo_jax.studies.length_bias import base_config as length_bias_base

REDO = "redo_rate=0.3"
CONTROL = "redo_rate=0"
ARMS = (REDO, CONTROL)
BEFORE = "before RL"  # pseudo-arm suffix: the base, measured
HALFWAY = "halfway"  # pseudo-arm suffix: the checkpoint at half the RL steps
KEY = 20250  # the sampling key of every measured policy
WEIGHTS = {"accuracy": 1.0, "format": 0.2}  # the arms' rl.rewards
MARGIN = 1.5  # tokens: length_bias's LENGTH_MARGIN (see the README)
FIGURES = ("length", "length_correct", "length_incorrect", "redo_rate", "with_redo", "pass@1",
           "pass@1_2op", "length_2op", "redo_rate_2op", "pass@1_redo_2op",
           "pass@1_no_redo_2op")


def label(arm: str, when: str) -> str:
    return f"{arm}, {when}"


# ---- configs ------------------------------------------------------------------------------

def _plain_base(tier: str):
    """The main job's pretraining, without redos (the base off_policy, cold_start and
    kl_beta start from: one shared run)."""
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain"
    return config


def base_config(tier: str) -> dict:
    """The redo base (length_bias's) and the plain one, built per base seed."""
    return {"redo": length_bias_base(tier), "plain": _plain_base(tier)}


def arm_configs(tier: str) -> dict:
    return {REDO: length_bias_arm(tier, "grpo"),
            CONTROL: length_bias_arm(tier, "grpo", redo_rate=0.0)}


def attach(config, base: dict) -> None:
    """Each arm starts from the base pretrained with its task's redo rate."""
    roles = base["roles"]
    config.model.init_from = roles["redo" if config.task.kwargs.redo_rate > 0 else "plain"]


# ---- the held-out measurement along training ---------------------------------------------

def _setup(base: str, config) -> dict:
    """The base (a finished run) and the held-out problems of `config` (the arm's:
    eval_size, eval_seed, samples and completion budget of its eval_final), each repeated
    for its samples."""
    held_out = measure_lib.held_out(base, config=config)
    samples = int(config.eval_final.num_samples)
    return {"run": held_out.run, "base_params": held_out.run.params,
            "rows": [ex for ex in held_out.examples for _ in range(samples)],
            "samples": samples, "problems": len(held_out.examples),
            "eval_seed": held_out.eval_seed,
            "max_new_tokens": int(config.eval_final.max_new_tokens)}


def _measure_policy(s: dict, params) -> dict:
    """Samples `samples` completions per held-out problem with KEY and counts them."""
    import jax
    import numpy as np

    run = s["run"]
    sampling = measure_lib.sampling_config(run, s["max_new_tokens"], group=s["samples"])
    ro = measure_lib.sample(run, params, s["rows"], jax.random.key(KEY), sampling=sampling,
                            weights=WEIGHTS)
    accuracy = np.asarray(ro.components["accuracy"])
    lengths = np.asarray(ro.lengths)
    items = [{"steps": int(ex.meta["steps"]), "text": ro.texts[i],
              "correct": bool(accuracy[i] >= 1.0), "length": int(lengths[i])}
             for i, ex in enumerate(s["rows"])]
    return measure_lib.figures_all_and_2op(items)


def measure(runs: common.StudyRuns) -> None:
    """growth.json for every finished run without one: the held-out figures of each kept
    checkpoint (step 0: the base's, measured once per base into <study>/growth/)."""
    setups: dict[str, dict] = {}
    for record in runs.runs:
        path = storage.join(record.workdir, "growth.json")
        if not record.finished or storage.isfile(path):
            continue
        base = record.config.model.init_from
        if base not in setups:
            setups[base] = _setup(base, record.config)
        s = setups[base]
        base_path = storage.join(runs.root, "growth",
                                 f"{os.path.basename(base.rstrip('/'))}.json")
        if storage.isfile(base_path):
            before = json.loads(storage.read_text(base_path))["figures"]
        else:
            before = _measure_policy(s, s["base_params"])
            storage.makedirs(storage.join(runs.root, "growth"))
            storage.write_text(base_path, json.dumps(
                {"base": base, "key": KEY, "samples": s["samples"],
                 "problems": s["problems"], "eval_seed": s["eval_seed"],
                 "figures": before}, indent=2, allow_nan=True))
        steps = {"0": before}
        for step, checkpoint in sorted(measure_lib.kept_rl_steps(record.workdir).items()):
            params = measure_lib.params_at(record.workdir, checkpoint, s["base_params"])
            steps[str(step)] = _measure_policy(s, params)
        storage.write_text(path, json.dumps(
            {"key": KEY, "samples": s["samples"], "problems": s["problems"],
             "eval_seed": s["eval_seed"], "rl_steps": int(record.config.rl.steps),
             "steps": steps}, indent=2, allow_nan=True))
        last = steps[max(steps, key=int)]
        print(f"[studies] length_growth {record.arm} seed={record.seed}: length "
              f"{before['length']:.1f} -> {last['length']:.1f}, pass@1 "
              f"{before['pass@1']:.3f} -> {last['pass@1']:.3f} over {len(steps)} checkpoints",
              flush=True)


# ---- analysis -----------------------------------------------------------------------------

def pearson(xs, ys) -> float:
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None
             and math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 3:
        return math.nan
    n = len(pairs)
    mx, my = sum(p[0] for p in pairs) / n, sum(p[1] for p in pairs) / n
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def _growth(record) -> dict:
    path = storage.join(record.workdir, "growth.json")
    return json.loads(storage.read_text(path)) if storage.isfile(path) else {}


def _halfway(growth: dict) -> str | None:
    """The kept checkpoint at half the RL steps (or the nearest below it)."""
    steps = sorted(int(k) for k in growth.get("steps", {}))
    half = int(growth.get("rl_steps", 0)) // 2
    below = [k for k in steps if 0 < k <= half]
    return str(below[-1]) if below else None


def _run_values(record) -> dict:
    """The figures after RL (the last checkpoint), their change from the base, Pearson's r
    of held-out length and pass@1 over the checkpoints (all, and from the first RL
    checkpoint on) and the training rollouts' first / last 10 steps."""
    growth = _growth(record).get("steps", {})
    if not growth:
        return {}
    last = growth[max(growth, key=int)]
    first = growth["0"]
    values = {name: last.get(name) for name in FIGURES}
    for name in ("length", "redo_rate", "pass@1"):
        values[f"{name}_change"] = _minus(last.get(name), first.get(name))
    order = sorted(growth, key=int)
    values["r_length_pass@1"] = pearson([growth[k]["length"] for k in order],
                                        [growth[k]["pass@1"] for k in order])
    values["r_length_pass@1_rl"] = pearson([growth[k]["length"] for k in order[1:]],
                                           [growth[k]["pass@1"] for k in order[1:]])
    rows = common.training_rows(record)
    for name in ("completion_length", "pass@1"):
        a = measure_lib.window_mean(rows, name, True)
        b = measure_lib.window_mean(rows, name, False)
        values[f"train/{name}_change"] = b - a
    return values


def _minus(a, b):
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return a - b


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _run_values, ARMS)
    points: dict[str, dict[str, list]] = {}  # arm -> step -> per-run figures
    for arm in ARMS:
        for record in runs.arm(arm):
            if not record.finished:
                continue
            growth = _growth(record)
            for step, figures in growth.get("steps", {}).items():
                points.setdefault(arm, {}).setdefault(step, []).append(figures)
            # the base and the halfway checkpoint as arms of their own, paired by
            # (base, seed) with the arm after RL
            for when, step in ((BEFORE, "0"), (HALFWAY, _halfway(growth))):
                entry = arms.get(arm) and _pseudo(arms, label(arm, when))
                if entry is None:
                    continue
                figures = growth.get("steps", {}).get(step, {}) if step else {}
                entry["seeds"].append(record.seed)
                entry["bases"].append(record.base)
                for name in FIGURES:
                    entry["metrics"].setdefault(name, []).append(figures.get(name))
    specs = [(REDO, label(REDO, BEFORE), "length"),
             (REDO, CONTROL, "length_change"),
             (CONTROL, label(CONTROL, BEFORE), "length"),
             (REDO, label(REDO, HALFWAY), "length")]
    curves = {arm: [common.training_rows(r) for r in runs.arm(arm) if r.finished]
              for arm in ARMS}
    return common.Analysis(
        arms=arms, specs=specs, table=table(arms, points),
        extra={"measurement": {"key": KEY, "temperature": 1.0},
               "held_out_by_step": {arm: {step: {name: interval(
                   [f.get(name) for f in figures]) for name in FIGURES}
                   for step, figures in sorted(by.items(), key=lambda kv: int(kv[0]))}
                   for arm, by in points.items()}},
        protocol={"notes": f"held-out figures measured on every kept checkpoint with key {KEY} "
                           "(the same for every policy), every completion counted"},
        plots=lambda out: plot(points, curves, out),
        scales={"length": (1.0, 2), "length_change": (1.0, 2)})


def _pseudo(arms: dict, name: str) -> dict:
    return arms.setdefault(name, {"seeds": [], "bases": [], "metrics": {}})


def table(arms: dict, points: dict) -> str:
    f = sweep.format_interval
    lines = []
    for arm, by in points.items():
        steps = sorted(by, key=int)
        lines += [f"| held-out, {arm} ({len(by[steps[0]])} runs) | " + " | ".join(
            f"step {k}" for k in steps) + " |", "|---" * (len(steps) + 1) + "|"]
        for name, scale, unit in (("length", 1.0, ""), ("redo_rate", 100.0, "%"),
                                  ("pass@1", 100.0, "%"), ("with_redo", 100.0, "%")):
            cells = []
            for k in steps:
                text = f(interval([x.get(name) for x in by[k]]), scale, 1)
                cells.append(text if text == "-" else text + unit)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    present = [a for a in ARMS if a in arms]
    if present:
        lines += ["| per run (mean ± 95% over runs; descriptive) | " + " | ".join(present)
                  + " |", "|---" * (len(present) + 1) + "|"]
        rows = (("length_change", "held-out length, last - step 0 (tokens)", 1.0, 1),
                ("redo_rate_change", "redos per step, last - step 0 (points)", 100.0, 1),
                ("pass@1_change", "pass@1, last - step 0 (points)", 100.0, 1),
                ("r_length_pass@1", "Pearson r, held-out length vs pass@1, all checkpoints",
                 1.0, 2),
                ("r_length_pass@1_rl", "the same from the first RL checkpoint on", 1.0, 2),
                ("train/completion_length_change",
                 "training completion length, last 10 - first 10 steps", 1.0, 1),
                ("train/pass@1_change", "training pass@1, last 10 - first 10 steps (points)",
                 100.0, 1))
        for name, text, scale, digits in rows:
            lines.append(f"| {text} | " + " | ".join(
                f(interval([v for v in arms[a]["metrics"].get(name, [])
                            if v is not None]), scale, digits, True)
                for a in present) + " |")
        lines += ["", "| two-operator problems, after RL | " + " | ".join(present) + " |",
                  "|---" * (len(present) + 1) + "|"]
        for name, text in (("pass@1_redo_2op", "pass@1 of completions with a redo"),
                           ("pass@1_no_redo_2op", "pass@1 of completions without")):
            lines.append(f"| {text} | " + " | ".join(
                f(interval([v for v in arms[a]["metrics"].get(name, [])
                            if v is not None]), 100.0, 1) for a in present) + " |")
    return "\n".join(lines) + "\n"


def plot(points: dict, curves: dict, out: str) -> None:
    """growth.png: held-out length, redo rate and pass@1 over the kept checkpoints per arm
    (95% over runs), and the training completions' length."""
    import numpy as np

    plt = common.pyplot()
    colors = {REDO: "C0", CONTROL: "C7"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for arm, by in points.items():
        steps = sorted(by, key=int)
        x = [int(k) for k in steps]
        for ax, name, scale in ((axes[0], "length", 1.0), (axes[1], "pass@1", 100.0),
                                (axes[1], "redo_rate", 100.0)):
            stats = [interval([f.get(name) for f in by[k]]) for k in steps]
            means, halves = common.error_bars(stats, scale)
            ax.errorbar(x, means, yerr=np.nan_to_num(halves), capsize=3, color=colors[arm],
                        fmt="-o" if name != "redo_rate" else "--s", markersize=4,
                        label=f"{arm}" if name == "length" else f"{arm}: {name}")
    for arm in ARMS:
        common.band(axes[2], [[np.nan if r.get("completion_length") is None
                               else r["completion_length"] for r in rows]
                              for rows in curves.get(arm, [])], label=arm, color=colors[arm])
    axes[0].set_title("held-out length (tokens), kept checkpoints, 95%", fontsize=9)
    axes[1].set_title("held-out pass@1 (-) and redos per step (--), %", fontsize=9)
    axes[2].set_title("training completion length (mean, ±1 std)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("GRPO step")
        if ax.lines:
            ax.legend(fontsize=7)
    common.save_figure(fig, out, "growth.png")


# ---- claims -------------------------------------------------------------------------------

R1 = "DeepSeek-AI 2025, arXiv:2501.12948"
# What else RL changes in a completion's length, in both arms (the claims' why).
CLEAN_UP = ("the held-out length counts every completion, not only the correct traces: RL "
            "pushes mass off the base's malformed completions (which may run on to the token "
            "limit or stop short) and off its operator confusions (whose numbers can have "
            "another count of digits)")
BUILT_IN = ("built in: the base redoes about a third of its steps before RL and a redone "
            "step is right, so a longer trace is more often right by construction")
CLAIMS = (
    common.Claim(
        text="The average response length of DeepSeek-R1-Zero on the training set during the "
             "RL process. DeepSeek-R1-Zero naturally learns to solve reasoning tasks with "
             "more thinking time.",
        source=f"{R1}, sec. 2.2.4, Fig. 3 (caption); tested on the held-out length after "
               "RL against the base, where longer traces pay",
        test=(REDO, label(REDO, BEFORE), "length"), expect=">", margin=MARGIN,
        kind="check", can_fail="no: " + BUILT_IN, note=BUILT_IN),
    common.Claim(
        text="RL lengthens the completions only where a longer trace pays: the length grows "
             "more from the redo base than from the base without redos",
        source="this study's design (the control), the reading of the R1-Zero curve it "
               "tests",
        test=(REDO, CONTROL, "length_change"), expect=">", margin=MARGIN,
        why="the redo arm's growth is built in, but " + CLEAN_UP + ", in both arms; where "
            "that clean-up shortens the redo arm's completions by about what its extra "
            "redos add, or lengthens the control's, the two changes lie less than the "
            "margin apart",
        note="the two bases differ in their pretraining traces only"),
    common.Claim(
        text="where nothing longer pays (redo_rate 0), RL leaves the length as it is",
        source="this study's design (the control)",
        test=(CONTROL, label(CONTROL, BEFORE), "length"), expect="=", margin=MARGIN,
        why="without redos a correct trace has a fixed number of steps, but " + CLEAN_UP
            + ", and that clean-up can shift the mean length by more than the margin"),
    common.Claim(
        text="the thinking time of DeepSeek-R1-Zero shows consistent improvement throughout "
             "the training process",
        source=f"{R1}, sec. 2.2.4; tested as the held-out length after RL against the "
               "halfway checkpoint (step 60 of 120) of the same run",
        test=(REDO, label(REDO, HALFWAY), "length"), expect=">", margin=MARGIN,
        why="growth has a natural end here: a trace grows only by redoing steps (the "
            "pretraining traces redo a step at most once, and a redo after a right step only "
            "costs length), so once the redo has spread as far as it pays, which it may have "
            "by the halfway checkpoint, the second half adds less than the margin, or "
            "shortens the traces by dropping the redos after right steps"),
    common.Claim(
        text="This improvement is not the result of external adjustments but rather an "
             "intrinsic development within the model",
        source=f"{R1}, sec. 2.2.4",
        test=None,
        untestable="the only behaviour here that lengthens a trace and pays is the redo, put "
                   "into the base's pretraining traces by construction; the base without "
                   "redos has nothing to lengthen. Whether RL makes a new lengthening "
                   "behaviour emerge needs a base that never saw one and a task where "
                   "thinking longer pays, beyond a 1M-parameter model and 120 steps"),
)


STUDY = common.Study(
    name="length_growth",
    question="does GRPO lengthen the completions, as R1-Zero's curve, where a longer trace "
             "is more often right (a base that redoes steps), against a base where nothing "
             "longer pays; and does the length keep growing through training?",
    tiers=tiers.standard(
        full="about 50 min on 2 cores, estimated: 12 runs of 120 GRPO "
             "steps at ~3 min (6 of them the same configs as "
             "length_bias's grpo arm, run again in this study's "
             "directory) and the measurement of 7 checkpoints x 1,024 "
             "completions per run (~1 min per run); plus the redo and "
             "the main job's bases when not built yet (shared)",
        mini="about 1 min on 2 cores, measured (37 s of CPU, 1 min 12 "
             "s wall on a CPU loaded by other jobs: 4 toy runs, their "
             "measurement, two toy bases)",
        mini_seeds=(0, 1)),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze, measure=measure,
    attach=attach, claims=CLAIMS,
)
