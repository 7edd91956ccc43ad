"""The replication study's configs: each arm differs from its family's `all` arm in the
fields of the result it reruns, starts from its own family's roles, and the distillation
arm samples and trains on as many sequences as GRPO on the student samples; and its analysis
of every arm of a family on hand-made runs."""

import functools

import pytest

from grpo_jax.studies import configs as configs_lib
from grpo_jax.studies import families
from grpo_jax.studies import replication as rep


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


@pytest.mark.parametrize("family", rep.FAMILIES)
def test_grpo_arms_differ_from_all_in_their_fields_only(family):
    arms = rep.arm_configs("full")
    ref = arms[rep.arm_name(family, rep.ALL)]
    assert ref.task.kwargs.datasets == family and ref.stages == "eval_base,rl,eval_final"
    assert _diff(arms[rep.arm_name(family, rep.TOP)], ref) == {
        "rl.entropy_tokens": (0.2, 1.0)}
    # the on-policy arm keeps the stage's default correction, unused at staleness 0
    default = ref.rl.off_policy_correction
    assert _diff(arms[rep.arm_name(family, rep.PPO)], ref) == {
        "rl.max_staleness": (8, 0), "rl.off_policy_correction": ("none", default)}
    assert _diff(arms[rep.arm_name(family, rep.DECOUPLED)], ref) == {
        "rl.max_staleness": (8, 0), "rl.off_policy_correction": ("decoupled", default)}
    assert _diff(arms[rep.arm_name(family, rep.RL_STUDENT)], ref) == {
        "model.name": ("tiny-300k", "tiny-1m"),
        "model.init_from": (f"{family}:student", f"{family}:base")}


@pytest.mark.parametrize("family", rep.FAMILIES)
def test_distill_equal_sequences(family):
    rl = rep.arm_config("full", family, rep.RL_STUDENT).rl
    d = rep.arm_config("full", family, rep.DISTILL).distill
    sequences = 40 * 32 * 8  # the preset's GRPO steps x prompts x group, by hand: 10,240
    assert int(rl.steps) * int(rl.num_prompts) * int(rl.group_size) == sequences
    assert d.num_problems * d.num_samples == sequences == 1280 * 8
    assert d.steps * d.batch_size == sequences == 160 * 64


def test_attach_uses_the_family_roles():
    roles = {f"{f}:{r}": f"/bases/{f}-{r}" for f in rep.FAMILIES
             for r in ("base", "student", "teacher")}
    base = {"roles": roles}
    for family in rep.FAMILIES:
        config = rep.arm_config("full", family, rep.DISTILL)
        rep.attach(config, base)
        assert config.model.init_from == config.distill.student_init_from == \
            f"/bases/{family}-student"
        assert config.distill.teacher == f"/bases/{family}-teacher"
        config = rep.arm_config("full", family, rep.TOP)
        rep.attach(config, base)
        assert config.model.init_from == f"/bases/{family}-base"


def test_all_arm_is_the_teacher_stage():
    """The teacher role is the `all` arm's GRPO stage (no held-out evaluation before it)."""
    teacher = rep.base_config("full")["spell_backward:teacher"]({"spell_backward:base": "/b"})
    arm = rep.arm_config("full", "spell_backward", rep.ALL)
    assert teacher.stages == "rl,eval_final"
    assert {k for k in _diff(teacher, arm) if not k.startswith("eval_base")} == {
        "stages", "model.init_from"}


def test_claims_are_the_originals_with_family_tests():
    from grpo_jax.studies import distill_vs_rl, forking_tokens, off_policy

    originals = (forking_tokens.CLAIMS[0], off_policy.CLAIMS[1], off_policy.CLAIMS[2],
                 distill_vs_rl.CLAIMS[0])
    assert len(rep.CLAIMS) == 2 * len(originals)
    for index, claim in enumerate(rep.CLAIMS):
        original = originals[index % len(originals)]
        family = rep.FAMILIES[index // len(originals)]
        assert (claim.text, claim.expect, claim.margin) == (
            original.text, original.expect, original.margin)
        assert claim.source.startswith(original.source) and family in claim.source
        assert claim.test in rep.SPECS and all(a.startswith(family) for a in claim.test[:2])
        assert claim.failure()


def test_bad_family():
    with pytest.raises(ValueError, match="task family 'chain_sum'"):
        families.job("full", "chain_sum")


def test_mini_tier_keys_distinct():
    keys = {configs_lib.config_key(c) for c in rep.arm_configs("mini").values()}
    assert len(keys) == len(rep.ARMS)


# pass@1 per arm kind, before (eval_base) and after (eval_final) its stage; the seed adds
# its offset to every figure, so each paired difference is the same at both seeds
PASS = {rep.ALL: (0.2, 0.5), rep.TOP: (0.2, 0.6), rep.PPO: (0.2, 0.4),
        rep.DECOUPLED: (0.2, 0.45), rep.RL_STUDENT: (0.1, 0.3), rep.DISTILL: (0.1, 0.35)}
OFFSETS = {0: 0.0, 1: 0.02}


def _runs(tmp_path, family="spell_backward"):
    """Finished runs of every arm of `family` on one base at two seeds, written by hand (its
    metrics.jsonl and report.json), and the base's teacher role."""
    import json

    import ml_collections

    from grpo_jax.studies import common

    def write(workdir, rows):
        workdir.mkdir(parents=True)
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (workdir / "report.json").write_text("{}")
        return str(workdir)

    teacher = write(tmp_path / "teacher", [{"stage": "eval_final", "step": 2, "pass@1": 0.7,
                                            "pass@8": 0.9, "format_rate": 1.0}])
    bases = {"b0": {"seed": 0, "roles": {f"{family}:teacher": teacher}}}
    records = []
    for kind, (before, after) in PASS.items():
        for seed, o in OFFSETS.items():
            training = [{"stage": "rl", "stage_step": s, "step": s, "reward_mean": 0.1,
                         **({"token_frac": 0.2 + 0.1 * s} if kind == rep.TOP else {})}
                        for s in (1, 2)]
            rows = [{"stage": "eval_base", "step": 0, "pass@1": before + o, "pass@8": 0.5,
                     "format_rate": 0.8}, *training,
                    {"stage": "eval_final", "step": 3, "pass@1": after + o, "pass@8": 0.6,
                     "format_rate": 0.9}]
            workdir = write(tmp_path / f"{len(records)}", rows)
            records.append(common.RunRecord(rep.arm_name(family, kind), "b0", seed, workdir,
                                            ml_collections.ConfigDict()))
    return common.StudyRuns(rep.STUDY, "full", str(tmp_path), records, bases)


def test_analysis_of_one_family_gives_the_hand_computed_contrasts(tmp_path):
    """Every claim's contrast of a family (the mini tier runs distill - rl (student) only),
    the base, student and teacher rows and the share of tokens top20 trained, on hand-made
    runs."""
    from grpo_jax.studies import summary as summary_lib

    family = "spell_backward"
    analysis = rep.analyze(_runs(tmp_path, family))
    arms = analysis.arms
    name = functools.partial(rep.arm_name, family)
    assert list(arms) == [name(k) for k in ("base", "student", *rep.KINDS, rep.TEACHER)]
    assert arms[name("base")]["metrics"]["pass@1"] == pytest.approx([0.2, 0.22])
    assert arms[name("student")]["metrics"]["pass@1"] == pytest.approx([0.1, 0.12])
    assert arms[name(rep.TEACHER)]["metrics"]["pass@1"] == [0.7, 0.7]  # one run, each seed
    assert arms[name(rep.TOP)]["metrics"]["token_frac"] == pytest.approx([0.35, 0.35])
    assert "token_frac" not in arms[name(rep.ALL)]["metrics"]
    contrasts = {(c["a"], c["b"], c["metric"]): c
                 for c in summary_lib.contrasts(arms, analysis.specs)}
    expected = {rep.TOP: 0.1, rep.PPO: -0.1, rep.DECOUPLED: 0.05, rep.DISTILL: 0.05}
    for claim in rep.CLAIMS:
        if not claim.test[0].startswith(family):
            assert claim.test not in contrasts  # the other family's arms: not run
            continue
        kind = claim.test[0][len(family) + 2:]
        assert contrasts[claim.test]["diff"] == pytest.approx(expected[kind])
        assert contrasts[claim.test]["n"] == 2
    assert "tokens trained" in analysis.table and "35.0" in analysis.table
