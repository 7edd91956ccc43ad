"""Designs where a study's mechanism can act: kl_beta's per-(base, seed) measurement keys,
trpo_vs_ppo's claims as the abstract states them, one_shot's selection of its one problem by
the historical variance score, expert_iteration's recipe chosen on a validation split and its
RL - SFT contrast. No runs here: configs, claims and the selection rules on constructed
inputs (the mini tiers run in tests/test_studies.py)."""

from __future__ import annotations

import json
import re

import pytest

from grpo_jax.studies import kl_beta, trpo_vs_ppo

# Schulman et al. 2017, arXiv:1707.06347, the abstract as published.
PPO_ABSTRACT = (
    "We propose a new family of policy gradient methods for reinforcement learning, which "
    "alternate between sampling data through interaction with the environment, and "
    "optimizing a \"surrogate\" objective function using stochastic gradient ascent. Whereas "
    "standard policy gradient methods perform one gradient update per data sample, we propose "
    "a novel objective function that enables multiple epochs of minibatch updates. The new "
    "methods, which we call proximal policy optimization (PPO), have some of the benefits of "
    "trust region policy optimization (TRPO), but they are much simpler to implement, more "
    "general, and have better sample complexity (empirically). Our experiments test PPO on a "
    "collection of benchmark tasks, including simulated robotic locomotion and Atari game "
    "playing, and we show that PPO outperforms other online policy gradient methods, and "
    "overall strikes a favorable balance between sample complexity, simplicity, and "
    "wall-time.")


# ---- kl_beta ----------------------------------------------------------------------------------

def test_kl_measurement_keys_are_paired_within_a_base_seed_and_distinct_across():
    full = [(base, seed) for base in (0, 1, 2, 3) for seed in (0, 1)]
    keys = [kl_beta.measurement_seed(b, s) for b, s in full]
    base_keys = [kl_beta.measurement_seed(b) for b in (0, 1, 2, 3)]
    assert len(set(keys + base_keys)) == len(keys) + len(base_keys)
    assert keys == [kl_beta.measurement_seed(b, s) for b, s in full]  # a pure function
    assert all(0 <= k < 2 ** 31 for k in keys + base_keys)
    assert kl_beta.KEY not in keys  # not the one key every policy shared


def test_a_kl_json_made_with_another_key_is_measured_again(tmp_path):
    path = str(tmp_path / "kl.json")
    assert not kl_beta._measured_with(path, 7)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"key": kl_beta.KEY, "exact_kl": 0.04}, f)
    assert not kl_beta._measured_with(path, kl_beta.measurement_seed(0, 0))
    assert kl_beta._measured_with(path, kl_beta.KEY)


# ---- trpo_vs_ppo ------------------------------------------------------------------------------

def test_trpo_vs_ppo_claims_quote_the_abstract():
    assert trpo_vs_ppo.CLAIMS
    for claim in trpo_vs_ppo.CLAIMS:
        assert "abstract (quotation)" in claim.source
        for part in claim.text.split("[...]"):
            assert part.strip() in PPO_ABSTRACT, part
        assert claim.margin and claim.can_fail
    assert not any("stabil" in c.text.lower() for c in trpo_vs_ppo.CLAIMS)
    # the learning-rate question stays a contrast of the study, without a verdict
    assert ("PPO lr 2e-3", trpo_vs_ppo.PPO, "pass@1") in trpo_vs_ppo.SPECS


# ---- one_shot ---------------------------------------------------------------------------------

def test_historical_variance_score_by_hand():
    from grpo_jax.studies import one_shot

    def rows(prompt, step_acc):
        return [{"step": step, "prompt": prompt, "accuracy": a} for step, a in step_acc]

    # two steps an epoch, three epochs (steps 11-16: positions, not numbers, make epochs)
    data = (rows("A", [(11, 0), (11, 0), (13, 1), (13, 0), (15, 1), (16, 1)])
            + rows("B", [(12, 1), (14, 1), (16, 1)])
            + rows("C", [(12, 1), (14, 0)]))
    scores, curves = one_shot.historical_variance(data, ["A", "B", "C", "D"], 2)
    assert curves == [[0.0, 0.5, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0], []]
    assert scores == pytest.approx([1 / 6, 0.0, 0.25, 0.0])
    assert one_shot.top(scores) == 2
    assert one_shot.top([0.1, 0.3, 0.3]) == 1  # the first on a tie


def test_train_pick_narrows_the_training_problems_of_train_seed():
    from grpo_jax.runner.inputs import build_task, train_examples
    from grpo_jax.studies import one_shot

    config = one_shot.arm_config(one_shot.ONE, "mini")
    config.seed = 3
    config.task.train_pick = (5,)
    task = build_task(config)
    pool = task.examples("train", config.task.train_size, seed=one_shot.POOL_SEED)
    assert train_examples(config, task) == [pool[5]]
    config.seed = 4  # the arm's seed does not move the pool
    assert train_examples(config, task) == [pool[5]]
    del config.task.train_pick, config.task.train_seed
    assert train_examples(config, task) == task.examples("train", config.task.train_size,
                                                         seed=4)


@pytest.mark.parametrize("pick", [(8,), (1, 1), (), (-1,), "3"])
def test_a_bad_train_pick_is_one_line_naming_the_field(pick):
    from configs import default as default_config
    from grpo_jax.runner import ConfigError, validate
    from grpo_jax.stages import KINDS

    config = default_config.get_config("smoke")
    config.task.train_size = 8
    config.task.train_pick = pick
    with pytest.raises(ConfigError, match=r"^task\.train_pick: expected distinct indices in "
                                          r"\[0, train_size = 8\)"):
        validate(config, KINDS)


def test_rl_samples_logged_zero_is_one_line_naming_the_field():
    from configs import default as default_config
    from grpo_jax.runner import ConfigError, validate
    from grpo_jax.stages import KINDS

    config = default_config.get_config("smoke")
    config.rl_samples_logged = 0
    with pytest.raises(ConfigError, match=r"^config\.rl_samples_logged: expected -1"):
        validate(config, KINDS)


# ---- expert_iteration -------------------------------------------------------------------------

def test_the_recipe_is_chosen_by_its_mean_validation_pass_at_1():
    from grpo_jax.studies import expert_iteration as ei

    names = list(ei.EI_SETTINGS)
    validation = {names[0]: [0.40, 0.50], names[1]: [0.60, None, 0.50],
                  names[2]: [0.55, 0.55], names[3]: []}
    assert ei.validation_means(validation) == pytest.approx(
        {names[0]: 0.45, names[1]: 0.55, names[2]: 0.55})
    assert ei.choose(validation) == names[1]  # 0.55 twice: the first in the grid's order
    assert ei.choose({names[3]: [None]}) is None


def test_the_validation_split_is_outside_the_held_out_problems():
    from grpo_jax.runner.inputs import build_task
    from grpo_jax.studies import expert_iteration as ei

    config = ei.arm_config(ei.GRPO, "full")
    task = build_task(config)
    held = task.examples("test", config.task.eval_size, seed=config.task.eval_seed)
    chosen = ei.validation_problems(task, config, 128)
    assert len({ex.id for ex in chosen}) == 128
    assert not {ex.id for ex in chosen} & {ex.id for ex in held}
    assert not {ex.id for ex in chosen} & {ex.id for ex in task.examples("train", 2000, seed=0)}
    assert [ex.id for ex in ei.validation_problems(task, config, 8)] == [
        ex.id for ex in chosen[:8]]  # the first of one fixed order


def test_the_published_recipe_keeps_its_config_and_the_grid_differs_only_in_lr_and_steps():
    from grpo_jax.stages import default_section
    from grpo_jax.studies import expert_iteration as ei

    configs = ei.arm_configs("full")
    published = configs["EI lr 1e-3 x 15"]
    former = default_section("rejection_sft")  # the former arm: the stage's default lr
    former.update(num_problems=240, num_samples=8, steps=15, batch_size=32,
                  max_new_tokens=published.eval_final.max_new_tokens)
    assert published.ei1.to_dict() == former.to_dict()
    for name, (lr, steps) in ei.EI_SETTINGS.items():
        for stage in ("ei1", "ei2", "ei3", "ei4"):
            section = configs[name][stage]
            assert (section.lr, section.steps) == (lr, steps)
            assert {k: v for k, v in section.items() if k not in ("lr", "steps")} == {
                k: v for k, v in former.items() if k not in ("lr", "steps")}
    assert configs[ei.SFT_GRPO].rl.to_dict() == configs[ei.GRPO].rl.to_dict()
    assert configs[ei.SFT_GRPO].sft.to_dict() == configs[ei.SFT].sft.to_dict()


def test_the_pass_at_n_claim_is_not_testable_when_sft_sits_at_the_ceiling():
    from grpo_jax.studies import expert_iteration as ei
    from grpo_jax.studies import summary as summary_lib

    claim = next(c for c in ei.CLAIMS if c.test == (ei.SFT_GRPO, ei.SFT, "pass@8"))
    keys = [(f"b{b}", s) for b in range(4) for s in (0, 1)]

    def arm(values):
        return {"seeds": [s for _, s in keys], "bases": [b for b, _ in keys],
                "metrics": {"pass@8": list(values)}}

    near = {ei.SFT: arm([0.99, 0.985] * 4), ei.SFT_GRPO: arm([0.995, 0.99] * 4)}
    room = {ei.SFT: arm([0.80, 0.81] * 4), ei.SFT_GRPO: arm([0.801, 0.812] * 4)}
    for arms, expected in ((near, "not testable here"), (room, "reproduced")):
        result = summary_lib.build(
            study="expert_iteration", tier="mini",
            provenance={k: None for k in summary_lib.PROVENANCE},
            protocol={k: None for k in summary_lib.PROTOCOL}, arms=arms,
            specs=[claim.test], claims=(claim,))
        assert result["verdicts"][0]["verdict"] == expected, result["verdicts"][0]
