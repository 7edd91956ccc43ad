"""How off-policy can GRPO go: rollouts K updates stale, trained with four objectives.

The main job's RL stage (GRPO, accuracy + 0.2 x format reward, lr 2e-4, groups of 8, host
rewards), shortened to 60 steps of 16 prompts, run from the final parameters of a shared base
(the main job's pretraining), then the held-out evaluation on problems fixed across seeds
(task.eval_seed). Update t trains on rollouts sampled by the parameters of update t - K
(rl.max_staleness = K); the arms differ in K and in the objective the update optimises on
them (rl.off_policy_correction). With μ the stale sampler, π_prox the trainer's parameters
when the update starts, π_θ the parameters being optimised, A the group advantage and clip
PPO's clip to [1 - ε, 1 + ε] (ε = 0.2):

* `ppo-clip` (library name `none`): min(r A, clip(r) A) with r = π_θ / μ. PPO's clipped
  ratio taken against the stale sampler, its trust region centred on μ; AReaL's "naive PPO".
* `decoupled`: w · min(r A, clip(r) A) with r = π_θ / π_prox and w = π_prox / μ, untruncated:
  AReaL's decoupled objective (Fu et al. 2025, arXiv:2505.24298), which separates the
  off-policy correction (w) from the trust region (centred on π_prox). It is what the
  source proposes for staleness.
* `tis`: the same with w truncated at 2 (rl.is_cap), truncated importance sampling as Yao et
  al. 2025 ("Your efficient RL framework secretly brings you off-policy RL training") use it
  for the mismatch between a sampler and a trainer that compute different log-probs for the
  same parameters. Here the two agree to float32 rounding, so the arm asks whether the
  truncated weight also serves staleness, which its source does not claim.
* `mis`: the same with tokens whose w leaves [0.5, 2] dropped from the loss (masked
  importance sampling, also proposed for the sampler/trainer mismatch: Liu, Li et al. 2025,
  "When speed kills stability"); off-label here as TIS is.

Arms: K = 0 (on-policy: the reference), K = 2 with ppo-clip and decoupled (slight
staleness, inside the η ≤ 4 AReaL calls moderate), K = 8 with all four objectives (the
largest staleness here). Contrasts, paired by (base, seed): each
arm's pass@1 against K = 0, and K = 8 decoupled against K = 8 ppo-clip.
"""

from __future__ import annotations

import math

from grpo_jax import sweep
from grpo_jax.stats import interval
from grpo_jax.studies import common, tiers
from grpo_jax.studies import summary as summary_lib

FIGURES = ("pass@1", "pass@8", "maj@8", "format_rate")
REFERENCE = "K=0"
# objective (arm name) -> rl.off_policy_correction
OBJECTIVES = {"ppo-clip": "none", "decoupled": "decoupled", "tis": "tis", "mis": "mis"}
GRID = ((2, ("ppo-clip", "decoupled")), (8, ("ppo-clip", "decoupled", "tis", "mis")))
MARGIN = 0.015  # 1.5 points of pass@1: see experiments/off_policy/README.md


def arm_name(staleness: int, objective: str = "ppo-clip") -> str:
    return REFERENCE if staleness == 0 else f"K={staleness},{objective}"


ARMS = (REFERENCE, *(arm_name(k, o) for k, objectives in GRID for o in objectives))


def base_config(tier: str):
    """The main job's pretraining (1500 steps; the smoke preset's 3 at the mini tier)."""
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain"
    return config


def arm_config(tier: str = "full", staleness: int = 0, correction: str = "ppo-clip"):
    """One arm's run: RL from the base (model.init_from, set per base), then the held-out
    evaluation. `correction`: an objective of OBJECTIVES, or the library's name for it
    (`none` is ppo-clip); unused at K = 0, whose config stays the on-policy one
    (distill_vs_rl's teacher is this K = 0 run)."""
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
        library = OBJECTIVES.get(correction, correction)
        if library not in OBJECTIVES.values():
            raise ValueError(f"off_policy: objective {correction!r}; expected one of "
                             f"{', '.join(OBJECTIVES)}")
        config.rl.off_policy_correction = library
    return config


def arm_configs(tier: str) -> dict:
    arms = {REFERENCE: arm_config(tier, 0)}
    for k, objectives in GRID:
        for objective in objectives:
            arms[arm_name(k, objective)] = arm_config(tier, k, objective)
    return arms


def _run_values(record) -> dict:
    """The final held-out figures, the mean sampler / trainer KL over the RL steps and the
    largest importance weight π_prox / μ of the run."""
    values = {k: v for k, v in common.figures(record).items() if k in FIGURES}
    rows = common.training_rows(record)
    if rows:
        values["kl_behaviour"] = sum(r.get("kl_behaviour", math.nan) for r in rows) / len(rows)
        values["is_weight_max"] = max(r.get("is_weight_max", math.nan) for r in rows)
    return values


def _arm_parts(name: str) -> tuple[int, str]:
    if name == REFERENCE:
        return 0, "-"
    k, objective = name.split(",")
    return int(k[2:]), objective


def _order(name: str) -> tuple:
    k, objective = _arm_parts(name)
    return k, list(OBJECTIVES).index(objective) if objective in OBJECTIVES else -1


SPECS = [(name, REFERENCE, "pass@1") for name in ARMS if name != REFERENCE] + [
    (arm_name(8, "decoupled"), arm_name(8, "ppo-clip"), "pass@1")]

CLAIMS = (
    common.Claim(
        "Even slight staleness can significantly degrade final performance",
        "AReaL: Fu et al. 2025, arXiv:2505.24298, algorithm ablation (quoted), of naive PPO, "
        "whose clipped ratio is taken against the stale sampler; tested as: ppo-clip at "
        "K = 2 ends below K = 0 in held-out pass@1",
        (arm_name(2, "ppo-clip"), REFERENCE, "pass@1"), "<", margin=MARGIN,
        why="with one update per batch at lr 2e-4 the trainer may move too little in two "
            "updates for the ratio π_θ/μ to leave the clip range on many tokens; where it "
            "stays inside, ppo-clip's gradient is the importance-weighted on-policy one "
            "(w A ∇log π, w = π_prox/μ) on samples two updates old, and a lag of two of 60 "
            "steps can cost less than the margin"),
    common.Claim(
        "naive PPO fails to match the performance of the synchronous RL oracle (i.e., the "
        "performance when η = 0)",
        "AReaL: Fu et al. 2025, arXiv:2505.24298, algorithm ablation (quoted); tested as: "
        "ppo-clip at K = 8 ends below K = 0 in held-out pass@1",
        (arm_name(8, "ppo-clip"), REFERENCE, "pass@1"), "<", margin=MARGIN,
        why="ppo-clip loses only the tokens on which eight updates moved the trainer more "
            "than ε from the sampler in the direction of their advantage (the clip leaves "
            "them no gradient); with one update per batch at lr 2e-4 they may be few, and "
            "on the rest the arm learns as K = 0 does eight steps behind, a lag that costs "
            "little once K = 0's pass@1 levels off before its 60 steps end"),
    common.Claim(
        "the decoupled PPO objective substantially improves training stability when "
        "handling stale data",
        "AReaL: Fu et al. 2025, arXiv:2505.24298, algorithm ablation (quoted; its table "
        "compares final scores); tested as: at K = 8 the decoupled objective ends above "
        "ppo-clip in held-out pass@1",
        (arm_name(8, "decoupled"), arm_name(8, "ppo-clip"), "pass@1"), ">", margin=MARGIN,
        why="with one update per batch the two objectives give the same gradient "
            "(w A ∇log π, w = π_prox/μ) on every token where ppo-clip's ratio stays inside "
            "the clip, and differ only on the tokens ppo-clip clips: the test fails when "
            "eight updates move few tokens past the clip range, or when decoupled's "
            "untruncated w on those tokens (large where μ made a token rare that the "
            "trainer now favours) adds noise that costs what their gradient gains"),
    common.Claim(
        "When properly constrained, moderate staleness (e.g., η ≤ 4) has minimal impact on "
        "final performance",
        "AReaL: Fu et al. 2025, arXiv:2505.24298, algorithm ablation (quoted), with the "
        "decoupled objective; tested as: decoupled at K = 2 ends within 1.5 points of K = 0 "
        "in held-out pass@1",
        (arm_name(2, "decoupled"), REFERENCE, "pass@1"), "=", margin=MARGIN,
        why="the decoupled update is the on-policy gradient on samples two updates old, "
            "each token weighted by the untruncated w = π_prox/μ: the test fails if the lag "
            "or the spread of the weights (a large w on a token μ made rare) moves the "
            "60-step run's pass@1 by 1.5 points or more either way"),
    common.Claim(
        "the mismatch between the rollout engine and the training engine makes RL "
        "off-policy, and truncated importance sampling corrects it",
        "Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL "
        "training', https://fengyao.notion.site/off-policy-rl (paraphrase); likewise MIS: "
        "Liu, Li et al. 2025, 'When speed kills stability'",
        None,
        untestable="the sampler and the trainer here are one float32 program: their "
                   "log-probs of the sampled tokens agree to float32 rounding "
                   "(logp_diff_max), so there is no mismatch to correct; the K = 8 tis and "
                   "mis arms apply the two weights to staleness instead, which their "
                   "sources do not claim (their pass@1 against K = 0 is in the table)"),
)


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = common.per_seed(runs, _run_values)
    arms = {name: arms[name] for name in sorted(arms, key=_order)}
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=lambda out: plot(arms, runs, out))


def _paired(arms: dict, name: str, metric: str) -> dict:
    """The paired difference `name` - K=0 (`summary.contrasts`: seeds nested in bases), as
    {"n", "diff", "ci95"}; n = 0 when either arm lacks it."""
    if name not in arms or REFERENCE not in arms:
        return {"n": 0, "diff": math.nan, "ci95": [math.nan, math.nan]}
    return summary_lib.contrasts(arms, [(name, REFERENCE, metric)])[0]


def table(arms: dict) -> str:
    """The README's table: per arm the held-out figures (mean ± 95% half-width over its
    (base, seed) runs), the paired difference to K = 0 with its 95% interval (seeds nested
    in bases; pass@8's is descriptive, outside the Holm family), the sampler / trainer KL
    and the largest importance weight."""
    fmt = sweep.format_interval
    lines = [("| K | objective | runs | pass@1 | pass@1 - K=0 (paired) | pass@8 | "
              "pass@8 - K=0 (paired) | mean KL(sampler ‖ trainer) per token | "
              "largest π_prox/μ |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in arms.items():
        k, objective = _arm_parts(name)

        def stat(metric, scale=100.0, digits=1, metrics=entry["metrics"]):
            return fmt(interval([v for v in metrics.get(metric, [])
                                 if v is not None]), scale, digits)

        def diff(metric, name=name):
            return "-" if name == REFERENCE else common.paired_cell(_paired(arms, name, metric))

        lines.append(f"| {k} | {objective} | {len(entry['seeds'])} | {stat('pass@1')} | "
                     f"{diff('pass@1')} | {stat('pass@8')} | {diff('pass@8')} | "
                     f"{'-' if k == 0 else stat('kl_behaviour', 1.0, 4)} | "
                     f"{'-' if k == 0 else stat('is_weight_max', 1.0, 2)} |")
    lines.append("")
    lines.append("pass@1 and pass@8 in %, differences in points; the KL and the weight are "
                 "per run (the mean over its RL steps, the largest of its steps), then "
                 "over runs.")
    return "\n".join(lines) + "\n"


def plot(arms: dict, runs: common.StudyRuns, out: str) -> None:
    """pass_at_1_vs_k.png (the paired difference to K = 0 against K, one line per
    objective) and curves.png (training pass@1 and the sampler / trainer KL)."""
    import numpy as np

    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for index, objective in enumerate(OBJECTIVES):
        points = [(0, {"n": 0, "diff": 0.0, "ci95": [0.0, 0.0]})]
        points += [(_arm_parts(name)[0], _paired(arms, name, "pass@1")) for name in arms
                   if _arm_parts(name)[1] == objective]
        if len(points) == 1:
            continue
        points.sort(key=lambda p: p[0])
        means, halves = common.error_bars([s for _, s in points], 100, key="diff")
        ax.errorbar(np.array([k for k, _ in points]) + 0.1 * (index - 1.5), means,
                    yerr=np.nan_to_num(halves), marker="o", capsize=3, label=objective)
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xlabel("staleness K (updates)")
    ax.set_ylabel("pass@1 minus K = 0, paired (points)")
    ax.set_title("held-out pass@1 vs K: paired difference, 95% interval", fontsize=10)
    ax.legend(title="objective", fontsize=8)
    common.save_figure(fig, out, "pass_at_1_vs_k.png")

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for index, name in enumerate(arms):
        curves = [common.training_rows(r) for r in runs.arm(name) if r.finished]
        for ax, metric in zip(axes, ("pass@1", "kl_behaviour")):
            common.band(ax, [[row.get(metric, np.nan) for row in rows] for rows in curves],
                        label=name, color=plt.cm.tab10(index % 10))
    for ax, title in zip(axes, ("training pass@1", "KL(sampler ‖ trainer), k3")):
        ax.set_title(title)
        ax.set_xlabel("RL step")
    axes[0].legend(fontsize=6)
    common.save_figure(fig, out, "curves.png")


STUDY = common.Study(
    name="off_policy",
    question="GRPO on rollouts K updates stale (K = 2, 8), trained with PPO's clipped ratio "
             "against the stale sampler, AReaL's decoupled objective, or the TIS / MIS "
             "weights, paired by (base, seed) against on-policy K = 0",
    tiers=tiers.standard(
        full="about 55 min on 2 cores (estimated: 7 arms x 2 bases x 3 "
             "seeds = 42 runs at the 55-100 s per run recorded for the "
             "former 39; plus 2 x 9 min for the bases, shared with "
             "cold_start, kl_beta and distill_vs_rl, when not built yet)",
        mini="about 20 s of CPU on 2 cores, measured (20-22 s for its test alone, which "
             "compiles every program itself): a toy base, one seed of 3 toy runs",
        mini_arms=(REFERENCE, arm_name(2, "ppo-clip"),
                   arm_name(2, "decoupled"))),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze, claims=CLAIMS,
)
