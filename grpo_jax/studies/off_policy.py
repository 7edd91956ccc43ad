"""How off-policy can GRPO go: rollouts up to K updates stale, with and without corrections.

The main job's RL stage (GRPO, accuracy + 0.2 x format reward, lr 2e-4, groups of 8, host
rewards), shortened to 60 steps of 16 prompts, run from the final parameters of a shared base
(the main job's pretraining), then the held-out evaluation on problems fixed across seeds
(task.eval_seed). Arms: K = 0, and K in {1, 2, 4, 8} x correction in {none, tis, mis}
(rl.max_staleness, rl.off_policy_correction); each against K = 0, paired by seed.
"""

from __future__ import annotations

import math

from grpo_jax import sweep
from grpo_jax.studies import common

FIGURES = ("pass@1", "pass@8", "maj@8", "format_rate")
CONTRASTED = ("pass@1", "pass@8")  # the README table's paired columns: the Holm family
STALENESS = (1, 2, 4, 8)
CORRECTIONS = ("none", "tis", "mis")
REFERENCE = "K=0"


ARMS = (REFERENCE, *(f"K={k},{c}" for k in STALENESS for c in CORRECTIONS))




def base_config(tier: str):
    """The main job's pretraining (1500 steps; the smoke preset's 3 at the mini tier)."""
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain"
    return config


def arm_config(tier: str = "full", staleness: int = 0, correction: str = "none"):
    """One arm's run: RL from the base (model.init_from, set per base), then the held-out
    evaluation."""
    config = common.main_job(common.preset(tier))
    config.stages = "rl,eval_final"
    del config.pretrain, config.eval_base
    if tier == "full":
        config.rl.steps = 60
        config.rl.num_prompts = 16
    else:
        config.rl.steps = 3
    config.model.init_from = ""  # the base's workdir, set by the study per base
    config.rl.fused_steps = 0  # stale rollouts run in the host loop
    config.rl.max_staleness = staleness
    if staleness:
        config.rl.off_policy_correction = correction
    return config


def arm_name(staleness: int, correction: str) -> str:
    return REFERENCE if staleness == 0 else f"K={staleness},{correction}"


def arm_configs(tier: str) -> dict:
    arms = {REFERENCE: arm_config(tier, 0)}
    for k in STALENESS:
        for correction in CORRECTIONS:
            arms[arm_name(k, correction)] = arm_config(tier, k, correction)
    return arms


def _run_values(record) -> dict:
    """The final held-out figures, the mean sampler / trainer KL over the RL steps and the
    largest importance weight of the run."""
    values = {k: v for k, v in common.figures(record).items() if k in FIGURES}
    rows = common.training_rows(record)
    if rows:
        values["kl_behaviour"] = sum(r.get("kl_behaviour", math.nan) for r in rows) / len(rows)
        values["is_weight_max"] = max(r.get("is_weight_max", math.nan) for r in rows)
    return values


def _arm_parts(name: str) -> tuple[int, str]:
    if name == REFERENCE:
        return 0, "-"
    k, correction = name.split(",")
    return int(k[2:]), correction


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = common.per_seed(runs, _run_values)
    order = sorted(arms, key=_arm_parts)
    arms = {name: arms[name] for name in order}
    specs = [(name, REFERENCE, metric) for metric in CONTRASTED for name in order
             if name != REFERENCE]
    return common.Analysis(arms=arms, specs=specs, table=table(arms),
                           plots=lambda out: plot(arms, runs, out))


def _paired(arms: dict, name: str, metric: str) -> dict:
    """The paired interval of `name` - K=0 over the (base, seed) pairs both have."""
    a, b = arms[name], arms.get(REFERENCE)
    if b is None or metric not in a["metrics"] or metric not in b["metrics"]:
        return {"n": 0, "mean": math.nan, "ci95": [math.nan, math.nan]}
    ref = dict(zip(zip(b["bases"], b["seeds"]), b["metrics"][metric]))
    keys = list(zip(a["bases"], a["seeds"]))
    return sweep.paired_interval(a["metrics"][metric], [ref.get(k) for k in keys])


def table(arms: dict) -> str:
    """The README's table: per arm the held-out figures (mean ± 95% half-width over seeds),
    the paired difference to K = 0, the sampler / trainer KL and the largest IS weight."""
    fmt = sweep.format_interval
    lines = [("| K | correction | seeds | pass@1 | pass@1 - K=0 (paired) | pass@8 | "
              "pass@8 - K=0 (paired) | mean KL(sampler ‖ trainer) per token | "
              "largest IS weight |"),
             "|---|---|---|---|---|---|---|---|---|"]

    def percent(text):
        return text if text == "-" else text + "%"

    for name, entry in arms.items():
        k, correction = _arm_parts(name)

        def stat(metric, scale=100.0, digits=1, metrics=entry["metrics"]):
            return fmt(sweep.interval(metrics.get(metric, [])), scale, digits)

        def diff(metric, name=name):
            return "-" if name == REFERENCE else percent(fmt(_paired(arms, name, metric),
                                                             signed=True))

        lines.append(f"| {k} | {correction} | {len(entry['seeds'])} | "
                     f"{percent(stat('pass@1'))} | {diff('pass@1')} | "
                     f"{percent(stat('pass@8'))} | {diff('pass@8')} | "
                     f"{'-' if k == 0 else stat('kl_behaviour', 1.0, 4)} | "
                     f"{'-' if k == 0 else stat('is_weight_max', 1.0, 2)} |")
    return "\n".join(lines) + "\n"


def plot(arms: dict, runs: common.StudyRuns, out: str) -> None:
    """pass_at_1_vs_k.png (the paired difference to K = 0 against K, one line per
    correction) and curves.png (training pass@1 and the sampler / trainer KL)."""
    import numpy as np

    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for index, correction in enumerate(CORRECTIONS):
        points = [(0, {"mean": 0.0, "n": 0, "ci95": [0.0, 0.0]})]
        points += [(_arm_parts(name)[0], _paired(arms, name, "pass@1")) for name in arms
                   if _arm_parts(name)[1] == correction]
        if len(points) == 1:
            continue
        points.sort(key=lambda p: p[0])
        means = np.array([s["mean"] for _, s in points]) * 100
        halves = np.array([(s["ci95"][1] - s["ci95"][0]) / 2 if s["n"] > 1 else 0
                           for _, s in points]) * 100
        ax.errorbar(np.array([k for k, _ in points]) + 0.08 * (index - 1), means, yerr=halves,
                    marker="o", capsize=3, label=correction)
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xlabel("max staleness K (updates)")
    ax.set_ylabel("pass@1 minus K = 0, same seed (points)")
    ax.set_title("held-out pass@1 vs K: paired difference, 95% interval", fontsize=10)
    ax.legend(title="correction", fontsize=8)
    common.save_figure(fig, out, "pass_at_1_vs_k.png")

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for index, name in enumerate(arms):
        curves = [common.training_rows(r) for r in runs.arm(name) if r.finished]
        for ax, metric in zip(axes, ("pass@1", "kl_behaviour")):
            common.band(ax, [[row.get(metric, np.nan) for row in rows] for rows in curves],
                        label=name, color=plt.cm.tab20(index % 20))
    for ax, title in zip(axes, ("training pass@1", "KL(sampler ‖ trainer), k3")):
        ax.set_title(title)
        ax.set_xlabel("RL step")
    axes[0].legend(fontsize=6)
    common.save_figure(fig, out, "curves.png")


STUDY = common.Study(
    name="off_policy",
    question="GRPO on rollouts up to K in {1, 2, 4, 8} updates stale, no correction / TIS / "
             "MIS, paired by seed against K = 0",
    tiers={
        "full": common.Tier(bases=(0,), seeds=(0, 1, 2),
                            cost="about 60 min on 2 cores (39 runs of 55-100 s, plus the "
                                 "9-min base when not built yet; measured)"),
        "mini": common.Tier(bases=(0,), seeds=(0, 1), arms=(REFERENCE, "K=2,none", "K=2,tis"),
                            cost="about 2-3 min on 2 cores (6 toy runs and a toy base)"),
    },
    arms=ARMS,
    base_config=base_config,
    arm_configs=arm_configs,
    analyze=analyze,
)
