"""entropy_dynamics: the fit of R = -a exp(H) + b against hand-computed values and data made
from known a and b, the curve's figures on constructed training rows, the arms' configs (one
field apart, the shared runs' hashes; the arithmetic arms' keys as published; the
spell_backward arms validating as the runner validates a config), the base set and `attach`
(each family's arms from its own role), the twinned claims, and the analysis of constructed
runs of both families against hand-computed contrasts (no training)."""

from __future__ import annotations

import json
import math

import pytest

from grpo_jax.studies import common
from grpo_jax.studies import entropy_dynamics as study


def test_fit_recovers_known_a_and_b_from_data_made_with_them():
    a, b = 0.3, 0.9
    entropy = [0.05 * k for k in range(1, 9)]
    reward = [-a * math.exp(h) + b for h in entropy]
    fit = study.fit_entropy_law(entropy, reward)
    assert fit["a"] == pytest.approx(a, abs=1e-12)
    assert fit["b"] == pytest.approx(b, abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)
    assert fit["ceiling"] == pytest.approx(b - a, abs=1e-12)
    assert fit["n"] == 8


def test_fit_with_noise_stays_near_the_known_coefficients():
    a, b = 0.5, 1.2
    entropy = [0.02 * k for k in range(20)]
    noise = [0.004 * (-1) ** k for k in range(20)]  # alternating, mean zero
    reward = [-a * math.exp(h) + b + e for h, e in zip(entropy, noise)]
    fit = study.fit_entropy_law(entropy, reward)
    assert fit["a"] == pytest.approx(a, abs=0.02)
    assert fit["b"] == pytest.approx(b, abs=0.02)
    assert 0.9 < fit["r2"] < 1.0


def test_fit_against_hand_computed_least_squares():
    # x = exp(H) = 1, 2, 3; R = 3, 2, 2: slope -1/2 (a = 1/2), b = 7/3 + 1/2 * 2 = 10/3,
    # residuals 1/6, -1/3, 1/6: SS_res 1/6, SS_tot 2/3, R^2 = 3/4; ceiling 10/3 - 1/2 = 17/6
    fit = study.fit_entropy_law([0.0, math.log(2.0), math.log(3.0)], [3.0, 2.0, 2.0])
    assert fit["a"] == pytest.approx(0.5)
    assert fit["b"] == pytest.approx(10.0 / 3.0)
    assert fit["r2"] == pytest.approx(0.75)
    assert fit["ceiling"] == pytest.approx(17.0 / 6.0)


def test_fit_is_zero_when_reward_rises_with_entropy():
    # the relation's direction fails: a = 0, b = mean(R), nothing explained
    fit = study.fit_entropy_law([0.1, 0.2, 0.3], [0.1, 0.2, 0.4])
    assert fit["a"] == 0.0
    assert fit["b"] == pytest.approx(0.7 / 3.0)
    assert fit["r2"] == pytest.approx(0.0, abs=1e-12)


def test_fit_needs_three_points_with_spread():
    assert math.isnan(study.fit_entropy_law([0.1, 0.2], [0.5, 0.4])["r2"])
    assert math.isnan(study.fit_entropy_law([0.1, 0.1, 0.1], [0.5, 0.4, 0.3])["r2"])
    assert math.isnan(study.fit_entropy_law([0.1, 0.2, 0.3], [0.5, 0.5, 0.5])["r2"])
    fit = study.fit_entropy_law([0.1, None, 0.2, float("nan"), 0.3], [0.5, 0.1, 0.4, 0.2, 0.3])
    assert fit["n"] == 3 and fit["r2"] > 0.99


def test_windows_and_early_share():
    rows = [{"x": float(k)} for k in range(7)] + [{"x": None}]
    assert study.windows(rows, "x", 3) == [1.0, 4.0]  # the last, shorter window left out
    assert study.windows(rows[4:], "x", 2) == [4.5, 6.0]  # None left out of its window
    assert study.early_share(1.0, 0.4, 0.2) == pytest.approx(0.75)
    assert math.isnan(study.early_share(1.0, 0.4, 1.0))


def test_curve_values_on_rows_made_from_the_law():
    # 30 steps (3 windows of 10) whose entropy falls 0.4, 0.2, 0.1 (constant within a window,
    # so the window means keep the law exactly: mean(exp(H)) = exp(H)) and whose training
    # pass@1 follows R = -a exp(H) + b
    a, b = 0.6, 1.4
    entropy = [0.4] * 10 + [0.2] * 10 + [0.1] * 10
    rows = [{"entropy": h, "pass@1": -a * math.exp(h) + b} for h in entropy]
    values = study.curve_values(rows)
    assert values["fit_points"] == 3
    assert values["fit_r2"] == pytest.approx(1.0, abs=1e-9)
    assert values["fit_a"] == pytest.approx(a, abs=1e-9)
    assert values["fit_ceiling"] == pytest.approx(b - a, abs=1e-9)
    assert values["entropy_start"] == pytest.approx(0.4)
    end = sum(entropy[-10:]) / 10
    assert values["entropy_end"] == pytest.approx(end)
    assert values["entropy_ratio"] == pytest.approx(end / 0.4)
    early = sum(entropy[0:10]) / 10  # the window ending at a third of the steps
    assert values["entropy_drop_early"] == pytest.approx((early - 0.4) / (end - 0.4))
    assert values["entropy_ratio_early"] == pytest.approx(early / 0.4)
    assert values["ceiling_gap"] == pytest.approx(
        b - a - sum(r["pass@1"] for r in rows[-10:]) / 10)
    assert study.curve_values([]) == {}


def _flat(config) -> dict:
    def walk(node, prefix=""):
        out = {}
        for key, value in node.items():
            if isinstance(value, dict):
                out.update(walk(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out
    return walk(json.loads(config.to_json_best_effort(sort_keys=True)))


def test_arms_differ_in_one_field_and_share_the_other_studies_runs():
    from grpo_jax.studies import forking_tokens, updates_per_batch

    configs = study.arm_configs("full")
    assert common.config_hash(configs[study.GRPO]) == common.config_hash(
        forking_tokens.arm_config("all", "full"))
    assert common.config_hash(configs[study.PASSES]) == common.config_hash(
        updates_per_batch.arm_config(study.PASSES_ARM, "full"))
    for arm, control, field, value in (
            (study.BONUS, study.GRPO, "rl.entropy_coef", study.ENTROPY_COEF),
            (study.CLIP_HIGHER, study.PASSES, "rl.epsilon_high", study.EPSILON_HIGH)):
        left, right = _flat(configs[arm]), _flat(configs[control])
        differ = {k for k in set(left) | set(right) if left.get(k) != right.get(k)}
        assert differ == {field}, (arm, differ)
        assert left[field] == value
    with pytest.raises(ValueError, match="unknown arm"):
        study.arm_config("bogus")


def test_plot_fits_draws_each_arms_points_and_fit(tmp_path):
    entropy = [0.4, 0.3, 0.2, 0.15]
    points = {study.GRPO: [(entropy, [-0.5 * math.exp(h) + 1.2 for h in entropy])],
              study.BONUS: [([0.4, 0.39], [0.3, 0.31])]}  # too few points: no fit drawn
    study.plot_fits(points, str(tmp_path))
    assert (tmp_path / "fit.png").stat().st_size > 0
    study.plot_fits({}, str(tmp_path / "none"))  # no arm: no figure, no error


# ---- the second task family (spell_backward): configs, roles, claims, analysis ---------------

# The arithmetic arms' config keys as the README's design block publishes them: a change
# orphans their finished full-tier runs (and those of forking_tokens and updates_per_batch).
ARITHMETIC_KEYS = {study.GRPO: "c814934f84", study.BONUS: "959f84ccdb",
                   study.PASSES: "c9fa7d9aa2", study.CLIP_HIGHER: "832a452037"}


def _diff(a, b) -> dict:
    left, right = _flat(a), _flat(b)
    return {k: (left.get(k), right.get(k)) for k in set(left) | set(right)
            if left.get(k) != right.get(k)}


def test_arithmetic_arms_keep_their_configs():
    from grpo_jax.studies import configs as configs_lib

    configs = study.arm_configs("full")
    assert {arm: configs_lib.config_key(configs[arm]) for arm in study.MAIN_ARMS} == \
        ARITHMETIC_KEYS
    assert all(configs[arm].model.init_from == "" for arm in study.MAIN_ARMS)
    assert configs_lib.config_key(study.base_config("full")["base"]) == "70090ef410"


def test_family_arms_differ_in_one_change_and_share_replications_run():
    from grpo_jax.studies import families, replication

    configs = study.arm_configs("full")
    sb = {kind: configs[study.named(study.FAMILY, kind)] for kind in study.KINDS}
    grpo = sb[study.GRPO]
    assert study.FAMILY == "spell_backward" == grpo.task.kwargs.datasets
    assert grpo.task.name == "reasoning_gym" and grpo.model.init_from == "spell_backward:base"
    assert grpo.stages == "eval_base,rl,eval_final" and int(grpo.rl.steps) == 40
    assert common.config_hash(grpo) == common.config_hash(
        replication.arm_config("full", "spell_backward", replication.ALL))
    assert common.config_hash(grpo) == common.config_hash(families.grpo("full", study.FAMILY))
    # the multi-pass change, by hand: updates_per_batch's mu=4, lr=1e-3 arm makes the main
    # job's 2e-4 five times larger and takes 4 updates per batch; the preset's 2e-4 likewise
    assert study.lr_factor("full") == pytest.approx(1e-3 / 2e-4) == pytest.approx(5.0)
    assert float(grpo.rl.lr) == pytest.approx(2e-4) and int(grpo.rl.fused_steps) == 0
    assert _diff(sb[study.PASSES], grpo) == {"rl.num_iterations": (4, 1),
                                             "rl.lr": (pytest.approx(1e-3), 2e-4)}
    assert _diff(sb[study.BONUS], grpo) == {"rl.entropy_coef": (study.ENTROPY_COEF, 0.0)}
    assert _diff(sb[study.CLIP_HIGHER], sb[study.PASSES]) == {
        "rl.epsilon_high": (study.EPSILON_HIGH, None)}


def test_every_family_arm_validates_as_the_runner_validates_it():
    """The full tier's spell_backward configs (and the family's base) pass the runner's
    validation; `model.init_from` (the role name, a directory once attached) is cleared, as
    no base is built here."""
    from grpo_jax.pipeline import KINDS, validate

    configs = study.arm_configs("full")
    roles = study.base_config("full")
    for config in (*(configs[arm] for arm in study.FAMILY_ARMS), roles["spell_backward:base"]):
        config.mesh.num_devices = 1  # the suite's 8 virtual CPU devices
        config.model.init_from = ""
        inputs = validate(config, KINDS)
        assert inputs.task is not None
        assert config.task.prompt_len + config.rl.max_new_tokens <= config.model.max_seq_len


def test_base_set_and_attach_send_each_arm_to_its_familys_role():
    from grpo_jax.studies import configs as configs_lib

    full = study.base_config("full")
    assert set(full) == {"base", "spell_backward:base"}
    assert configs_lib.config_key(full["base"]) == configs_lib.config_key(
        common.main_base("full"))
    assert full["spell_backward:base"].stages == "pretrain"
    assert full["spell_backward:base"].task.kwargs.datasets == "spell_backward"
    # the mini tier: the main base alone, the arithmetic arms only
    mini = study.base_config("mini")
    assert not isinstance(mini, dict)
    assert configs_lib.config_key(mini) == configs_lib.config_key(common.main_base("mini"))
    assert study.STUDY.tiers["mini"].arms == study.MAIN_ARMS
    assert study.STUDY.tiers["full"].arms is None
    fake = {"roles": {"base": "/bases/main", "spell_backward:base": "/bases/spell"}}
    for arm, config in study.arm_configs("full").items():
        study.STUDY.attach(config, fake)
        expected = "/bases/spell" if arm in study.FAMILY_ARMS else "/bases/main"
        assert config.model.init_from == expected, arm
    for arm in study.MAIN_ARMS:  # a mini tier's base: one role
        config = study.arm_config(arm, "mini")
        study.STUDY.attach(config, {"roles": {"base": "/bases/toy"}})
        assert config.model.init_from == "/bases/toy"


def test_every_claim_has_its_twin_on_the_family():
    originals, twins = study.ARITHMETIC_CLAIMS, study.FAMILY_CLAIMS
    assert len(originals) == len(twins) == 6 and study.CLAIMS == (*originals, *twins)
    for original, twin in zip(originals, twins):
        assert (twin.text, twin.expect, twin.margin, twin.kind) == (
            original.text, original.expect, original.margin, original.kind)
        assert twin.source == original.source + "; rerun on reasoning-gym's spell_backward"
        a, b, metric = original.test
        assert twin.test == (f"spell_backward: {a}", f"spell_backward: {b}", metric)
        assert twin.test in study.SPECS and original.test in study.SPECS
        assert twin.failure() and twin.failure() != original.failure()
        assert "spell_backward" in twin.failure() or "0.10" in twin.failure()
    # each contrast within one family; the Holm family holds both
    assert len(study.SPECS) == 12
    for a, b, _ in study.SPECS:
        assert a.startswith("spell_backward: ") == b.startswith("spell_backward: ")


# Constructed runs of both families: entropy constant within each window of 10 steps (the
# window means keep the values exactly), offset o = 0.01 x (2 base + seed) per (base, seed).
OFFSETS = {("b0", 0): 0.0, ("b0", 1): 0.01, ("b1", 0): 0.02, ("b1", 1): 0.03}
A, B = 0.5, 1.4  # the family GRPO's training pass@1 follows R = B - A exp(H)


def _windows(arm: str, o: float) -> tuple[list[float], list[float] | None]:
    """(each window's entropy, each window's training pass@1; None: 0.3 + 0.5 H, rising
    with the entropy, so the fit is R² 0)."""
    sb = "spell_backward: "
    return {
        study.GRPO: ([1.0, 0.95, 0.9, 0.9, 0.85, 0.85, 0.8, 0.8], None),
        study.BONUS: ([1.0, 0.98, 0.96, 0.95, 0.94, 0.92, 0.9, 0.9], None),
        study.PASSES: ([1.0, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.4], None),
        study.CLIP_HIGHER: ([1.0, 0.8, 0.7, 0.6, 0.5, 0.5, 0.45, 0.45 + o], None),
        sb + study.GRPO: (h := [1.0, 0.7, 0.6, 0.5 + o], [B - A * math.exp(x) for x in h]),
        sb + study.BONUS: ([1.0, 0.95, 0.9, 0.9], None),
        sb + study.PASSES: ([1.0, 0.6, 0.4, 0.3], None),
        sb + study.CLIP_HIGHER: ([1.0, 0.8, 0.7, 0.6 + 2 * o], None),
    }[arm]


HELD_OUT = {study.GRPO: lambda o: 0.5 + o, study.BONUS: lambda o: 0.52 + o,
            study.PASSES: lambda o: 0.6, study.CLIP_HIGHER: lambda o: 0.58 + o,
            "spell_backward: " + study.GRPO: lambda o: 0.8,
            "spell_backward: " + study.BONUS: lambda o: 0.7 + o,
            "spell_backward: " + study.PASSES: lambda o: 0.85,
            "spell_backward: " + study.CLIP_HIGHER: lambda o: 0.9 + o}


def _runs(tmp_path) -> common.StudyRuns:
    import ml_collections

    records = []
    for arm in study.ARMS:
        for (base, seed), o in OFFSETS.items():
            entropy, accuracy = _windows(arm, o)
            accuracy = accuracy or [0.3 + 0.5 * h for h in entropy]
            rows = [{"stage": "rl", "stage_step": 10 * w + k, "step": 10 * w + k,
                     "reward_mean": accuracy[w], "entropy": entropy[w],
                     "pass@1": accuracy[w], "clip_frac": 0.01, "kl_ref": 0.001}
                    for w in range(len(entropy)) for k in range(10)]
            rows += [{"stage": "eval_base", "step": 0, "pass@1": 0.1, "format_rate": 0.5},
                     {"stage": "eval_final", "step": len(rows), "pass@1": HELD_OUT[arm](o),
                      "format_rate": 0.9}]
            workdir = tmp_path / f"{len(records)}"
            workdir.mkdir(parents=True)
            (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            (workdir / "report.json").write_text("{}")
            records.append(common.RunRecord(arm, base, seed, str(workdir),
                                            ml_collections.ConfigDict()))
    return common.StudyRuns(study.STUDY, "full", str(tmp_path), records, {})


def test_analysis_of_both_families_gives_the_hand_computed_contrasts(tmp_path):
    from grpo_jax.studies import summary as summary_lib

    analysis = study.analyze(_runs(tmp_path / "runs"))
    arms = analysis.arms
    sb = "spell_backward: "
    for family in ("", sb):
        assert arms[family + "base"]["metrics"]["pass@1"] == [0.1] * 4
        assert arms[family + study.NO_CHANGE]["metrics"]["entropy_ratio"] == [1.0] * 4
        assert arms[family + study.NO_CHANGE]["metrics"]["entropy_ratio_early"] == [1.0] * 4
        assert arms[family + study.NO_FIT]["metrics"]["fit_r2"] == [0.0] * 4
    assert arms[sb + study.GRPO]["metrics"]["fit_points"] == [4] * 4  # 40 steps: 4 windows
    assert arms[study.GRPO]["metrics"]["fit_points"] == [8] * 4  # 80 steps: 8 windows
    assert arms[sb + study.GRPO]["metrics"]["fit_a"] == pytest.approx([A] * 4)
    mean_o = 0.015  # the offsets' mean
    expected = {
        # arithmetic: GRPO's early ratio, the window ending at a third of 80 steps (rows
        # 17-26: three of 0.95, seven of 0.9) over 1.0; ratios 0.45 + o against 0.4, 0.9
        # against 0.8; the fit rises with the entropy (R² 0); held-out pass@1 0.58 + o
        # against 0.6, 0.52 + o against 0.5 + o
        (study.GRPO, study.NO_CHANGE, "entropy_ratio_early"): (3 * 0.95 + 7 * 0.9) / 10 - 1.0,
        (study.CLIP_HIGHER, study.PASSES, "entropy_ratio"): 0.45 + mean_o - 0.4,
        (study.BONUS, study.GRPO, "entropy_ratio"): 0.9 - 0.8,
        (study.GRPO, study.NO_FIT, "fit_r2"): 0.0,
        (study.CLIP_HIGHER, study.PASSES, "pass@1"): 0.58 + mean_o - 0.6,
        (study.BONUS, study.GRPO, "pass@1"): 0.02,
        # spell_backward: GRPO's early ratio, the window ending at a third of 40 steps (rows
        # 4-13: six of 1.0, four of 0.7) over 1.0; ratios 0.6 + 2 o against 0.3, 0.9 against
        # 0.5 + o; the fit exact (R² 1); held-out pass@1 0.9 + o against 0.85, 0.7 + o
        # against 0.8
        (sb + study.GRPO, sb + study.NO_CHANGE, "entropy_ratio_early"):
            (6 * 1.0 + 4 * 0.7) / 10 - 1.0,
        (sb + study.CLIP_HIGHER, sb + study.PASSES, "entropy_ratio"): 0.6 + 2 * mean_o - 0.3,
        (sb + study.BONUS, sb + study.GRPO, "entropy_ratio"): 0.9 - (0.5 + mean_o),
        (sb + study.GRPO, sb + study.NO_FIT, "fit_r2"): 1.0,
        (sb + study.CLIP_HIGHER, sb + study.PASSES, "pass@1"): 0.9 + mean_o - 0.85,
        (sb + study.BONUS, sb + study.GRPO, "pass@1"): 0.7 + mean_o - 0.8,
    }
    contrasts = summary_lib.contrasts(arms, analysis.specs)
    got = {(c["a"], c["b"], c["metric"]): c["diff"] for c in contrasts}
    assert set(got) == set(expected) == set(study.SPECS)
    for spec, diff in expected.items():
        assert got[spec] == pytest.approx(diff, abs=1e-9), spec
    assert "| spell_backward: GRPO | 4 |" in analysis.table
    (tmp_path / "out").mkdir()
    analysis.plots(str(tmp_path / "out"))
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {
        "curves.png", "fit.png", "curves_spell_backward.png", "fit_spell_backward.png"}


def test_analysis_without_family_runs_is_the_arithmetic_one(tmp_path):
    """The mini tier's case: no spell_backward run, so no family arm, contrast or figure."""
    runs = _runs(tmp_path / "runs")
    runs.runs = [r for r in runs.runs if r.arm in study.MAIN_ARMS]
    analysis = study.analyze(runs)
    assert not any(arm.startswith("spell_backward") for arm in analysis.arms)
    from grpo_jax.studies import summary as summary_lib

    assert len(summary_lib.contrasts(analysis.arms, analysis.specs)) == 6
    (tmp_path / "out").mkdir()
    analysis.plots(str(tmp_path / "out"))
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"curves.png", "fit.png"}
