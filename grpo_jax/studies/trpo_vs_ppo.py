"""TRPO against PPO at the same samples: held-out accuracy, the update's wall time, and PPO's
learning rate at 1x, 10x and 100x.

From the main base (configs/default.py's pretraining, 1500 steps; the full tier's base seeds,
`tiers.FULL_BASES`), arms that each sample 80 batches of 256 completions (20,480) on the host
loop:

* `TRPO`: one natural-gradient step per batch (conjugate gradient on Fisher-vector
  products, a line search under a mean KL of 0.01), on 32 prompts x 8 completions with
  group-normalised advantages (configs/trpo.py's stage), the Fisher-vector products on a
  fifth of the rows (`FISHER_FRACTION`) as OpenAI Baselines' TRPO takes every fifth sample
  (`trpo_mpi`, after Schulman's thesis): on every row a step costs 3x as much here;
* `PPO lr 2e-4`, `PPO lr 2e-3`, `PPO lr 2e-2`: configs/ppo.py's stage (critic, GAE, 2 epochs
  x 2 minibatches of the clipped surrogate) on 256 prompts x 1 completion, at its learning
  rate and 10x and 100x it.

Measured per run: held-out pass@1, the largest per-step KL between consecutive policies over
training (`kl_step`: TRPO's accepted step; PPO's between the batch's sampler and the updated
policy), and the update's seconds per step (after the first, compiling, step).

The claims are the abstract's own sentences (Schulman et al. 2017). How PPO fares at 10x and
100x its learning rate is this study's own question, not a claim of the paper (its abstract
does not speak of stability): it is a contrast (`PPO lr 2e-3` - `PPO lr 2e-4`), not a claim.
"""

from __future__ import annotations

import math

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm

TRPO = "TRPO"
FISHER_FRACTION = 0.2
PPO_LRS = {"PPO lr 2e-4": 2e-4, "PPO lr 2e-3": 2e-3, "PPO lr 2e-2": 2e-2}
PPO = "PPO lr 2e-4"
ARMS = (TRPO, *PPO_LRS)
METRICS = ("pass@1", "format_rate")
PASS_MARGIN = 0.03
SPECS = [(PPO, TRPO, "update_time_s"), (PPO, TRPO, "pass@1"), ("PPO lr 2e-3", PPO, "pass@1"),
         ("PPO lr 2e-2", PPO, "pass@1"), (PPO, TRPO, "kl_step_max"), (TRPO, "base", "pass@1")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from, evaluated before and after: the TRPO
    or PPO stage (`config_presets.with_trpo` / `with_ppo`) on the main job's samples."""
    from grpo_jax import config_presets

    config = common.main_arm(tier, "eval_base,rl,eval_final")
    if arm == TRPO:
        return config_presets.with_trpo(config, fisher_fraction=FISHER_FRACTION)
    return config_presets.with_ppo(config, lr=PPO_LRS[arm])


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def _values(record) -> dict:
    values = common.eval_values(record, METRICS)
    rows = common.training_rows(record)
    kl = [r["kl_step"] for r in rows if r.get("kl_step") is not None]
    values["kl_step_max"] = max(kl) if kl and all(math.isfinite(v) for v in kl) else None
    values["update_time_s"] = common.training_mean(rows, "update_time_s", skip=1)
    return values


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    common.add_base_arm(arms, TRPO, METRICS)
    panels = (("reward_mean", "training reward"), ("kl_step", "KL between consecutive policies"))
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.curve_plots(runs, ARMS, panels))


def table(arms: dict) -> str:
    return tables.arm_table(
        arms, ("base", *ARMS),
        ("pass@1", "format rate", "largest per-step KL", "update s/step"),
        tables.metric_row("pass@1", "format_rate", ("kl_step_max", 1.0, 4),
                          ("update_time_s", 1.0, 3)),
        "pass@1 and format in %, KL in nats per token, seconds per step; mean ± 95% "
        "half-width over (base, seed) runs.")


SOURCE = ("Schulman et al. 2017, \"Proximal Policy Optimization Algorithms\", "
          "arXiv:1707.06347, abstract (quotation)")
CLAIMS = (
    common.Claim("Our experiments test PPO on a collection of benchmark tasks [...] and we show "
                 "that PPO outperforms other online policy gradient methods, and overall "
                 "strikes a favorable balance between sample complexity, simplicity, and "
                 "wall-time", SOURCE + "; the abstract's comparison is with other online "
                 "policy gradient methods; tested on its wall-time against TRPO: the "
                 "update's seconds per step, PPO below TRPO",
                 (PPO, TRPO, "update_time_s"), "<", margin=0.75,
                 can_fail="fails unless PPO's update (four Adam steps per batch and a "
                          "critic) takes at least 0.75 s less per step than TRPO's (one "
                          "natural step: 10 conjugate-gradient iterations, the Fisher-vector "
                          "products on a fifth of the rows, and a line search), Holm p < 0.05, "
                          "no base the other way; the products on a fifth of the rows make TRPO's step "
                          "cheaper than on every row",
                 note=common.POST_HOC_MARGIN + " (a tenth of TRPO's update time in the "
                 "first runs, whose Fisher-vector products used every row: a larger share "
                 "of the update time of this design's TRPO)"),
    common.Claim("The new methods, which we call proximal policy optimization (PPO), have some "
                 "of the benefits of trust region policy optimization (TRPO), but they are "
                 "much simpler to implement, more general, and have better sample complexity "
                 "(empirically)", SOURCE + "; tested on its last clause: held-out pass@1 of "
                 "PPO above TRPO's at the same 20,480 samples",
                 (PPO, TRPO, "pass@1"), ">", margin=PASS_MARGIN,
                 can_fail="fails unless PPO's held-out pass@1 ends at least 3 points above "
                          "TRPO's after the same 20,480 samples, Holm p < 0.05, no base the "
                          "other way; TRPO's KL bound (0.01 per batch) lets it move the policy "
                          "as far per batch as PPO's clip does"),
)

STUDY = common.Study(
    name="trpo_vs_ppo",
    question="does PPO beat TRPO in held-out pass@1 and in the update's wall time at the same "
             "20,480 samples, and how do its learning rates 1x to 100x fare, paired by seed?",
    tiers=tiers.standard(
        full="about 4 hours on 2 cores (measured beside another study "
             "process: 11 min a TRPO run, 9-10.5 min a PPO run; 24 runs, "
             "PPO lr 2e-4's six shared with ppo_vs_grpo)",
        mini="seconds on 2 cores: one toy base, one seed, "
             "a subset of the arms",
        mini_arms=(TRPO, PPO)),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze, claims=CLAIMS,
)
