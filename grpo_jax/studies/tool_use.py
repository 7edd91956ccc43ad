"""Does GRPO on multi-turn episodes teach a tiny model to use a calculator?

configs/tools.py's job (`config_presets.tool_job`) from a shared pretrained base (its
`pretrain` stage): evaluate with and without the tool, 60 GRPO steps on episodes with the
calculator, evaluate with and without the tool again. The held-out problems are fixed
across seeds (task.eval_seed); the seed sets the RL prompt order and every sampling key, so
the four evaluations of a seed are paired. The summary's arms are the four held-out
conditions (each run's four eval stages); the contrasts are within a seed.
"""

from __future__ import annotations

import math

from grpo_jax import sweep
from grpo_jax.studies import common

STAGES = {"eval_base": "before, with the tool", "eval_base_no_tool": "before, without",
          "eval_final": "after GRPO, with the tool",
          "eval_final_no_tool": "after GRPO, without"}
FIGURES = ("pass@1", "pass@8", "correct_call_rate", "tool_call_rate", "tool_errors",
           "format_rate", "mean_length")
# (name, stage a, stage b): a minus b within a seed
CONTRASTS = (("GRPO, with the tool", "eval_final", "eval_base"),
             ("GRPO, without the tool", "eval_final_no_tool", "eval_base_no_tool"),
             ("the tool, before GRPO", "eval_base", "eval_base_no_tool"),
             ("the tool, after GRPO", "eval_final", "eval_final_no_tool"))
CONTRASTED = ("pass@1", "pass@8", "correct_call_rate")
CURVES = ("tool_call_rate", "reward/correct_call", "pass@1", "turns", "tool_errors")
RUN = "grpo"  # the one arm that runs: its four eval stages are the summary's arms


def base_config(tier: str):
    """configs/tools.py's pretraining (2500 steps; the smoke preset's 60 at the mini tier)."""
    config = common.tool_job(common.preset(tier))
    config.stages = "pretrain"
    return config


def arm_config(tier: str = "full"):
    config = common.tool_job(common.preset(tier))
    config.stages = "eval_base,eval_base_no_tool,rl,eval_final,eval_final_no_tool"
    del config.pretrain
    config.model.init_from = ""  # the base's workdir, set by the study per base
    return config


def arm_configs(tier: str) -> dict:
    return {RUN: arm_config(tier)}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    finished = [r for r in runs.arm(RUN) if r.finished]
    stage_rows = {(r.base, r.seed): common.last_stage_rows(r) for r in finished}
    arms = {}
    for stage, label in STAGES.items():
        metrics = {name: [stage_rows[(r.base, r.seed)].get(stage, {}).get(name)
                          for r in finished] for name in FIGURES}
        arms[label] = {"seeds": [r.seed for r in finished], "bases": [r.base for r in finished],
                       "metrics": {k: v for k, v in metrics.items()
                                   if any(x is not None for x in v)}}
    specs = [(STAGES[a], STAGES[b], metric) for metric in CONTRASTED for _, a, b in CONTRASTS]
    rl_rows = [[row for row in common.training_rows(r) if row.get("stage") == "rl"]
               or common.training_rows(r) for r in finished]
    training = {}
    for name in CURVES:
        first = [rows[0].get(name, math.nan) for rows in rl_rows if rows]
        last = [sum(r.get(name, math.nan) for r in rows[-10:]) / len(rows[-10:])
                for rows in rl_rows if rows]
        training[name] = {"first_step": first, "last_10_steps": last}
    return common.Analysis(arms=arms, specs=specs, table=table(arms, training),
                           extra={"training": training},
                           plots=lambda out: plot(arms, rl_rows, out))


def table(arms: dict, training: dict) -> str:
    fmt = sweep.format_interval
    lines = [("| held-out | pass@1 | pass@8 | correct tool use | episodes with a call | "
              "tool errors per episode |"), "|---|---|---|---|---|---|"]
    for label in STAGES.values():

        def cell(name, scale=100.0, unit="%", metrics=arms[label]["metrics"]):
            return fmt(sweep.interval(metrics[name]), scale) + unit if name in metrics else "-"

        lines.append(f"| {label} | {cell('pass@1')} | {cell('pass@8')} | "
                     f"{cell('correct_call_rate')} | {cell('tool_call_rate')} | "
                     f"{cell('tool_errors', 1.0, '')} |")
    lines += ["", ("| during GRPO (training rollouts) | first step | last 10 steps | "
                   "change (paired) |"), "|---|---|---|---|"]
    for name, values in training.items():
        scale = 1.0 if name in ("turns", "tool_errors") else 100.0
        first, last = values["first_step"], values["last_10_steps"]
        lines.append(f"| {name} | {fmt(sweep.interval(first), scale, 2)} | "
                     f"{fmt(sweep.interval(last), scale, 2)} | "
                     f"{fmt(sweep.paired_interval(last, first), scale, 2, signed=True)} |")
    return "\n".join(lines) + "\n"


def plot(arms: dict, rl_rows: list, out: str) -> None:
    """pass_at_1.png (the four held-out conditions) and curves.png (tool use and training
    pass@1 over the GRPO steps, mean ± 1 std over seeds)."""
    import numpy as np

    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    labels, means, halves = [], [], []
    for label in STAGES.values():
        stats = sweep.interval(arms[label]["metrics"].get("pass@1", []))
        labels.append(label.replace(", ", "\n"))
        means.append(stats["mean"] * 100)
        halves.append((stats["ci95"][1] - stats["ci95"][0]) / 2 * 100 if stats["n"] > 1 else 0)
    ax.bar(range(4), means, yerr=halves, capsize=4, color=["C0", "C7", "C2", "C7"])
    ax.set_xticks(range(4), labels, fontsize=8)
    ax.set_ylabel("held-out pass@1 (%)")
    ax.set_title("pass@1 with and without the calculator, 95% interval over seeds",
                 fontsize=9)
    common.save_figure(fig, out, "pass_at_1.png")

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, names in zip(axes, (("tool_call_rate", "reward/correct_call"), ("pass@1",),
                                ("turns", "tool_errors"))):
        for index, name in enumerate(names):
            common.band(ax, [[r.get(name, np.nan) for r in rows] for rows in rl_rows],
                        label=name, color=f"C{index}")
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=7)
    axes[0].set_title("tool use (training rollouts)", fontsize=9)
    axes[1].set_title("training pass@1", fontsize=9)
    axes[2].set_title("turns and tool errors per episode", fontsize=9)
    common.save_figure(fig, out, "curves.png")


STUDY = common.Study(
    name="tool_use",
    question="does GRPO on multi-turn episodes teach a tiny model to use a calculator "
             "(3-4 digit + - *, paired by seed)?",
    tiers={
        "full": common.Tier(bases=(0,), seeds=(0, 1, 2),
                            cost="about 10 min on 2 cores, 21 min with the base (recorded: "
                                 "the base 660 s, each seed 131-240 s)"),
        "mini": common.Tier(bases=(0,), seeds=(0, 1),
                            cost="about 1-2 min on 2 cores (2 toy runs and a 60-step toy base)"),
    },
    arms=(RUN,),
    base_config=base_config,
    arm_configs=arm_configs,
    analyze=analyze,
)
