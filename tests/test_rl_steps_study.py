"""rl_steps: its per-policy figures against hand-computed values, its long run's config, and
the boundary claims' ceiling (the headroom rule) on constructed arms."""

import pytest

from grpo_jax.studies import rl_steps
from grpo_jax.studies import summary as summary_lib


def _problem(samples, correct, formatted, tokens):
    return {"samples": samples, "correct": correct, "formatted": formatted, "tokens": tokens}


def test_figures_against_hand_computed_values():
    mine = [_problem(4, 2, 4, 40), _problem(4, 0, 2, 20)]
    reference = [_problem(4, 0, 4, 30), _problem(4, 0, 4, 30)]
    out = rl_steps.figures(mine, reference, ks=(1, 2, 4, 8))
    # problem 1: pass@1 2/4, pass@2 1 - C(2,2)/C(4,2) = 5/6, pass@4 1; problem 2: all 0
    assert out["pass@1"] == pytest.approx(0.25)
    assert out["pass@2"] == pytest.approx(5 / 12)
    assert out["pass@4"] == pytest.approx(0.5)
    assert "pass@8" not in out  # k above the samples drawn
    assert out["never_solved_rate"] == pytest.approx(0.5)
    assert out["format_rate"] == pytest.approx(6 / 8)
    assert out["mean_length"] == pytest.approx(60 / 8)
    assert out["only_solves_rate"] == pytest.approx(0.5)  # problem 1: the reference never
    reference[0]["correct"] = 1
    assert rl_steps.figures(mine, reference, ks=(1,))["only_solves_rate"] == 0.0
    assert "only_solves_rate" not in rl_steps.figures(mine, None, ks=(1,))


@pytest.mark.parametrize("tier", ["full", "mini"])
def test_the_run_is_the_main_jobs_rl_stage_at_factor_times_its_steps(tier):
    from grpo_jax.studies import common

    main = common.main_arm(tier, "rl")
    config = rl_steps.arm_config(tier)
    assert config.stages == "rl"
    assert config.rl.steps == rl_steps.FACTOR * main.rl.steps
    assert config.rl.checkpoint_every == main.rl.steps  # a checkpoint at the main job's count
    assert config.checkpoint.max_to_keep >= rl_steps.FACTOR  # every checkpoint kept
    if config.rl.fused_steps:
        assert config.rl.checkpoint_every % config.rl.fused_steps == 0
    for field in ("algorithm", "num_prompts", "group_size", "lr", "max_new_tokens"):
        assert config.rl[field] == main.rl[field]
    assert rl_steps.KS[-1] == rl_steps._sizes(tier)["samples"] == rl_steps.K


def _arms(base_pass, base_never, last_pass, last_only, redraw_only):
    def arm(**metrics):
        return {"seeds": [0, 1, 0, 1], "bases": ["a", "a", "b", "b"],
                "metrics": {k: list(v) for k, v in metrics.items()}}

    k = f"pass@{rl_steps.K}"
    return {rl_steps.BASE: arm(**{k: base_pass, "never_solved_rate": base_never,
                                  "pass@1": [0.3] * 4}),
            rl_steps.REDRAW: arm(only_solves_rate=redraw_only),
            rl_steps.MAIN: arm(**{k: base_pass, "pass@1": [0.5] * 4}),
            rl_steps.LAST: arm(**{k: last_pass, "only_solves_rate": last_only,
                                  "pass@1": [0.6] * 4})}


def _verdicts(arms):
    summary = {"arms": arms, "contrasts": summary_lib.contrasts(arms, rl_steps.SPECS)}
    return {(v["a"], v["b"], v["metric"]): v
            for v in summary_lib.verdicts(summary, rl_steps.CLAIMS) if v["a"]}


def test_the_boundary_claims_are_not_testable_at_the_ceiling():
    k = f"pass@{rl_steps.K}"
    # the base's pass@K within 1 point of 1 and 1% of problems unsolved: below the margin
    verdicts = _verdicts(_arms([0.99] * 4, [0.01] * 4, [1.0] * 4, [0.01] * 4, [0.0] * 4))
    for test in ((rl_steps.LAST, rl_steps.BASE, k), (rl_steps.LAST, rl_steps.MAIN, k),
                 (rl_steps.LAST, rl_steps.REDRAW, "only_solves_rate")):
        assert verdicts[test]["verdict"] == "not testable here"
        assert verdicts[test]["headroom"] == pytest.approx(0.01)
    # pass@1 has no ceiling claim: decided by the rule
    assert verdicts[(rl_steps.LAST, rl_steps.MAIN, "pass@1")]["verdict"] != "not testable here"


def test_the_boundary_claims_are_decided_below_the_ceiling():
    k = f"pass@{rl_steps.K}"
    verdicts = _verdicts(_arms([0.90, 0.91, 0.89, 0.90], [0.10] * 4,
                               [0.95, 0.97, 0.96, 0.95], [0.06, 0.05, 0.07, 0.06],
                               [0.01, 0.0, 0.01, 0.02]))
    assert verdicts[(rl_steps.LAST, rl_steps.BASE, k)]["verdict"] == "reproduced"
    assert verdicts[(rl_steps.LAST, rl_steps.REDRAW, "only_solves_rate")]["verdict"] \
        == "reproduced"
    assert verdicts[(rl_steps.LAST, rl_steps.BASE, k)]["headroom"] == pytest.approx(0.1)
