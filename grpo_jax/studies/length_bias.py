"""GRPO's length normalisation and std scaling, one at a time (Dr. GRPO, Liu et al. 2025,
arXiv:2503.20783), on arithmetic whose base model redoes steps.

The main job's RL stage (accuracy + 0.2 x format reward, lr 2e-4, groups of 8, host loop),
120 steps of 16 prompts, rl.beta 0 in every arm, completions of at most 48 tokens, from the
final parameters of a base pretrained on traces in which each step is redone with
probability 0.3 (task.kwargs.redo_rate: a redone step is always right, so a longer trace is
more often right). Held-out evaluation before and after on 128 problems fixed across seeds
(task.eval_seed), 8 samples each, every completion logged (samples_logged -1), so the
lengths of the correct and of the incorrect completions are counted on all of them.

Arms, a 2 x 2 design over the two terms GRPO has and Dr. GRPO removes:

  grpo              advantages (r - mean) / std, loss 1/|o| per completion (seq-mean-token-mean)
  grpo_no_len_norm  std scaling kept, constant length instead of |o| (seq-mean-token-sum-norm):
                    only the length term changed
  grpo_no_std       no std scaling, 1/|o| kept: only the std term changed
  dr_grpo           neither (Dr. GRPO)

Every arm is paired by (base, seed) with `grpo`: the same base, prompt order, sampling keys
and held-out problems. The lengths the claims test are those of the two-operator held-out
problems (109 of 128), so that a length does not also measure the mix of one- and two-step
problems among the correct and the incorrect completions.
"""

from __future__ import annotations

import json
import math
import re

from grpo_jax import storage, sweep
from grpo_jax.stats import interval
from grpo_jax.studies import common, tiers
from grpo_jax.studies.arms import paired, per_arm
from grpo_jax.studies.measure import figures_all_and_2op, window_mean

REDO_RATE = 0.3  # the base's pretraining traces (and the arms' task)
MAX_NEW_TOKENS = 48  # a trace with two redone steps is ~37 tokens; 16 + 48 = max_seq_len 64
REFERENCE = "grpo"
BASE_MODEL = "base model"  # every seed's eval_base: the base before RL (the same parameters)
# arm -> (rl.algorithm, rl.loss_agg): the algorithm sets the advantage (std scaling or not)
ARMS_SPEC = {
    "grpo": ("grpo", "seq-mean-token-mean"),
    "grpo_no_len_norm": ("grpo", "seq-mean-token-sum-norm"),
    "grpo_no_std": ("dr_grpo", "seq-mean-token-mean"),
    "dr_grpo": ("dr_grpo", "seq-mean-token-sum-norm"),
}
ARMS = tuple(ARMS_SPEC)
# (markdown: a table cell's "|" is written "\\|")
WHAT = {"grpo": "std scaling, 1/\\|o\\|",
        "grpo_no_len_norm": "std scaling, constant length",
        "grpo_no_std": "no std scaling, 1/\\|o\\|",
        "dr_grpo": "no std scaling, constant length (Dr. GRPO)"}
WINDOW = 10  # training steps averaged at the start and at the end of RL
STEPS_OF = re.compile(r"[-+*]")
TAGS = re.compile(r"</?(?:think|answer)>")  # one token each under the char tokenizer
LENGTH_MARGIN = 1.5  # tokens: see the README (5% of a ~30-token completion)
PASS_MARGIN = 0.03  # 3 points of pass@1: a tenth of what RL adds here


# ---- configs ------------------------------------------------------------------------------

def base_config(tier: str):
    """The main job's pretraining (1500 steps; the smoke preset's 3 at the mini tier) on
    traces with redos (redo_rate 0.3): the base length_growth starts from too."""
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain"
    config.task.kwargs.redo_rate = REDO_RATE
    return config


def arm_config(tier: str = "full", arm: str = REFERENCE, redo_rate: float = REDO_RATE):
    """One arm's run: eval_base -> rl -> eval_final from the base (model.init_from, set per
    base by the study). `redo_rate` is the task's (length_growth's control sets 0, with a
    base pretrained without redos)."""
    if arm not in ARMS_SPEC:
        raise ValueError(f"length_bias: arm one of {ARMS}, got {arm!r}")
    config = common.main_job(common.preset(tier))
    config.stages = "eval_base,rl,eval_final"
    del config.pretrain
    config.model.init_from = ""  # the base's workdir, set by the study per base
    config.task.kwargs.redo_rate = redo_rate  # as the base was pretrained
    if tier == "full":
        config.rl.steps = 120
        config.rl.num_prompts = 16
    config.rl.algorithm, config.rl.loss_agg = ARMS_SPEC[arm]
    config.rl.beta = 0.0  # no KL term in any arm: they differ in the two terms only
    config.rl.max_new_tokens = MAX_NEW_TOKENS
    config.rl.fused_steps = 0  # the host loop, as the recorded results were made
    # Every 20th step's parameters are kept (every step at the mini tier's 2), for
    # length_growth's held-out measurement along training.
    config.rl.checkpoint_every = 20 if tier == "full" else 1
    config.checkpoint.max_to_keep = 10
    for section in (config.eval_base, config.eval_final):
        section.max_new_tokens = MAX_NEW_TOKENS
        section.samples_logged = -1  # every completion: lengths of correct / incorrect
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(tier, arm) for arm in ARMS}


# ---- per-completion figures (`measure.figures_all_and_2op`) ---------------------------------

def problem_steps(prompt: str) -> int:
    """Steps a problem needs: one per operator of "Q: 7+5*3\\nA: " (operands are 1-9)."""
    return len(STEPS_OF.findall(prompt.split("Q:", 1)[-1].split("\n", 1)[0]))


def token_length(completion: str, max_new_tokens: int) -> int:
    """Tokens of a completion under the char tokenizer, the end token included (as the
    eval's mean_length counts them; a completion of max_new_tokens has none)."""
    n = len(TAGS.sub("#", completion))
    return n + (n < max_new_tokens)


def stage_samples(workdir: str, stage: str, max_new_tokens: int) -> list[dict]:
    """Every completion an eval stage logged (samples.jsonl) as `measure.completion_figures`
    items."""
    path = storage.join(workdir, "samples.jsonl")
    if not storage.isfile(path):
        return []
    items = []
    for line in storage.read_text(path).splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("stage") == stage:
            items.append({"steps": problem_steps(row["prompt"]), "text": row["completion"],
                          "correct": row["accuracy"] >= 1.0,
                          "length": token_length(row["completion"], max_new_tokens)})
    return items


# ---- analysis -----------------------------------------------------------------------------

HELD_OUT = ("pass@1", "pass@8", "mean_length")
TRAINING = ("length_correct", "length_incorrect", "completion_length", "pass@1")
# The Holm family: one contrast per claim (the README's tables add descriptive intervals,
# marked as such, that are not tests).
SPECS = (("grpo_no_len_norm", REFERENCE, "length_incorrect_2op"),
         ("grpo_no_len_norm", REFERENCE, "length_correct_2op"),
         ("grpo_no_std", REFERENCE, "length_incorrect_2op"),
         ("dr_grpo", REFERENCE, "length_incorrect_2op"),
         ("dr_grpo", REFERENCE, "pass@1"))


def _run_values(record) -> dict:
    """Held-out figures after RL (eval_final: pass@k and the counts over every completion),
    before RL (`base/...`), and the training rollouts' first / last WINDOW steps."""
    stages = common.last_stage_rows(record)
    new = int(record.config.eval_final.max_new_tokens)
    values = {}
    for stage, prefix in (("eval_final", ""), ("eval_base", "base/")):
        row = stages.get(stage, {})
        values.update({prefix + name: row.get(name) for name in HELD_OUT})
        counted = figures_all_and_2op(stage_samples(record.workdir, stage, new))
        counted["pass@1_samples"] = counted.pop("pass@1")  # the eval's own pass@1 is kept
        values.update({prefix + name: value for name, value in counted.items()})
    rows = common.training_rows(record)
    for name in TRAINING:
        first = window_mean(rows, name, True, WINDOW)
        last = window_mean(rows, name, False, WINDOW)
        values[f"train/{name}_first"] = first
        values[f"train/{name}_last"] = last
        values[f"train/{name}_change"] = last - first
    return values


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _run_values, ARMS)
    if REFERENCE in arms:  # the base before RL: the reference arm's eval_base samples
        ref = arms[REFERENCE]
        arms[BASE_MODEL] = {"seeds": list(ref["seeds"]), "bases": list(ref["bases"]),
                            "metrics": {name[len("base/"):]: values
                                        for name, values in ref["metrics"].items()
                                        if name.startswith("base/")}}
    curves = {arm: [common.training_rows(r) for r in runs.arm(arm) if r.finished]
              for arm in ARMS}
    check = _length_check(arms)
    return common.Analysis(
        arms=arms, specs=list(SPECS), table=table(arms) + _check_line(check),
        extra={"length_check": check},
        protocol={"notes": "lengths counted on every held-out completion (samples_logged -1) "
                           "in tokens of the char tokenizer with the end token; claims on "
                           "the two-operator problems"},
        plots=lambda out: plot(arms, curves, out),
        scales={name: (1.0, 2) for name in ("length_correct_2op", "length_incorrect_2op")})


def _length_check(arms: dict) -> dict:
    """The largest gap between the counted mean length and the eval's own mean_length, per
    arm (0 when the counting matches the eval's)."""
    out = {}
    for arm, entry in arms.items():
        counted, own = entry["metrics"].get("length", []), entry["metrics"].get("mean_length",
                                                                               [])
        gaps = [abs(a - b) for a, b in zip(counted, own) if a is not None and b is not None
                and math.isfinite(a) and math.isfinite(b)]
        out[arm] = max(gaps) if gaps else None
    return out


def _check_line(check: dict) -> str:
    gaps = [v for v in check.values() if v is not None]
    if not gaps:
        return ""
    return (f"\nLengths counted from the logged completions differ from the eval's own "
            f"mean_length by at most {max(gaps):.2f} tokens per run (0: every completion "
            "decodes to its tokens).\n")


def stat(arms: dict, arm: str, name: str) -> dict:
    return interval([v for v in arms[arm]["metrics"].get(name, []) if v is not None])


def _cell(stats: dict, scale: float, digits: int = 1, signed: bool = False,
          unit: str = "") -> str:
    text = sweep.format_interval(stats, scale, digits, signed)
    return text if text == "-" else text + unit


# (metric, label, scale, unit)
COLUMNS_2OP = (("pass@1_2op", "pass@1", 100.0, "%"),
               ("length_correct_2op", "length, correct", 1.0, ""),
               ("length_incorrect_2op", "length, incorrect", 1.0, ""),
               ("gap_2op", "incorrect - correct", 1.0, ""),
               ("redo_rate_2op", "redos per step", 100.0, "%"))
COLUMNS_ALL = (("pass@1", "pass@1", 100.0, "%"), ("pass@8", "pass@8", 100.0, "%"),
               ("length", "length", 1.0, ""), ("length_correct", "length, correct", 1.0, ""),
               ("length_incorrect", "length, incorrect", 1.0, ""),
               ("redo_rate", "redos per step", 100.0, "%"))


def table(arms: dict) -> str:
    order = [a for a in (BASE_MODEL, *ARMS) if a in arms]
    n = max((len(arms[a]["seeds"]) for a in order), default=0)
    lines = []
    for title, columns in (("held-out, two-operator problems", COLUMNS_2OP),
                           ("held-out, all problems", COLUMNS_ALL)):
        lines += [f"| {title} ({n} runs per arm) | " + " | ".join(c[1] for c in columns)
                  + " |", "|---" * (len(columns) + 1) + "|"]
        for arm in order:
            label = "base model (before RL)" if arm == BASE_MODEL else f"{arm}: {WHAT[arm]}"
            lines.append(f"| {label} | " + " | ".join(
                _cell(stat(arms, arm, m), s, 1, unit=u) for m, _, s, u in columns) + " |")
        for arm in ARMS[1:]:
            if arm in arms and REFERENCE in arms:
                lines.append(f"| {arm} - grpo (paired, descriptive) | " + " | ".join(
                    _cell(paired(arms, arm, REFERENCE, m), s, 1, True, " pt" if u else "")
                    for m, _, s, u in columns) + " |")
        lines.append("")
    lines += [("| training rollouts (128 per step) | arm | first 10 steps | last 10 steps | "
               "change (paired) | change minus grpo's (descriptive) |"),
              "|---|---|---|---|---|---|"]
    for name in TRAINING:
        scale = 100.0 if name == "pass@1" else 1.0
        for arm in ARMS:
            if arm not in arms:
                continue
            diff = "" if arm == REFERENCE or REFERENCE not in arms else _cell(
                paired(arms, arm, REFERENCE, f"train/{name}_change"), scale, 1, True)
            first, last, change = (stat(arms, arm, f"train/{name}_{when}")
                                   for when in ("first", "last", "change"))
            lines.append(f"| {name} | {arm} | {_cell(first, scale)} | {_cell(last, scale)} | "
                         f"{_cell(change, scale, 1, True)} | {diff} |")
    return "\n".join(lines) + "\n"


def plot(arms: dict, curves: dict, out: str) -> None:
    """lengths.png: the training completions' length (correct, incorrect) per arm, and the
    held-out two-operator lengths' paired differences to grpo."""
    import numpy as np

    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    colors = {"grpo": "C0", "grpo_no_len_norm": "C1", "grpo_no_std": "C2", "dr_grpo": "C3"}
    for ax, name in zip(axes[:2], ("length_correct", "length_incorrect")):
        for arm in ARMS:
            common.band(ax, [[np.nan if r.get(name) is None else r[name] for r in rows]
                             for rows in curves.get(arm, [])], label=arm, color=colors[arm])
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("tokens")
        ax.set_title(f"training rollouts: {name.replace('_', ', ')} (mean, ±1 std)",
                     fontsize=9)
        if ax.lines:
            ax.legend(fontsize=7)
    ax = axes[2]
    variants = [a for a in ARMS[1:] if a in arms and REFERENCE in arms]
    for offset, (metric, marker) in enumerate((("length_correct_2op", "o"),
                                               ("length_incorrect_2op", "s"))):
        stats = [paired(arms, a, REFERENCE, metric) for a in variants]
        means, halves = common.error_bars(stats)
        ax.errorbar(np.arange(len(variants)) + 0.1 * offset, means,
                    yerr=np.nan_to_num(np.asarray(halves, float)), fmt=marker, capsize=4,
                    label=metric.replace("_2op", ""))
    ax.axhline(0.0, color="gray", lw=0.8)
    for edge in (-LENGTH_MARGIN, LENGTH_MARGIN):
        ax.axhline(edge, color="gray", lw=0.5, ls=":")
    ax.set_xticks(np.arange(len(variants)), variants, fontsize=8)
    ax.set_ylabel("minus grpo, same (base, seed) (tokens)")
    ax.set_title("held-out two-operator lengths after RL (95%; dotted: margin)", fontsize=9)
    ax.legend(fontsize=7)
    common.save_figure(fig, out, "lengths.png")


# ---- claims -------------------------------------------------------------------------------

SOURCE = "Liu et al. 2025, arXiv:2503.20783"
# How the length claims' tests could fail here: completions are short and grow only by a redo.
_SMALL = (f"completions are bounded by the {MAX_NEW_TOKENS}-token limit and grow only by a "
          "redo, so 1/|o| weighs a group's shortest and longest completions within a small "
          "factor of each other and the bias it adds is small")
CLAIMS = (
    common.Claim(
        text="for negative advantages, longer responses are penalized less due to their "
             "larger \\|o_i\\|, causing the policy to prefer lengthier responses among "
             "incorrect ones",
        source=f"{SOURCE}, sec. 3.1 (response-level length bias); tested by removing the "
               "1/\\|o_i\\| term alone",
        test=("grpo_no_len_norm", REFERENCE, "length_incorrect_2op"), expect="<",
        margin=LENGTH_MARGIN,
        why=f"{_SMALL}; and the constant length also gives more weight to the longer correct "
            "completions (a redo, which pays), so a policy that redoes more is longer when "
            "wrong too: the incorrect length may stay within the margin of grpo's or rise"),
    common.Claim(
        text="for positive advantages, this bias results in greater gradient updates for "
             "shorter responses, leading the policy to favor brevity in correct answers",
        source=f"{SOURCE}, sec. 3.1 (response-level length bias); tested by removing the "
               "1/\\|o_i\\| term alone",
        test=("grpo_no_len_norm", REFERENCE, "length_correct_2op"), expect=">",
        margin=LENGTH_MARGIN,
        why=f"{_SMALL}; and the constant length also penalises the longer wrong completions "
            "more, so the redo, a habit the correct and the wrong completions share, is "
            "pushed both ways at once: the correct length may move by less than the margin"),
    common.Claim(
        text="the length bias comes from dividing by \\|o_i\\|; the std normalisation causes a "
             "question-level difficulty bias (so removing the std alone leaves the length of "
             "incorrect responses as it is)",
        source=f"{SOURCE}, sec. 3.1 (paraphrase: the attribution of the two biases; the "
               "parenthesis is its consequence, tested here)",
        test=("grpo_no_std", REFERENCE, "length_incorrect_2op"), expect="=",
        margin=LENGTH_MARGIN,
        why="the std scaling weighs the problems a group nearly always or nearly never solves "
            "above the middling ones (Adam absorbs the overall scale, not this reweighting); "
            "if a redo pays more on one kind of problem than on the other, removing the std "
            "changes how strongly RL spreads the redo, and with it the incorrect completions' "
            "length, by more than the margin"),
    common.Claim(
        text="Our unbiased optimizer effectively prevents the model from generating "
             "progressively longer incorrect responses",
        source=f"{SOURCE}, Fig. 1 (right), Dr. GRPO against GRPO",
        test=("dr_grpo", REFERENCE, "length_incorrect_2op"), expect="<",
        margin=LENGTH_MARGIN,
        why=f"Dr. GRPO removes the 1/|o| term, and {_SMALL}; removing it also gives the "
            "longer correct completions (a redo, which pays) more weight, which lengthens "
            "the policy's completions whether right or wrong, and the std term it removes "
            "reweights problems, not lengths: the incorrect length may stay within the "
            "margin of grpo's or rise"),
    common.Claim(
        text="Dr. GRPO, an unbiased optimization method that improves token efficiency while "
             "maintaining reasoning performance",
        source=f"{SOURCE}, abstract (held-out pass@1 after RL, Dr. GRPO against GRPO)",
        test=("dr_grpo", REFERENCE, "pass@1"), expect="=", margin=PASS_MARGIN,
        why="the two arms weigh a batch differently: without the std the problems nearly "
            "always or nearly never solved count less, and with a constant length the longer "
            "completions (a redo, more often right) count more; within the 120 steps either "
            "can change how fast held-out pass@1 rises, by more than the margin"),
)


STUDY = common.Study(
    name="length_bias",
    question="GRPO's two normalisations one at a time (1/|o| length, std scaling; Dr. GRPO "
             "removes both), from a base whose longer traces are more often right: which "
             "lengthens the incorrect completions, and which shortens the correct ones?",
    tiers=tiers.standard(
        full="about 1.5 h on 2 cores, estimated: 24 runs of 120 GRPO "
             "steps at ~3 min each (8 full-size GRPO steps timed at ~0.6 "
             "s per step after ~20 s of compilation, on a CPU shared with "
             "other jobs; the recorded runs took 235-445 s under heavier "
             "sharing), plus two redo_rate-0.3 bases of ~9-18 min when "
             "not built yet (shared with length_growth)",
        mini="about 1 min on 2 cores, measured (45 s of CPU, 1 min 45 s "
             "wall on a CPU loaded by other jobs: 6 toy runs of ~10 s "
             "and a toy base)",
        mini_seeds=(0, 1),
        mini_arms=("grpo", "grpo_no_len_norm", "dr_grpo")),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze, claims=CLAIMS,
)
