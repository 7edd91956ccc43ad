"""test_time_scaling's own arithmetic against hand-computed values (the crossing of a curve
in log2 k, the exchange estimate, the per-problem curves and the geometric summary), its
configs (the runs and bases it shares with pass_at_k, budget_forcing and replication are
theirs), and its samples part on reasoning-gym's spell_backward without training: the family
arm's config validates, `attach` sends each arm to its role, a spelled word's votes are
graded alike, and the analysis of constructed draws gives the family's contrasts by hand."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest

from grpo_jax.studies import budget_forcing, common, pass_at_k
from grpo_jax.studies import test_time_scaling as tts

KS = (1, 2, 4, 8)
CURVE = (0.2, 0.4, 0.6, 0.8)


def test_crossing_is_linear_in_log2_k_between_the_points_around_it():
    # 0.5 lies halfway between 0.4 (k = 2) and 0.6 (k = 4): log2 k* = 1.5, k* = 2 ** 1.5
    assert tts.crossing_samples(KS, CURVE, 0.5) == pytest.approx(2 ** 1.5)
    # 0.45 a quarter of the way: log2 k* = 1.25
    assert tts.crossing_samples(KS, CURVE, 0.45) == pytest.approx(2 ** 1.25)
    # a measured point reached exactly is that k
    assert tts.crossing_samples(KS, CURVE, 0.6) == pytest.approx(4.0)


def test_crossing_at_the_first_point_beyond_the_last_and_on_a_curve_that_falls():
    assert tts.crossing_samples(KS, CURVE, 0.1) == 1.0  # the base already reaches it
    assert tts.crossing_samples(KS, CURVE, 0.2) == 1.0
    assert tts.crossing_samples(KS, CURVE, 0.9) is None  # never within the largest k
    assert tts.crossing_samples(KS, (0.2, 0.4, None, None), 0.5) is None  # not measured
    # the first crossing counts: up to 0.7 at k = 2, down, and up again
    assert tts.crossing_samples(KS, (0.3, 0.7, 0.4, 0.9), 0.5) == pytest.approx(
        2 ** (0.2 / 0.4))
    # an unmeasured point in the middle is skipped: the crossing is between k = 1 and 4
    assert tts.crossing_samples(KS, (0.2, None, 0.6, 0.8), 0.4) == pytest.approx(
        2 ** (0.5 * 2))


def test_exchange_converts_the_rl_pass_at_1_into_the_base_samples_and_tokens():
    base = {"pass": dict(zip(KS, CURVE)), "maj": dict(zip(KS, (0.2, 0.3, 0.4, 0.45))),
            "length": 20.0}
    rl = {"pass": {1: 0.5, 2: 0.7, 4: 0.8, 8: 0.9}, "length": 18.0}
    out = tts.exchange(base, rl, KS)
    assert out["k_pass"] == pytest.approx(2 ** 1.5)
    assert out["log2_k_pass"] == pytest.approx(1.5)
    assert out["tokens_pass"] == pytest.approx(2 ** 1.5 * 20.0)
    assert out["k_maj"] is None and out["tokens_maj"] is None  # 0.45 < 0.5 at k = 8
    assert out["rl_tokens"] == 18.0


def _problem(answers, correct, tokens):
    return {"operators": 2, "samples": len(answers), "correct": sum(correct),
            "formatted": len(answers), "tokens": tokens, "answers": answers,
            "correct_flags": "".join("1" if c else "0" for c in correct)}


def test_curves_from_counts_by_hand():
    # problem 1: 1 correct of 4 ("7"); votes 7, 3, 3, None
    # problem 2: 2 correct of 4 ("5"); votes 5, 5, 2, 9
    problems = tts.reduce_problems([
        _problem(["7", "3", "3", None], [True, False, False, False], 40),
        _problem(["5", "5", "2", "9"], [True, True, False, False], 24)], max_k=4)
    assert [p["distinct"] for p in problems] == [2, 3]
    curve = tts.curves(problems, (1, 2, 4))
    # pass@1 = mean(1/4, 2/4); pass@2 = mean(1 - C(3,2)/C(4,2), 1 - C(2,2)/C(4,2))
    assert curve["pass"][1] == pytest.approx((0.25 + 0.5) / 2)
    assert curve["pass"][2] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert curve["pass"][4] == pytest.approx(1.0)
    # maj@1 = pass@1 of the answered samples: problem 1 has 1 correct of 4, problem 2 2 of 4
    assert curve["maj"][1] == pytest.approx((0.25 + 0.5) / 2)
    # maj@4: problem 1's vote over all four is "3" (wrong); problem 2's is "5" (right)
    assert curve["maj"][4] == pytest.approx(0.5)
    assert curve["length"] == pytest.approx(64 / 8)
    assert curve["distinct"] == pytest.approx(2.5)


def test_maj_at_k_stops_at_the_largest_k_computed():
    problems = tts.reduce_problems([_problem(["1"] * 8, [True] * 8, 8)], max_k=4)
    assert sorted(problems[0]["maj"], key=int) == ["1", "2", "4"]
    assert tts.curves(problems, (1, 2, 4, 8))["maj"][8] is None


def test_geometric_summary_of_k():
    # log2 k of 1 and 3: geometric mean 2 ** 2 = 4; a run that never reaches it is left out
    found = tts._geometric([1.0, 3.0, None])
    assert found["n"] == 2 and found["mean"] == pytest.approx(4.0)
    lo, hi = found["ci95"]
    assert lo < 4.0 < hi and lo * hi == pytest.approx(16.0)  # symmetric in log2


def _resolved(config, init_from: str, seed: int = 0):
    config = common.for_tier(copy.deepcopy(config), "full")
    config.model.init_from, config.seed = init_from, seed
    return common.config_hash(config)


def test_the_rl_arm_is_pass_at_k_run_and_the_bases_are_budget_forcing_ones():
    base = {"roles": {"base": "/w/bases/main", "wait_redo": "/w/bases/wait"}}
    rl = tts.arm_config("full", tts.RL)
    tts.attach(rl, base)
    assert rl.model.init_from == "/w/bases/main"
    assert _resolved(rl, rl.model.init_from) == _resolved(pass_at_k.arm_config("full"),
                                                         "/w/bases/main")
    for tier in ("full", "mini"):
        roles, mine = budget_forcing.base_config(tier), tts.base_config(tier)
        assert common.config_hash(mine["base"]) == common.config_hash(roles["main"])
        assert common.config_hash(mine["wait_redo"]) == common.config_hash(roles["wait_redo"])


def test_the_e3_arm_is_budget_forcings_wait_seen_arm_at_the_training_budget():
    base = {"roles": {"base": "/w/bases/main", "wait_redo": "/w/bases/wait"}}
    e3 = tts.arm_config("full", tts.E3)
    tts.attach(e3, base)
    assert e3.model.init_from == "/w/bases/wait"
    assert e3.rl.max_new_tokens == tts.TRAIN_BUDGET
    seen = budget_forcing.arm_config("full", budget_forcing.SEEN)
    seen.rl.max_new_tokens = tts.TRAIN_BUDGET
    assert _resolved(e3, "/w/bases/wait") == _resolved(seen, "/w/bases/wait")
    assert max(b for _, _, b in tts.BUDGETS.values()) > tts.TRAIN_BUDGET


def test_a_bad_arm_is_one_line():
    with pytest.raises(ValueError, match="arm rl, e3, spell_backward: rl; got 'nope'"):
        tts.arm_config("full", "nope")


def test_every_claimed_condition_is_measured_at_the_mini_tier():
    measured = {tts.budget_arm(model, c) for model, conditions in tts.MINI.items()
                for c in conditions}
    for claim in tts.CLAIMS:
        a, b, metric = claim.test
        if metric == "pass@1":
            assert {a, b} <= measured, claim.text
    assert all(math.isfinite(c.margin) for c in tts.CLAIMS)


def test_the_table_pairs_each_condition_with_its_models_reference(tmp_path):
    """e3's differences are to its training budget, the others' to unforced; the plot is
    written from the same arms."""
    def arm(pass1, length):
        return {"seeds": [0, 1], "bases": ["b", "b"],
                "metrics": {"pass@1": list(pass1), "mean_length": [length] * 2,
                            "format_rate": [1.0, 1.0]}}

    arms = {tts.budget_arm(tts.E3, "budget=32"): arm((0.40, 0.50), 30.0),
            tts.budget_arm(tts.E3, "budget=48"): arm((0.50, 0.62), 34.0),
            tts.budget_arm(tts.WAIT_BASE, "budget=32"): arm((0.20, 0.30), 28.0),
            tts.budget_arm(tts.WAIT_BASE, "unforced"): arm((0.30, 0.40), 31.0)}
    text = tts.table(arms, tts.KS)
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line
            for line in text.splitlines() if line.startswith(("| e3", "| wait base"))}
    # e3 at 48 - e3 at 32: +10 and +12 points, mean +11.0; the reference row has none
    assert "| +11.0 [" in rows[("e3", "budget=48")]
    assert rows[("e3", "budget=32")].split("|")[4].strip() == "-"
    # the "Wait" base at 32 - unforced: -10 both seeds
    assert "-10.0" in rows[("wait base", "budget=32")]
    tts.plot(arms, tts.KS, str(tmp_path))
    assert (tmp_path / "test_time_scaling.png").exists()


# ---- the samples part on reasoning-gym's spell_backward ---------------------------------------

FAMILY_ROLES = {"base": "/w/bases/main", "wait_redo": "/w/bases/wait",
                "spell_backward:base": "/w/bases/spell"}


def test_attach_sends_each_arm_to_its_role():
    """rl from the main base, e3 from the "Wait" base, the family arm from the family's base
    of the same base set."""
    expected = {tts.RL: "/w/bases/main", tts.E3: "/w/bases/wait",
                tts.FAMILY_RL: "/w/bases/spell"}
    for arm, config in tts.arm_configs("full").items():
        tts.attach(config, {"roles": FAMILY_ROLES})
        assert config.model.init_from == expected[arm], arm


def test_the_family_arm_and_base_are_replications_and_the_mini_tier_is_arithmetic():
    """The family arm is replication's `spell_backward: all` run and its role replication's
    base (one run each in a shared workdir); the full tier's base set is `with_family`'s
    plus the "Wait" base; the mini tier builds and runs arithmetic only."""
    from grpo_jax.studies import configs as configs_lib
    from grpo_jax.studies import families, replication

    arm = tts.arm_config("full", tts.FAMILY_RL)
    assert arm.model.init_from == "spell_backward:base"
    assert arm.task.kwargs.datasets == "spell_backward"
    assert configs_lib.config_key(arm) == configs_lib.config_key(
        replication.arm_configs("full")[families.arm_name("spell_backward", replication.ALL)])
    full = tts.base_config("full")
    assert list(full) == ["base", "wait_redo", "spell_backward:base"]
    assert common.config_hash(full["spell_backward:base"]) == common.config_hash(
        replication.base_config("full")["spell_backward:base"])
    assert list(tts.base_config("mini")) == ["base", "wait_redo"]
    assert tts.STUDY.tiers["mini"].arms == (tts.RL, tts.E3)
    assert tts.STUDY.tiers["full"].arms is None and tts.FAMILY_RL in tts.STUDY.arms


@pytest.mark.parametrize("which", ["arm", "base"])
def test_the_family_configs_validate_as_the_runner_validates_them(which):
    """The full tier's family arm (its base role left out: a fresh model of the preset's
    size) and the family's base pass the runner's start-up validation, so the prompt bucket
    and the evaluation's token limit fit the preset's context; the sampling uses the
    evaluation's limit."""
    from grpo_jax.pipeline import KINDS, validate

    config = (tts.arm_config("full", tts.FAMILY_RL) if which == "arm"
              else tts.base_config("full")["spell_backward:base"])
    config.model.init_from = ""
    config.mesh.num_devices = 1
    inputs = validate(config, KINDS)
    assert inputs.prompt_len + config.eval_final.max_new_tokens <= config.model.max_seq_len
    assert config.eval_final.max_new_tokens == 32 and config.task.eval_size == 128


def _spell_task():
    from grpo_jax.studies import families
    from grpo_jax.tasks import get_task

    config = families.job("full", "spell_backward")
    return get_task(config.task.name, **config.task.kwargs.to_dict())


def test_a_spelled_words_votes_are_graded_alike():
    """spell_backward's scorer compares lower-cased strings exactly; the normalised answers
    merge "olleh" and "olleh." (graded apart), so a vote is the answer with its grade: every
    vote's samples then share one grade, and maj@4 of (right, right., right., wrong) is the
    majority's "olleh." (wrong), not the first sample's grade of the merged answer."""
    from grpo_jax.studies import measure as measure_lib

    task = _spell_task()
    example = task.examples("test", 1, seed=0)[0]
    right = example.answer
    wrong = right[:-1] + ("a" if right[-1] != "a" else "b")
    texts = [right, right.upper(), right + ".", wrong, f" {right} "]
    answers = [measure_lib.answer_key(task.extract_answer(f"<answer>{t}</answer>"))
               for t in texts]
    flags = [task.accuracy_reward(f"<answer>{t}</answer>", example) >= 1.0 for t in texts]
    assert flags == [True, True, False, False, True]
    assert answers[0] == answers[1] == answers[2] == answers[4] != answers[3]
    graded = {}
    for vote, ok in zip(tts.vote_keys(answers, flags), flags):
        graded.setdefault(vote, set()).add(ok)
    assert all(len(g) == 1 for g in graded.values()) and len(graded) == 3
    picked = [0, 2, 2, 3]  # right, right., right., wrong
    problems = tts.reduce_problems([_problem([answers[i] for i in picked],
                                             [flags[i] for i in picked], 20)], max_k=4)
    assert problems[0]["distinct"] == 3
    assert problems[0]["maj"]["1"] == pytest.approx(0.25)
    assert problems[0]["maj"]["4"] == pytest.approx(0.0)


N = 256  # samples per problem at the full tier


def _draw(correct, maj=None, tokens=8):
    """A reduced draw (`reduce_problems`' format) of problems with `correct` of N right,
    maj@k per problem constant in k unless `maj` gives {k: value} per problem."""
    problems = []
    for i, c in enumerate(correct):
        m = {str(k): (maj[i].get(k, c / N) if maj else c / N) for k in tts.KS
             if k <= tts.MAJ_MAX_K}
        problems.append({"operators": 0, "samples": N, "correct": c, "formatted": N,
                         "tokens": tokens * N, "distinct": 1, "maj": m})
    return {"problems": problems}


def _finished(path, draw):
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "report.json").write_text("{}")
    (path / tts.SAMPLES_FILE).write_text(json.dumps(draw))


def _write(path, draw):
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(draw))


def test_the_analysis_gives_the_familys_contrasts_by_hand(tmp_path):
    """Two base sets, one seed: the family's base model and RL policy draws (and arithmetic's,
    with other figures) give the family's contrasts by hand, within the family, and the
    exchange estimate of the family's base curve."""
    from grpo_jax.studies import summary as summary_lib
    from grpo_jax.studies.record import RunRecord, StudyRuns

    root = tmp_path / "study"
    bases = {b: {"seed": 0, "roles": {}} for b in ("b0", "b1")}
    records = []
    # family: base b0 solves problem 2 always and problem 1 never (pass@k 0.5 at every k);
    # base b1 problem 1 in 64 of 256, problem 2 always; its maj@64 on problem 1 is 0.9
    family_base = {"b0": _draw([0, N]), "b1": _draw([64, N], maj=[{64: 0.9}, {}])}
    family_rl = {"b0": _draw([128, N], tokens=6), "b1": _draw([96, N], tokens=6)}
    arithmetic = _draw([N, N])  # arithmetic's base and RL policy: every sample right
    for b in bases:
        for arm, draw in ((tts.FAMILY_RL, family_rl[b]), (tts.RL, arithmetic)):
            workdir = tmp_path / "runs" / f"{b}-{arm.replace(':', '').replace(' ', '_')}"
            _finished(workdir, draw)
            records.append(RunRecord(arm, b, 0, str(workdir), None))
        _write(root / "spell_backward_base_model" / f"{b},seed=0,{tts.SAMPLES_FILE}",
               family_base[b])
        _write(root / "base_model" / f"{b},seed=0,{tts.SAMPLES_FILE}", arithmetic)
    runs = StudyRuns(tts.STUDY, "full", str(root), records, bases)
    analysis = tts.analyze(runs)
    arms = analysis.arms
    family = {(c["a"], c["b"], c["metric"]): c
              for c in summary_lib.contrasts(arms, analysis.specs)}
    base1, rl1, base64 = (tts.samples_arm(tts.FAMILY_BASE, 1), tts.samples_arm(tts.FAMILY_RL, 1),
                          tts.samples_arm(tts.FAMILY_BASE, 64))
    # pass@1: base b0 (0 + 1) / 2 = 0.5, b1 (0.25 + 1) / 2 = 0.625; RL b0 0.75, b1 0.6875
    assert arms[base1]["metrics"]["pass@k"] == pytest.approx([0.5, 0.625])
    assert arms[rl1]["metrics"]["pass@k"] == pytest.approx([0.75, 0.6875])
    gain = family[(rl1, base1, "pass@k")]
    assert gain["diff"] == pytest.approx((0.25 + 0.0625) / 2)
    # maj@64 - maj@1 of the family base: b0 0, b1 ((0.9 - 0.25) + 0) / 2 = 0.325
    assert family[(base64, base1, "maj@k")]["diff"] == pytest.approx(0.325 / 2)
    # the pass@k check: b0 0; b1 problem 1 pass@64 = 1 - C(192, 64) / C(256, 64)
    pass64 = (1 - math.comb(N - 64, 64) / math.comb(N, 64) + 1) / 2
    assert family[(base64, base1, "pass@k")]["diff"] == pytest.approx((pass64 - 0.625) / 2)
    # arithmetic's contrasts stay on arithmetic's draws (every sample right: no gain)
    assert family[(tts.samples_arm(tts.RL, 1), tts.samples_arm(tts.BASE, 1), "pass@k")][
        "diff"] == pytest.approx(0.0)
    # exchange: b0's base curve stays at 0.5 < 0.75 (not reached); b1's crosses 0.6875
    # between k = 1 (0.625) and k = 2 ((1 - C(192, 2) / C(256, 2) + 1) / 2), linear in log2 k
    pass2 = (1 - math.comb(N - 64, 2) / math.comb(N, 2) + 1) / 2
    metrics = arms[tts.FAMILY_GAIN]["metrics"]
    assert metrics["k_pass"][0] is None
    crossing = 2 ** ((0.6875 - 0.625) / (pass2 - 0.625))
    assert metrics["k_pass"][1] == pytest.approx(crossing)
    assert metrics["tokens_pass"][1] == pytest.approx(crossing * 8)
    assert metrics["rl_tokens"] == pytest.approx([6.0, 6.0])
    summary = analysis.extra["exchange"]["spell_backward"]
    assert (summary["pass"]["reached"], summary["pass"]["not_reached"]) == (1, 1)
    assert "Samples on spell_backward" in analysis.table
    analysis.plots(str(tmp_path))
    assert (tmp_path / "test_time_scaling.png").exists()


def test_the_family_claims_twin_the_samples_claims():
    """Each claim of the samples part has a twin on spell_backward: the same text, margin,
    kind and expectation, its source said rerun there, its test on the family's arms (in the
    Holm family) and a can-fail statement of its own; the thinking-budget claims have none."""
    samples = [c for c in tts.ARITHMETIC_CLAIMS if c.test[2] in ("pass@k", "maj@k")]
    assert len(tts.FAMILY_CLAIMS) == len(samples) == 3
    for original, twin in zip(samples, tts.FAMILY_CLAIMS):
        assert (twin.text, twin.margin, twin.kind, twin.expect) == (
            original.text, original.margin, original.kind, original.expect)
        assert twin.source == f"{original.source}; rerun on reasoning-gym's spell_backward"
        assert twin.test == (f"spell_backward: {original.test[0]}",
                             f"spell_backward: {original.test[1]}", original.test[2])
        assert twin.test in tts.SPECS and "spell_backward" in twin.failure()
        assert twin.failure() != original.failure()
    assert len(tts.SPECS) == len(tts.CLAIMS) + 2  # and each family's RL pass@1 gain


def test_every_claim_says_how_its_test_could_fail_here():
    """Each claim says how its test could fail here (`why`) before the rule's statement, not
    the rule's alone (a check says in can_fail why it cannot fail)."""
    for claim in tts.CLAIMS:
        if claim.kind == "claim":
            rule = dataclasses.replace(claim, why="").failure()
            assert claim.why and claim.failure() == f"{claim.why}; {rule}", claim.test
        else:
            assert claim.failure().startswith("no: "), claim.test
