"""Budget forcing (s1, Muennighoff et al. 2025, arXiv:2501.19393): accuracy against the
thinking budget, capped, and stretched with "Wait" or with " redo".

Three base runs per base seed (shared, keyed by their configs): `main`, the main job's
pretraining (the base off_policy, cold_start and kl_beta start from); `redo`, the same
pretraining on traces that redo a step with probability 0.3 (task.kwargs.redo_rate: a redone
step is always right, so a model of these traces knows a re-check; length_bias's base); and
`wait_redo`, the same traces with the word "Wait" where `redo` writes "redo"
(task.kwargs.redo_word: "9*6=15 Wait 9*6=54"), so its model has seen "Wait" before a re-check,
as s1's fine-tuning traces have. Three arms, each the main job's RL stage (GRPO, accuracy +
0.2 x format, lr 2e-4, groups of 8; 60 steps of 16 prompts) from its base:

  wait: from `main`; forced with "Wait", which the model has never seen
  redo: from `redo` (completions of up to 48 tokens); forced with " redo"
  wait seen: from `wait_redo` (completions of up to 48 tokens); forced with " Wait"

After the runs, `measure` samples 8 completions of each of 128 held-out problems (fixed across
seeds: task.eval_seed), max_new_tokens 48 for every condition (the most the 64-token context
leaves after the 16-token prompt), under each forcing condition: for `wait`, the RL model
without forcing, with the end of thinking forced after 4, 8, 12 or 16 thinking tokens (caps)
and with at least 24 or 32 (an earlier `</think>` or EOS replaced by "Wait"); for `redo`,
the base model and the RL model without forcing and with at least 16, 24 or 32 thinking
tokens (" redo"); for `wait seen`, the same with " Wait". Every condition of a (base,
seed) uses one sampling key, so its samples differ from the unforced ones only from the
first forced token on. Each model's figures are written to `forcing.json` in its run's
directory (`forcing_base.json` for the redo and "Wait" base models), one condition at a
time, so the measurement resumes.
"""

from __future__ import annotations

import json

from grpo_jax import storage, sweep
from grpo_jax.stats import interval, paired_interval
from grpo_jax.studies import common, jobs, tiers
from grpo_jax.studies import measure as measure_lib

WAIT, REDO, SEEN = "wait", "redo", "wait seen"
WAIT_WORD = "Wait"  # the `wait_redo` base's redo_word
MAX_NEW_TOKENS = 48  # every condition, the unforced one included
KEY = 250131  # the sampling key's root (s1's arXiv date); each seed folds itself in
REDO_RATE = 0.3
# condition -> (min_thinking_tokens, max_thinking_tokens)
WAIT_CONDITIONS = {"none": (0, 0), "max=4": (0, 4), "max=8": (0, 8), "max=12": (0, 12),
                   "max=16": (0, 16), "min=24": (24, 0), "min=32": (32, 0)}
REDO_CONDITIONS = {"none": (0, 0), "min=16": (16, 0), "min=24": (24, 0), "min=32": (32, 0)}
# The mini tier's arms: "wait seen" takes the redo arm's path from the "Wait" base (still
# built: test_time_scaling's e3 arm starts from it), its base's redo word checked in
# tests/test_tasks.py, its claims the redo arm's contrasts on other arms.
MINI_ARMS = (WAIT, REDO)
# the conditions the mini tier measures, per arm: those the claims test
MINI = {WAIT: ("none", "max=8", "min=24"), REDO: ("none", "min=16"), SEEN: ("none", "min=16")}
# (model label, arm, "rl" or "base", continuation, conditions), in table order
MODELS = (("RL (main base), \"Wait\"", WAIT, "rl", "Wait", WAIT_CONDITIONS),
          ("redo base, \" redo\"", REDO, "base", " redo", REDO_CONDITIONS),
          ("RL (redo base), \" redo\"", REDO, "rl", " redo", REDO_CONDITIONS),
          ("\"Wait\" base, \" Wait\"", SEEN, "base", " Wait", REDO_CONDITIONS),
          ("RL (\"Wait\" base), \" Wait\"", SEEN, "rl", " Wait", REDO_CONDITIONS))
PREFIX = {(WAIT, "rl"): "rl", (REDO, "base"): "redo_base", (REDO, "rl"): "redo_rl",
          (SEEN, "base"): "wait_base", (SEEN, "rl"): "wait_rl"}
FIGURES = ("pass@1", "pass@8", "format_rate", "mean_length")


def arm_label(arm: str, model: str, condition: str) -> str:
    """The summary's arm of one (model, forcing condition), e.g. "redo_base/min=16"."""
    return f"{PREFIX[(arm, model)]}/{condition}"


def _sizes(tier: str) -> dict:
    if tier == "full":
        return {"problems": 128, "samples": 8, "batch_rows": 256}
    return {"problems": 4, "samples": 8, "batch_rows": 32}


def _main_base(tier: str):
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain"
    return config


def _redo_base(tier: str):
    config = _main_base(tier)
    config.task.kwargs.redo_rate = REDO_RATE
    return config


def _wait_base(tier: str):
    config = _redo_base(tier)
    config.task.kwargs.redo_word = WAIT_WORD
    return config


def base_config(tier: str) -> dict:
    """The main job's pretraining, the same on traces with redos, and on traces whose redos
    are introduced by "Wait"."""
    return {"main": _main_base(tier), "redo": _redo_base(tier),
            "wait_redo": _wait_base(tier)}


def arm_config(tier: str = "full", arm: str = WAIT):
    """One arm's RL run from its base (model.init_from, set per base by `attach`); the
    held-out sampling is `measure`'s."""
    if arm not in (WAIT, REDO, SEEN):
        raise ValueError(f"budget_forcing: arm {WAIT}, {REDO} or {SEEN}, got {arm!r}")
    config = jobs.rl_alone(tier)
    if arm in (REDO, SEEN):
        config.task.kwargs.redo_rate = REDO_RATE  # as its base was pretrained
        config.rl.max_new_tokens = MAX_NEW_TOKENS  # a trace with two redos is ~37 tokens
    if arm == SEEN:
        config.task.kwargs.redo_word = WAIT_WORD
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(tier, arm) for arm in (WAIT, REDO, SEEN)}


def attach(config, base: dict) -> None:
    """The base whose traces the arm's task writes: with "Wait" redos the `wait_redo` base, with
    redos the `redo` base, else the main job's."""
    kwargs = config.task.kwargs
    role = ("main" if not kwargs.get("redo_rate") else
            "wait_redo" if kwargs.get("redo_word") == WAIT_WORD else "redo")
    config.model.init_from = base["roles"][role]


def _conditions(tier: str, arm: str, conditions: dict) -> dict:
    return conditions if tier == "full" else {k: v for k, v in conditions.items()
                                              if k in MINI[arm]}


# ---- the measurement --------------------------------------------------------------------------

def _path(record, model: str) -> str:
    return storage.join(record.workdir, "forcing.json" if model == "rl" else
                        "forcing_base.json")


def _figures(problems: list[dict]) -> dict:
    total = sum(p["samples"] for p in problems)
    return {"pass@1": sum(p["correct"] for p in problems) / total,
            "pass@8": sum(p["correct"] > 0 for p in problems) / len(problems),
            "format_rate": sum(p["formatted"] for p in problems) / total,
            "mean_length": sum(p["tokens"] for p in problems) / total,
            "examples": problems[0].get("texts", [])}


def measure(runs: common.StudyRuns) -> None:
    """forcing.json (and the redo base model's forcing_base.json) for every finished run,
    one condition at a time; a condition measured already is skipped."""
    import time

    sizes = _sizes(runs.tier)
    for label, arm, model, continuation, conditions in MODELS:
        conditions = _conditions(runs.tier, arm, conditions)
        for record in runs.arm(arm):
            if not record.finished:
                continue
            path = _path(record, model)
            done = json.loads(storage.read_text(path)) if storage.isfile(path) else {
                "model": model, "continuation": continuation, "key": KEY, "seed": record.seed,
                "conditions": {}}
            todo = [c for c in conditions if c not in done["conditions"]]
            if not todo:
                continue
            source = record.workdir if model == "rl" else record.config.model.init_from
            setup = measure_lib.held_out(source, sizes["problems"])
            for condition in todo:
                low, high = conditions[condition]
                t0 = time.time()
                problems = measure_lib.sample_problems(
                    setup, setup.run.params, samples=sizes["samples"], seed=record.seed,
                    max_new_tokens=MAX_NEW_TOKENS, batch_rows=sizes["batch_rows"],
                    forcing={"min_thinking_tokens": low, "max_thinking_tokens": high,
                             "end_thinking": "</think>", "continuation": continuation},
                    keep_texts=4, key=KEY)
                done["conditions"][condition] = _figures(problems)
                storage.write_text(path, json.dumps(done, indent=1))
                print(f"[studies] budget_forcing: {label} {record.base} seed={record.seed} "
                      f"{condition}: pass@1 {done['conditions'][condition]['pass@1']:.3f} "
                      f"({time.time() - t0:.0f}s)", flush=True)


# ---- the analysis -----------------------------------------------------------------------------

def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms: dict = {}
    examples: dict = {}
    for _, arm, model, _, conditions in MODELS:
        for record in runs.arm(arm):
            path = _path(record, model)
            if not record.finished or not storage.isfile(path):
                continue
            measured = json.loads(storage.read_text(path))["conditions"]
            for condition in conditions:
                if condition not in measured:
                    continue
                name = arm_label(arm, model, condition)
                entry = arms.setdefault(name, {"seeds": [], "bases": [], "rows": []})
                entry["seeds"].append(record.seed)
                entry["bases"].append(record.base)
                entry["rows"].append({k: measured[condition][k] for k in FIGURES})
                examples.setdefault(name, measured[condition].get("examples", []))
    for entry in arms.values():
        rows = entry.pop("rows")
        entry["metrics"] = {k: [row[k] for row in rows] for k in FIGURES}
    order = [arm_label(arm, model, c) for _, arm, model, _, conditions in MODELS
             for c in conditions]
    arms = {name: arms[name] for name in order if name in arms}
    specs = [tuple(claim.test) for claim in CLAIMS if claim.test is not None]
    sizes = _sizes(runs.tier)
    return common.Analysis(
        arms=arms, specs=specs, table=table(arms),
        extra={"examples_first_seed": examples, "sampling_key": KEY,
               "max_new_tokens": MAX_NEW_TOKENS},
        protocol={"problems": sizes["problems"], "samples_per_problem": sizes["samples"],
                  "notes": (f"measured after training: every forcing condition of a (base, "
                            f"seed) samples with one key ({KEY} folded with the seed), "
                            f"max_new_tokens {MAX_NEW_TOKENS}, temperature 1")},
        plots=lambda out: plot(arms, out))


def _describe(condition: str, continuation: str) -> str:
    if condition == "none":
        return "no forcing"
    kind, value = condition.split("=")
    if kind == "max":
        return f"cap: at most {value} thinking tokens"
    return f"at least {value} thinking tokens (\"{continuation}\")"


def table(arms: dict) -> str:
    """Per model and condition: pass@1, its paired difference to no forcing (descriptive),
    length, format rate, pass@8."""
    lines = [("Each cell: mean ± 95% half-width over every (base, seed). \"- none\": the paired "
              "difference to no forcing, same model and key (descriptive, not adjusted: the "
              "tests are the claims' contrasts below)."), "",
             ("| model | forcing | pass@1 | pass@1 - none | mean length (tokens) | length - "
              "none | format rate | pass@8 |"), "|---|---|---|---|---|---|---|---|"]
    for label, arm, model, continuation, conditions in MODELS:
        none = arms.get(arm_label(arm, model, "none"))
        for condition in conditions:
            name = arm_label(arm, model, condition)
            if name not in arms:
                continue
            m = arms[name]["metrics"]

            def diff(metric, scale, m=m, name=name, none=none, condition=condition):
                if none is None or condition == "none":
                    return "-"
                ref = dict(zip(zip(none["bases"], none["seeds"]), none["metrics"][metric]))
                keys = zip(arms[name]["bases"], arms[name]["seeds"])
                return sweep.format_interval(paired_interval(
                    m[metric], [ref.get(k) for k in keys]), scale, 1, signed=True)

            lines.append(f"| {label} | {_describe(condition, continuation)} | "
                         f"{common.cell(m['pass@1'])}% | {diff('pass@1', 100.0)} | "
                         f"{common.cell(m['mean_length'], 1.0)} | {diff('mean_length', 1.0)} | "
                         f"{common.cell(m['format_rate'])}% | {common.cell(m['pass@8'])}% |")
    return "\n".join(lines) + "\n"


def plot(arms: dict, out: str) -> None:
    """budget_forcing.png: pass@1, length and format rate against the thinking budget, one
    line per model (caps and minima), the unforced figure at budget 0."""
    import numpy as np

    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for index, (label, arm, model, _, conditions) in enumerate(MODELS):
        for kind, style in (("max", "s--"), ("min", "o-")):
            names = [c for c in conditions if c.startswith(kind)]
            points = [(int(c.split("=")[1]), arm_label(arm, model, c)) for c in names
                      if arm_label(arm, model, c) in arms]
            if not points:
                continue
            x = np.array([p for p, _ in points])
            for ax, metric, scale in ((axes[0], "pass@1", 100), (axes[1], "mean_length", 1),
                                      (axes[2], "format_rate", 100)):
                stats = [interval(arms[n]["metrics"][metric]) for _, n in points]
                mean, err = common.error_bars(stats, scale)
                ax.errorbar(x, mean, yerr=err, fmt=style, capsize=3, color=f"C{index}",
                            label=f"{label}: {'cap' if kind == 'max' else 'minimum'}")
                none = arms.get(arm_label(arm, model, "none"))
                if none is not None and kind == "min":
                    ax.axhline(np.mean(none["metrics"][metric]) * scale, color=f"C{index}",
                               lw=0.8, ls=":")
    for ax, ylabel in zip(axes, ("pass@1 (%)", "mean completion length (tokens)",
                                 "format rate (%)")):
        ax.set_xlabel("thinking budget (tokens, <think> included)")
        ax.set_ylabel(ylabel)
    axes[0].set_title("held-out pass@1 (dotted: no forcing), 95% interval", fontsize=9)
    axes[1].set_title("completion length", fontsize=9)
    axes[2].set_title("well-formed completions", fontsize=9)
    axes[0].legend(fontsize=6)
    common.save_figure(fig, out, "budget_forcing.png")


S1 = "Muennighoff et al. 2025 (s1), arXiv:2501.19393"
QUOTE = ("budget forcing ... lengthening [the model's thinking] by appending \"Wait\" ... when "
         "it tries to end ... can lead the model to double-check its answer, often fixing "
         "incorrect reasoning steps")
MARGIN = 0.02  # well under s1's gain from forcing (50% -> 57% on AIME24, abstract)


def _last_step(word: str) -> str:
    """How a minimum of 16 thinking tokens with `word` could fail to help a model whose traces
    redo a step after it (the claims' why)."""
    return ("both conditions share one key, so they differ only where the model would end its "
            "thinking before the minimum, about every trace without a redo; there the forced "
            f"\"{word.strip()}\" comes after the last step, and the re-check its traces taught "
            "recomputes only the step before the word, from the same inputs: it fixes a wrong "
            "last step, not an error in an earlier step that the last one carried forward, and "
            "on a right trace it can only cost (a garbled recomputation, or the answer not "
            f"reached within the {MAX_NEW_TOKENS} new tokens)")


_AFTER_RL = ("; after GRPO the unforced traces redo more steps, and a trace that redid one is "
             "past the minimum and not forced, while RL has made the last step more often "
             "right: fewer forced traces have a wrong last step to fix")

CLAIMS = (
    common.Claim(
        text="budget forcing controls test-time compute by forcefully terminating the model's "
             "thinking process, and accuracy scales with the thinking budget: a budget below "
             "what the model would think lowers accuracy",
        source=f"{S1}, abstract, sec. 3.1 and Fig. 1 (close paraphrase)",
        test=(arm_label(WAIT, "rl", "max=8"), arm_label(WAIT, "rl", "none"), "pass@1"),
        expect="<", margin=MARGIN, kind="check",
        can_fail="no: the cap cuts every trace before the step that computes the answer",
        note="mechanical here: a cap of 8 thinking tokens cuts a two-step trace before the "
             "step that computes the answer"),
    common.Claim(
        text=QUOTE, source=f"{S1}, abstract (quoted); tested with \"Wait\", at least 24 "
                           "thinking tokens",
        test=(arm_label(WAIT, "rl", "min=24"), arm_label(WAIT, "rl", "none"), "pass@1"),
        expect=">", margin=MARGIN,
        why="the model never read the word (none of its characters occurs in its pretraining "
            "text), and its traces are a fixed chain of steps whose last number is the "
            "answer; a minimum of 24 lies past the unforced traces' thinking, so nearly "
            "every completion is forced, some more than once, and the model, off its "
            "distribution after the word, may garble, repeat or change a step, or use up the "
            f"{MAX_NEW_TOKENS} new tokens before it answers: the forced completions may be "
            "right less often, not more",
        note="s1 forces a model fine-tuned on traces where \"Wait\" is common; this model "
             "never saw W, a, i or t, so a loss here does not contradict s1"),
    common.Claim(
        text=QUOTE, source=f"{S1}, abstract (quoted); tested with \" redo\" on the redo base "
                           "model, at least 16 thinking tokens",
        test=(arm_label(REDO, "base", "min=16"), arm_label(REDO, "base", "none"), "pass@1"),
        expect=">", margin=MARGIN,
        why=_last_step(" redo") + "; the gain falls short of the margin where the wrong "
            "traces' errors lie mostly in earlier steps",
        note="one budget point, chosen from an exploratory run before the study's runs; an "
             "engineered base (its traces redo steps and a redone step is always right), "
             "the closest this miniature comes to s1's fine-tuned model"),
    common.Claim(
        text=QUOTE, source=f"{S1}, abstract (quoted); tested with \" redo\" on the redo "
                           "base's RL model, at least 16 thinking tokens",
        test=(arm_label(REDO, "rl", "min=16"), arm_label(REDO, "rl", "none"), "pass@1"),
        expect=">", margin=MARGIN, why=_last_step(" redo") + _AFTER_RL,
        note="s1 forces a fine-tuned (SFT) model; after GRPO the model already redoes more "
             "steps unforced"),
    common.Claim(
        text=QUOTE, source=f"{S1}, abstract (quoted); tested with \"Wait\" on the base "
                           "model pretrained on traces where \"Wait\" introduces a re-check, "
                           "at least 16 thinking tokens",
        test=(arm_label(SEEN, "base", "min=16"), arm_label(SEEN, "base", "none"), "pass@1"),
        expect=">", margin=MARGIN,
        why=_last_step(" Wait") + "; the gain falls short of the margin where the wrong "
            "traces' errors lie mostly in earlier steps",
        note="the redo base's traces with \"Wait\" for \"redo\": the model has seen the "
             "word s1 appends, always before a correct re-check of the step before it, "
             "as s1's fine-tuned model has seen it in its traces"),
    common.Claim(
        text=QUOTE, source=f"{S1}, abstract (quoted); tested with \"Wait\" on the RL model "
                           "of the base that saw \"Wait\", at least 16 thinking tokens",
        test=(arm_label(SEEN, "rl", "min=16"), arm_label(SEEN, "rl", "none"), "pass@1"),
        expect=">", margin=MARGIN, why=_last_step(" Wait") + _AFTER_RL,
        note="s1 forces a fine-tuned (SFT) model; GRPO may already lengthen the unforced "
             "traces with re-checks"),
)


STUDY = common.Study(
    name="budget_forcing",
    question="s1's budget forcing (caps; minima with \"Wait\", or with \" redo\" or "
             "\" Wait\" on bases whose traces redo steps after that word) on GRPO-trained "
             "and base models, paired by (base, seed) "
             "against no forcing",
    tiers=tiers.standard(
        full="about 35-50 min on 2 cores (estimated: 18 RL runs of 60 "
             "steps, 1-1.5 min each, which dominate; 138 samplings of "
             "128 x 8, 5-10 s each; plus, when not built yet, the shared "
             "9-min main base and the redo and \"Wait\" bases, 9-18 min "
             "each, per base seed)",
        mini="about 25 s of CPU on 2 cores, measured (25-28 s for its test alone, which "
             "compiles every program itself; 22-26 s wall): the three toy bases, one seed of "
             "the wait and redo arms' toy RL runs, the claimed conditions on 4 x 8 samples",
        mini_arms=MINI_ARMS),
    arms=(WAIT, REDO, SEEN), base_config=base_config, arm_configs=arm_configs, attach=attach,
    analyze=analyze, measure=measure, claims=CLAIMS,
)
