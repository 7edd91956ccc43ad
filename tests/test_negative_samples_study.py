"""rl.advantage_sign (the negative_samples study's option): the policy gradient on the tokens
of one sign of advantage only, by hand; its validation; its hash neutrality; the study's
arms."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default as default_config
from grpo_jax.rl.rollout import Rollout
from grpo_jax.rl.update import (
    ADVANTAGE_SIGNS,
    LossSettings,
    advantage_sign_tokens,
    batch_logp,
    policy_loss,
)
from grpo_jax.runner import ConfigError, validate
from grpo_jax.stages import KINDS
from grpo_jax.stages import rl as rl_stage
from tests.test_algorithms import tiny_policy

ADVANTAGES = (1.0, -1.0, 0.5, 0.0, 2.0, -0.25)  # one per row; row 3's is zero


def smoke(**rl):
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.rl.update(rl)
    return config


def tiny_batch(rows=6, prompt_len=3, new=5, seed=4):
    """Rows of random tokens; row b's completion has `lengths[b]` >= 1 valid tokens."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, 12, (rows, prompt_len + new)), jnp.int32)
    lengths = rng.integers(1, new + 1, rows)
    mask = jnp.asarray(np.arange(new)[None] < lengths[:, None])
    batch = Rollout(prompt_tokens=tokens[:, :prompt_len],
                    prompt_mask=jnp.ones((rows, prompt_len), bool),
                    tokens=tokens[:, prompt_len:], attention_mask=mask, loss_mask=mask,
                    behaviour_logp=jnp.zeros((rows, new), jnp.float32),
                    rewards=jnp.zeros(rows, jnp.float32), version=0).to_batch()
    return batch.with_advantages(jnp.asarray(ADVANTAGES)), prompt_len, lengths


def test_sign_tokens_by_hand():
    advantages = jnp.asarray([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5], [0.0, 0.0, 0.0],
                              [0.3, -0.2, 0.0]])  # the last row: per-token advantages
    mask = jnp.asarray([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], bool)
    np.testing.assert_array_equal(advantage_sign_tokens(advantages, mask, "positive"),
                                  [[1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(advantage_sign_tokens(advantages, mask, "negative"),
                                  [[0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(advantage_sign_tokens(advantages, mask, "both"), mask)
    with pytest.raises(ValueError, match="advantage_sign: expected one of"):
        advantage_sign_tokens(advantages, mask, "neg")


@pytest.mark.parametrize("sign, kept_rows", [("positive", (0, 2, 4)), ("negative", (1, 5)),
                                             ("both", (0, 1, 2, 3, 4, 5))])
def test_loss_and_gradient_by_hand(sign, kept_rows):
    """One on-policy pass (ratio 1) of GRPO's clipped surrogate, seq-mean-token-mean, no KL:
    the per-token loss is -A_b, so the loss is -(1/B) sum over the kept rows of A_b (each
    row's token mean of a constant), and its gradient is that of sum_bt w_bt log pi_bt with
    w_bt = -A_b / (B n_b) on the kept rows' valid tokens and 0 elsewhere."""
    policy, params = tiny_policy()
    batch, prompt_len, lengths = tiny_batch()
    rows = batch.rows
    settings = LossSettings(loss_agg="seq-mean-token-mean", advantage_sign=sign)
    loss = functools.partial(policy_loss, policy=policy, prompt_len=prompt_len,
                             num_tokens=jnp.sum(batch.loss_mask).astype(jnp.float32),
                             num_sequences=jnp.float32(rows), settings=settings)
    (value, metrics), grads = jax.value_and_grad(lambda p: loss(p, batch), has_aux=True)(
        params)
    # The loss: -(1/6) x (1 + 0.5 + 2) = -0.58333 (positive), -(1/6) x (-1 - 0.25) = +0.20833
    # (negative), -(1/6) x 2.25 = -0.375 (both).
    want = -sum(ADVANTAGES[b] for b in kept_rows) / rows
    assert float(value) == pytest.approx(want, rel=1e-6)
    assert {"positive": -3.5 / 6, "negative": 1.25 / 6, "both": -2.25 / 6}[sign] == \
        pytest.approx(want)
    weights = np.zeros(batch.loss_mask.shape, np.float32)
    for b in kept_rows:
        weights[b, :lengths[b]] = -ADVANTAGES[b] / (rows * lengths[b])

    def weighted_logp(p):
        logp, _ = batch_logp(policy, p, batch, prompt_len, 1.0)
        return jnp.sum(jnp.asarray(weights) * logp)

    want_grads = jax.grad(weighted_logp)(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads, want_grads)
    kept_tokens = sum(int(lengths[b]) for b in kept_rows if ADVANTAGES[b] != 0.0)
    if sign == "both":
        assert "sign_frac" not in metrics
    else:
        assert float(metrics["sign_frac"]) == pytest.approx(kept_tokens / lengths.sum())
    assert np.abs(jax.flatten_util.ravel_pytree(grads)[0]).max() > 0


@pytest.mark.parametrize("sign", ["positive", "negative"])
@pytest.mark.parametrize("objective", ["clip", "cispo"])
def test_one_sign_is_the_full_loss_with_the_other_zeroed(sign, objective):
    """Off-policy ratios (old log-probs not the current ones), a dual clip, token-mean and an
    entropy bonus: the one-sign loss and gradient are the full loss's with the other sign's
    advantages set to zero (the counts, entropy and every other term unchanged)."""
    policy, params = tiny_policy()
    batch, prompt_len, _ = tiny_batch()
    old = jnp.asarray(np.random.default_rng(1).normal(-2.5, 0.5, batch.loss_mask.shape),
                      jnp.float32)
    batch = batch.replace(old_logp=old)
    common = {"loss_agg": "token-mean", "on_policy": False, "entropy_coef": 0.01,
              "objective": objective, "epsilon": 0.2 if objective == "clip" else 1.0,
              "epsilon_high": 0.28, "dual_clip": 3.0 if objective == "clip" else None}
    loss = functools.partial(policy_loss, policy=policy, prompt_len=prompt_len,
                             num_tokens=jnp.sum(batch.loss_mask).astype(jnp.float32),
                             num_sequences=jnp.float32(batch.rows))
    one = functools.partial(loss, settings=LossSettings(**common, advantage_sign=sign))
    full = functools.partial(loss, settings=LossSettings(**common))
    keep = batch.advantages > 0 if sign == "positive" else batch.advantages < 0
    zeroed = batch.replace(advantages=jnp.where(keep, batch.advantages, 0.0))
    value, grads = jax.value_and_grad(lambda p: one(p, batch)[0])(params)
    want, want_grads = jax.value_and_grad(lambda p: full(p, zeroed)[0])(params)
    np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads, want_grads)
    # ... and not the full loss itself.
    assert abs(float(value) - float(full(params, batch)[0])) > 1e-3


def test_section_default_validation_and_loss_settings():
    config = smoke()
    assert config.rl.advantage_sign == "both" and ADVANTAGE_SIGNS[0] == "both"
    for sign in ADVANTAGE_SIGNS:
        validate(smoke(advantage_sign=sign), KINDS)
        assert rl_stage.loss_settings(smoke(advantage_sign=sign).rl,
                                      on_policy=True).advantage_sign == sign
    # Every algorithm of the stage takes it (the loss is the stage's one policy_loss).
    validate(smoke(advantage_sign="negative", algorithm="reinforce_pp"), KINDS)
    # A config written before the field existed reads as "both".
    old = smoke()
    del old.rl.advantage_sign
    assert rl_stage.loss_settings(old.rl, on_policy=True).advantage_sign == "both"


@pytest.mark.parametrize("value", ["neg", "", "Negative"])
def test_a_bad_value_is_one_line_naming_the_field(value):
    with pytest.raises(ConfigError) as info:
        validate(smoke(advantage_sign=value), KINDS)
    lines = [line for line in str(info.value).splitlines() if "advantage_sign" in line]
    assert len(lines) == 1
    assert "rl.advantage_sign: expected one of ['both', 'positive', 'negative']" in lines[0]


def test_expert_iteration_refuses_the_negative_sign_it_would_train_nothing_on():
    """expert_iteration's advantages are 0 or 1: the negative sign keeps no token."""
    with pytest.raises(ConfigError, match=r"rl.advantage_sign: expert_iteration's advantages "
                                          r"are 0 or 1, never negative"):
        validate(smoke(advantage_sign="negative", algorithm="expert_iteration"), KINDS)
    validate(smoke(advantage_sign="positive", algorithm="expert_iteration"), KINDS)


def test_the_device_source_takes_it():
    """The fused program runs the learner's own iteration (its policy_loss), so validation
    lets a fused stage take either sign."""
    config = smoke(advantage_sign="positive", fused_steps=2, steps=2, checkpoint_every=2,
                   overlong_cache=0)
    validate(config, KINDS)


def test_both_keeps_every_run_hash_and_a_sign_changes_it():
    from grpo_jax.studies import configs

    config = smoke()
    without = smoke()
    del without.rl.advantage_sign
    assert configs.config_hash(config) == configs.config_hash(without)
    config.rl.advantage_sign = "negative"
    assert configs.config_hash(config) != configs.config_hash(without)


def test_the_arms_differ_in_the_sign_only_and_share_pass_at_k_run():
    from grpo_jax.studies import configs, negative_samples, pass_at_k

    for tier in ("mini", "full"):
        arms = negative_samples.arm_configs(tier)
        assert set(arms) == set(negative_samples.ALL_ARMS)
        assert configs.config_hash(arms[negative_samples.BOTH]) == \
            configs.config_hash(pass_at_k.arm_config(tier))
        for arm, sign in negative_samples.SIGNS.items():
            assert arms[arm].rl.advantage_sign == sign
            other = arms[arm].copy_and_resolve_references()
            other.rl.advantage_sign = "both"
            assert configs.config_hash(other) == configs.config_hash(arms[negative_samples.BOTH])


# ---- the spell_backward family (full tier only; covered here without training) --------------

def _flat(config, prefix=""):
    out = {}
    for key, value in config.items():
        if hasattr(value, "items"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _diff(a, b):
    fa, fb = _flat(a), _flat(b)
    return {k: (fa.get(k), fb.get(k)) for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}


def test_family_arms_are_the_familys_grpo_stage_with_the_sign():
    """Each family arm is `families.grpo` (replication's `all` run of the family: one
    config) from the family's base role, differing from `both` in rl.advantage_sign only."""
    from grpo_jax.studies import configs, families, replication
    from grpo_jax.studies import negative_samples as ns

    for tier in ("mini", "full"):
        arms = ns.arm_configs(tier)
        both = arms[ns.named(ns.FAMILY, ns.BOTH)]
        assert configs.config_hash(both) == configs.config_hash(families.grpo(tier, ns.FAMILY))
        assert both.task.kwargs.datasets == "spell_backward"
        assert both.model.init_from == "spell_backward:base"
        assert both.stages == "eval_base,rl,eval_final"
        for arm, sign in ns.SIGNS.items():
            config = arms[ns.named(ns.FAMILY, arm)]
            want = {} if arm == ns.BOTH else {"rl.advantage_sign": (sign, "both")}
            assert _diff(config, both) == want
    full = ns.arm_configs("full")[ns.named(ns.FAMILY, ns.BOTH)]
    assert int(full.rl.steps) == 40 and int(full.eval_final.max_new_tokens) == 32
    assert configs.config_hash(full) == configs.config_hash(
        replication.arm_config("full", ns.FAMILY, replication.ALL))


def test_family_configs_validate_as_the_runner_validates_them():
    """Every full-tier family arm, as the study plans it (`for_tier`, a seed), and the
    family's base validate (`runner.validate`, as `pipeline.train_and_evaluate` does); the
    arm's model.init_from, a role name until `attach`, is left empty here (a fresh tiny-1m
    of the base's shape) since the base's directory exists only after its run."""
    from grpo_jax.studies import configs, families
    from grpo_jax.studies import negative_samples as ns

    base = configs.for_tier_base(ns.base_config("full")[families.role(ns.FAMILY)], "full")
    base.seed = 0
    validate(base, KINDS)
    for name in ns.FAMILY_ARMS:
        config = configs.for_tier(ns.arm_configs("full")[name], "full")
        config.seed = 1
        assert config.model.init_from == families.role(ns.FAMILY)
        config.model.init_from = ""
        assert config.model.name == base.model.name
        inputs = validate(config, KINDS)
        assert inputs.task is not None


def test_base_sets_full_with_the_family_mini_main_only():
    from grpo_jax.studies import configs, families, pass_at_k
    from grpo_jax.studies import negative_samples as ns
    from grpo_jax.studies import tiers as tiers_lib

    mini = ns.base_config("mini")
    assert not isinstance(mini, dict)
    assert configs.config_hash(mini) == configs.config_hash(pass_at_k.base_config("mini"))
    full = ns.base_config("full")
    assert list(full) == [families.MAIN_ROLE, families.role(ns.FAMILY)]
    assert configs.config_hash(full["base"]) == configs.config_hash(
        pass_at_k.base_config("full"))
    assert configs.config_hash(full["spell_backward:base"]) == configs.config_hash(
        families.base("full", ns.FAMILY))
    tiers = ns.STUDY.tiers
    assert tiers["mini"].arms == ns.ARMS and tiers["full"].arms is None
    assert ns.STUDY.arms == ns.ARMS + ns.FAMILY_ARMS
    assert tiers["full"].bases == tiers_lib.FULL_BASES


def test_plan_sends_family_arms_to_the_family_base_and_arithmetic_to_the_main():
    """`attach` on a fake base set: the family arms start from the family's role, the
    arithmetic arms from the main base, in the same run directories as with the main base
    alone (so `both` stays pass_at_k's run)."""
    from grpo_jax.studies import common, families, pass_at_k
    from grpo_jax.studies import negative_samples as ns

    roles = {"base": "/w/bases/main", "spell_backward:base": "/w/bases/sb"}
    base_set = {"s0-set": {"seed": 0, "workdir": "/w/bases/main", "roles": roles}}
    records = common.plan(ns.STUDY, "full", "/w", base_set)
    assert len(records) == len(ns.ALL_ARMS) * 2  # one base set x two seeds
    for record in records:
        want = "/w/bases/sb" if record.arm in ns.FAMILY_ARMS else "/w/bases/main"
        assert record.config.model.init_from == want, record.arm
    alone = {"s0-main": {"seed": 0, "workdir": "/w/bases/main",
                         "roles": {"base": "/w/bases/main"}}}
    pak = {r.seed: r.workdir for r in common.plan(pass_at_k.STUDY, "full", "/w", alone)}
    both = {r.seed: r.workdir for r in records if r.arm == ns.BOTH}
    assert both == pak
    config = ns.arm_configs("full")[ns.NEGATIVE]
    families.attach(config, {"roles": roles})
    assert config.model.init_from == "/w/bases/main"


# ---- measurement views and the analysis on constructed records ------------------------------

def _problems(counts, samples=256):
    return [{"question": f"q{i}", "answer": "a", "operators": 0, "samples": samples,
             "correct": c, "formatted": samples, "tokens": 8 * samples}
            for i, c in enumerate(counts)]


def _write_run(workdir, counts, entropies, sign_frac=None):
    import json
    import os

    from grpo_jax.studies import pass_at_k

    os.makedirs(workdir, exist_ok=True)
    rows = [{"stage": "rl", "stage_step": i + 1, "reward_mean": 0.5, "entropy": e,
             **({"sign_frac": sign_frac} if sign_frac is not None else {})}
            for i, e in enumerate(entropies)]
    with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as f:
        f.write("{}")
    with open(os.path.join(workdir, pass_at_k.FILE), "w", encoding="utf-8") as f:
        json.dump({"problems": _problems(counts)}, f)


def _write_draw(path, counts):
    import json
    import os

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"problems": _problems(counts)}, f)


# (base, seed) -> per-arm correct counts of two problems (256 samples each), per family; the
# family's base model solves differently from the arithmetic one, so a contrast that read the
# other family's base draw would give other numbers.
COUNTS = {
    None: {"base model": {("b0", 0): (128, 0), ("b1", 0): (200, 2)},
           "both": {("b0", 0): (192, 0), ("b1", 0): (256, 0)},
           "positive": {("b0", 0): (256, 0), ("b1", 0): (256, 0)},
           "negative": {("b0", 0): (128, 64), ("b1", 0): (210, 4)}},
    "spell_backward": {"base model": {("b0", 0): (16, 0), ("b1", 0): (32, 1)},
                       "both": {("b0", 0): (224, 0), ("b1", 0): (240, 64)},
                       "positive": {("b0", 0): (240, 0), ("b1", 0): (256, 0)},
                       "negative": {("b0", 0): (64, 8), ("b1", 0): (48, 32)}},
}
# the first entropy of each `both` run is its base model's; then the arm's last steps
ENTROPY = {None: {"both": (1.0, 0.8), "positive": (1.0, 0.5), "negative": (1.0, 0.9)},
           "spell_backward": {"both": (2.0, 1.2), "positive": (2.0, 0.6),
                              "negative": (2.0, 1.8)}}


def _runs(tmp_path, tier="full", families_on=True):
    from grpo_jax.studies import common, families
    from grpo_jax.studies import measure as measure_lib
    from grpo_jax.studies import negative_samples as ns

    root = str(tmp_path / "negative_samples")
    bases, records = {}, []
    for key in ("b0", "b1"):
        roles = {"base": str(tmp_path / "bases" / f"{key}-main")}
        if families_on:
            roles["spell_backward:base"] = str(tmp_path / "bases" / f"{key}-sb")
        bases[key] = {"seed": 0, "workdir": roles["base"], "roles": roles}
    runs = common.StudyRuns(ns.STUDY, tier, root, records, bases)
    for family in (ns.GROUPS if families_on else (None,)):
        for arm in ns.ARMS:
            for (key, seed), counts in COUNTS[family][arm].items():
                workdir = str(tmp_path / "runs" / f"{family}-{arm}-{key}-{seed}")
                sign = None if arm == ns.BOTH else 0.4
                _write_run(workdir, counts, ENTROPY[family][arm], sign)
                records.append(common.RunRecord(ns.named(family, arm), key, seed, workdir,
                                                None))
        for (key, seed), counts in COUNTS[family]["base model"].items():
            path = measure_lib.base_path(ns.view(runs, family), key, seed)
            _write_draw(path, counts)
    assert families.role(ns.FAMILY) == "spell_backward:base"
    return runs


def test_views_give_each_family_its_base_runs_and_draws(tmp_path):
    from grpo_jax.studies import measure as measure_lib
    from grpo_jax.studies import negative_samples as ns

    runs = _runs(tmp_path)
    main, family = ns.view(runs, None), ns.view(runs, ns.FAMILY)
    assert {r.arm for r in main.runs} == set(ns.ARMS)
    assert {r.arm for r in family.runs} == set(ns.FAMILY_ARMS)
    for key in ("b0", "b1"):
        assert main.bases[key]["workdir"] == str(tmp_path / "bases" / f"{key}-main")
        assert family.bases[key]["workdir"] == str(tmp_path / "bases" / f"{key}-sb")
    assert main.root == runs.root
    assert measure_lib.base_path(main, "b0", 0) == f"{runs.root}/base_model/b0,seed=0.json"
    assert measure_lib.base_path(family, "b0", 0) == \
        f"{runs.root}/spell_backward/base_model/b0,seed=0.json"
    # a base set without the family's role (the mini tier's main base): no family view
    mini = _runs(tmp_path / "mini", "mini", families_on=False)
    assert ns.view(mini, ns.FAMILY).bases == {} and ns.view(mini, ns.FAMILY).runs == []


def test_measure_samples_each_family_from_its_own_base(tmp_path, monkeypatch):
    """`measure` hands each family's view with runs to `measure.measure_samplings` (pass_at_k's
    file and sizes): the family's base role as the base (so its held-out problems, task and
    token limit are the family's) and the family's own folder for the base draws."""
    from grpo_jax.studies import measure as measure_lib
    from grpo_jax.studies import negative_samples as ns
    from grpo_jax.studies import pass_at_k

    calls = []
    monkeypatch.setattr(measure_lib, "measure_samplings",
                        lambda runs, sizes, file: calls.append((runs, sizes, file)))
    runs = _runs(tmp_path)
    ns.measure(runs)
    assert len(calls) == 2
    assert all(file == pass_at_k.FILE for _, _, file in calls)
    assert all(sizes == pass_at_k.measurement_sizes("full") for _, sizes, _ in calls)
    main, family = calls[0][0], calls[1][0]
    assert {r.arm for r in main.runs} == set(ns.ARMS)
    assert {r.arm for r in family.runs} == set(ns.FAMILY_ARMS)
    for key in ("b0", "b1"):
        assert main.bases[key]["workdir"] == str(tmp_path / "bases" / f"{key}-main")
        assert family.bases[key]["workdir"] == str(tmp_path / "bases" / f"{key}-sb")
    assert main.root == runs.root
    assert family.root == f"{runs.root}/spell_backward"
    calls.clear()
    mini = _runs(tmp_path / "mini", "mini", families_on=False)
    ns.measure(mini)
    assert len(calls) == 1 and calls[0][0].root == mini.root
    assert {r.arm for r in calls[0][0].runs} == set(ns.ARMS)


def test_the_family_measurement_writes_where_the_analysis_reads(tmp_path, monkeypatch):
    """`measure_samplings` on the family's view (sampling stubbed) samples the family's base
    and writes its draws and the family runs' files where `add_family_rows` reads them
    (`measure.base_problems` of the view, the run's pass_at_k file); the arithmetic draws,
    already there, are not made again."""
    import os
    import types

    import ml_collections

    from grpo_jax.studies import common, pass_at_k
    from grpo_jax.studies import measure as measure_lib
    from grpo_jax.studies import negative_samples as ns

    runs = _runs(tmp_path)
    family = ns.view(runs, ns.FAMILY)
    for record in family.runs:
        os.remove(os.path.join(record.workdir, pass_at_k.FILE))
    for key in family.bases:
        os.remove(measure_lib.base_path(family, key, 0))
    bases = []

    def held_out(workdir, problems=None, *, config=None):
        bases.append((workdir, problems))
        config = ml_collections.ConfigDict({"eval_final": {"max_new_tokens": 32}})
        run = types.SimpleNamespace(config=config, params=f"params of {workdir}",
                                    tokenizer="tokenizer")
        return measure_lib.HeldOut(run, [], 7)

    def sample_problems(setup, params, **kwargs):
        return [{"params": params, "seed": kwargs["seed"]}]

    monkeypatch.setattr(measure_lib, "held_out", held_out)
    monkeypatch.setattr(measure_lib, "sample_problems", sample_problems)
    monkeypatch.setattr(common, "load_run_params", lambda workdir, tokenizer: workdir)
    ns.measure(runs)
    problems = pass_at_k.measurement_sizes("full")["problems"]
    assert sorted(bases) == [(str(tmp_path / "bases" / f"{key}-sb"), problems)
                             for key in ("b0", "b1")]
    for key in family.bases:
        draw = measure_lib.base_problems(ns.view(runs, ns.FAMILY), key, 0)
        assert draw == [{"params": f"params of {tmp_path}/bases/{key}-sb", "seed": 0}]
        assert os.path.dirname(measure_lib.base_path(family, key, 0)) == \
            f"{runs.root}/spell_backward/base_model"
    for record in family.runs:
        path = os.path.join(record.workdir, pass_at_k.FILE)
        assert measure_lib.load_problems(path) == [{"params": record.workdir, "seed": 0}]


def _pass_at(n, c, k):
    """pass@k by hand: 1 - C(n - c, k) / C(n, k)."""
    import math

    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_analysis_contrasts_stay_within_each_family(tmp_path):
    """The analysis of constructed records of both families: each arm's figures from its own
    file and its contrasts against its own family's base-model draw, by hand."""
    from grpo_jax.studies import negative_samples as ns
    from grpo_jax.studies import summary as summary_lib

    analysis = ns.analyze(_runs(tmp_path))
    arms = analysis.arms
    assert list(arms) == [ns.named(f, n) for f in ns.GROUPS
                          for n in (ns.BASE_MODEL, *ns.ARMS)]
    sb = "spell_backward: "
    # pass@1: the mean of c / 256 over the two problems; b0 then b1.
    assert arms[sb + "negative"]["metrics"]["pass@1"] == pytest.approx(
        [(64 + 8) / 512, (48 + 32) / 512])
    assert arms[sb + "base model"]["metrics"]["pass@1"] == pytest.approx(
        [16 / 512, 33 / 512])
    # pass@256: the share of problems with a correct sample.
    assert arms[sb + "positive"]["metrics"]["pass@256"] == pytest.approx([0.5, 0.5])
    assert arms[sb + "base model"]["metrics"]["pass@256"] == pytest.approx([0.5, 1.0])
    # the entropy: the base model's from the `both` runs' first step, the arms' last step
    # (window: half of two rows).
    assert arms[sb + "base model"]["metrics"]["entropy"] == pytest.approx([2.0, 2.0])
    assert arms[sb + "positive"]["metrics"]["entropy"] == pytest.approx([0.6, 0.6])
    assert arms[sb + "negative"]["metrics"]["sign_frac"] == pytest.approx([0.4, 0.4])
    # solved by the arm, never by the family's base draw: b0's second problem (8 > 0 = 0)
    assert arms[sb + "negative"]["metrics"]["only_this_solves_rate"] == pytest.approx(
        [0.5, 0.0])
    found = {(c["a"], c["b"], c["metric"]): c
             for c in summary_lib.contrasts(arms, analysis.specs)}
    assert set(found) == set(ns.SPECS) and len(ns.SPECS) == 16
    for a, b, _ in ns.SPECS:  # never across families
        assert a.startswith(sb) == b.startswith(sb)
    per_base = {  # (a, b, metric) -> [b0's difference, b1's], by hand
        (sb + "negative", sb + "base model", "pass@1"): [(72 - 16) / 512, (80 - 33) / 512],
        (sb + "negative", sb + "base model", "pass@16"): [
            (_pass_at(256, 64, 16) + _pass_at(256, 8, 16) - _pass_at(256, 16, 16)) / 2,
            (_pass_at(256, 48, 16) + _pass_at(256, 32, 16) - _pass_at(256, 32, 16)
             - _pass_at(256, 1, 16)) / 2],
        (sb + "negative", sb + "base model", "pass@256"): [0.5, 0.0],
        (sb + "negative", sb + "both", "pass@1"): [(72 - 224) / 512, (80 - 304) / 512],
        (sb + "positive", sb + "base model", "pass@1"): [(240 - 16) / 512, (256 - 33) / 512],
        (sb + "positive", sb + "base model", "pass@256"): [0.0, -0.5],
        (sb + "positive", sb + "base model", "entropy"): [0.6 - 2.0, 0.6 - 2.0],
        # arithmetic, against the arithmetic base draw
        ("negative", "base model", "pass@1"): [(192 - 128) / 512, (214 - 202) / 512],
        ("positive", "base model", "entropy"): [0.5 - 1.0, 0.5 - 1.0],
    }
    for spec, diffs in per_base.items():
        contrast = found[spec]
        got = [contrast["per_base"][key]["diff"] for key in ("b0", "b1")]
        assert got == pytest.approx(diffs, abs=1e-12), spec
        assert contrast["diff"] == pytest.approx(sum(diffs) / 2, abs=1e-12), spec
    # the claims' tests are the study's contrasts, their twins within the family
    summary_lib.build(study="negative_samples", tier="full", provenance=dict.fromkeys(
        summary_lib.PROVENANCE), protocol=dict.fromkeys(summary_lib.PROTOCOL), arms=arms,
        specs=analysis.specs, claims=ns.CLAIMS)
    assert "**spell_backward**" in analysis.table and "**arithmetic**" in analysis.table


def test_family_claims_are_the_originals_rerun_on_the_family():
    from grpo_jax.studies import negative_samples as ns

    originals, twins = ns.CLAIMS[:len(ns.CLAIMS_MAIN)], ns.CLAIMS[len(ns.CLAIMS_MAIN):]
    assert originals == ns.CLAIMS_MAIN and len(twins) == len(originals) == 8
    for original, twin in zip(originals, twins):
        assert (twin.text, twin.expect, twin.margin, twin.kind) == (
            original.text, original.expect, original.margin, original.kind)
        assert twin.source == original.source + "; rerun on reasoning-gym's spell_backward"
        a, b, metric = original.test
        assert twin.test == (ns.named(ns.FAMILY, a), ns.named(ns.FAMILY, b), metric)
        assert twin.test in ns.SPECS and original.test in ns.SPECS
        assert twin.failure().startswith(ns.FAMILY_WHY[original.test])
        assert original.failure().startswith(ns.WHY[original.test])  # this design's reason
        assert not twin.failure().startswith(ns.WHY[original.test])
        if original.headroom is not None:
            assert twin.headroom == (ns.named(ns.FAMILY, original.headroom[0]),
                                     *original.headroom[1:])
    # the arithmetic ceiling note is not carried to the family
    assert all("98%" not in t.note for t in twins)


def test_training_figures_by_hand():
    """The last steps' entropy mean (window 2 of 5 rows: (0.3 + 0.1) / 2), the first step's,
    and the mean share of tokens carrying the gradient over the rows that log it."""
    from grpo_jax.studies.negative_samples import training_figures

    rows = [{"entropy": 0.9, "sign_frac": 0.5}, {"entropy": 0.7, "sign_frac": 0.3},
            {"entropy": 0.5}, {"entropy": 0.3, "sign_frac": 0.1}, {"entropy": 0.1}]
    out = training_figures(rows, window=2)
    assert out["entropy"] == pytest.approx(0.2)
    assert out["first_entropy"] == 0.9
    assert out["sign_frac"] == pytest.approx(0.3)
    # 3 rows: the window is half of them, rounded down (1): the last row alone.
    assert training_figures(rows[:3], window=10)["entropy"] == pytest.approx(0.5)
    assert training_figures([{"entropy": 0.4}])["sign_frac"] is None


@pytest.mark.slow
def test_the_fused_program_honours_the_sign(tmp_path):
    """The device source (fused_steps 2) and the host loop give the same negative-only
    updates: the same loss, gradient norm and share of tokens kept, step by step."""
    # its config and its digit_share reward
    from test_device_rewards import fused_config

    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    rows = {}
    for k in (0, 2):
        config = fused_config(k, steps=2, advantage_sign="negative")
        train_and_evaluate(config, str(tmp_path / f"k{k}"))
        rows[k] = read_metrics(str(tmp_path / f"k{k}" / "metrics.jsonl"))
    host, fused = rows[0], rows[2]
    assert [r["stage_step"] for r in fused] == [1, 2]
    for a, b in zip(host, fused):
        assert 0 < a["sign_frac"] < 1
        for key in ("reward_mean", "sign_frac"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key
        for key in ("loss", "grad_norm", "entropy", "kl_ref"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
