"""rl_steps: its per-policy figures against hand-computed values, its long runs' configs (on
arithmetic and on spell_backward: each validates and starts from its family's base), the
analysis of constructed runs of both families against hand-computed contrasts, the twin
claims, and the boundary claims' ceiling (the headroom rule) on constructed arms. No training:
the mini tier runs arithmetic only, so the family's path is covered here."""

import json
import os

import pytest

from grpo_jax.studies import configs as configs_lib
from grpo_jax.studies import families, rl_steps
from grpo_jax.studies import summary as summary_lib

FAMILY = rl_steps.FAMILY


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


def _job_arm(tier, task):
    """The job's own GRPO stage on `task`, unstretched: the main job's, or the preset's."""
    from grpo_jax.studies import common

    if task == rl_steps.MAIN_TASK:
        return common.main_arm(tier, "rl")
    return families.grpo(tier, task, stages="rl")


@pytest.mark.parametrize("task", rl_steps.TASKS)
@pytest.mark.parametrize("tier", ["full", "mini"])
def test_the_run_is_the_jobs_rl_stage_at_factor_times_its_steps(tier, task):
    main = _job_arm(tier, task)
    config = rl_steps.arm_configs(tier)[rl_steps.name(task, rl_steps.RUN)]
    assert config.stages == "rl"
    assert config.rl.steps == rl_steps.FACTOR * main.rl.steps
    assert config.rl.checkpoint_every == main.rl.steps  # a checkpoint at the job's count
    assert config.checkpoint.max_to_keep >= rl_steps.FACTOR  # every checkpoint kept
    if config.rl.fused_steps:
        assert config.rl.checkpoint_every % config.rl.fused_steps == 0
    for field in ("algorithm", "num_prompts", "group_size", "lr", "max_new_tokens",
                  "fused_steps", "rewards"):
        assert config.rl[field] == main.rl[field]
    # the schedule is stretched as the steps are: its shape is a fraction of the stage's steps
    assert config.optim.to_dict() == main.optim.to_dict()
    assert 0 < config.optim.warmup_frac < 1
    assert config.task.to_dict() == main.task.to_dict()
    assert config.model.init_from == main.model.init_from  # "" or the family's role
    assert rl_steps.KS[-1] == rl_steps._sizes(tier)["samples"] == rl_steps.K


def test_the_family_run_is_the_presets_grpo_at_factor_times_its_steps_by_hand():
    config = rl_steps.arm_configs("full")[rl_steps.FAMILY_RUN]
    assert rl_steps.FAMILY_RUN == "spell_backward: prolonged"
    assert config.task.name == "reasoning_gym" and config.task.kwargs.datasets == FAMILY
    # the preset's 40 GRPO steps (configs/reasoning_gym_tasks.py), 5 times; host rewards
    assert (config.rl.steps, config.rl.checkpoint_every) == (200, 40)
    assert config.rl.fused_steps == 0 and config.rl.max_new_tokens == 32
    assert config.model.init_from == "spell_backward:base"
    assert "eval_base" not in config and "eval_final" not in config


def test_tiers_bases_and_arms():
    """Full tier: the base set of the main base and the family's base, both arms; mini tier:
    the main base alone and arithmetic's arm only (as fast as arithmetic alone)."""
    from grpo_jax.studies import common

    study = rl_steps.STUDY
    full = rl_steps.base_config("full")
    assert list(full) == ["base", "spell_backward:base"]
    assert configs_lib.config_hash(full["base"]) == configs_lib.config_hash(
        common.main_base("full"))
    assert configs_lib.config_hash(full["spell_backward:base"]) == configs_lib.config_hash(
        families.base("full", FAMILY))
    mini = rl_steps.base_config("mini")
    assert not isinstance(mini, dict)
    assert configs_lib.config_hash(mini) == configs_lib.config_hash(common.main_base("mini"))
    assert study.tiers["full"].arms is None and study.arms == (rl_steps.RUN, rl_steps.FAMILY_RUN)
    assert study.tiers["mini"].arms == (rl_steps.RUN,)
    assert study.attach is families.attach


def test_attach_sends_each_arm_to_its_familys_base():
    roles = {"base": "/bases/main", "spell_backward:base": "/bases/spell_backward"}
    for tier in ("full", "mini"):
        arms = rl_steps.arm_configs(tier)
        rl_steps.STUDY.attach(arms[rl_steps.RUN], {"roles": roles})
        rl_steps.STUDY.attach(arms[rl_steps.FAMILY_RUN], {"roles": roles})
        assert arms[rl_steps.RUN].model.init_from == "/bases/main"
        assert arms[rl_steps.FAMILY_RUN].model.init_from == "/bases/spell_backward"
    # the mini tier's base (a config, not a set) is the role "base" of its runs
    arm = rl_steps.arm_configs("mini")[rl_steps.RUN]
    rl_steps.STUDY.attach(arm, {"roles": {"base": "/bases/toy"}})
    assert arm.model.init_from == "/bases/toy"


def test_every_full_tier_arm_validates_on_its_base():
    """Each full-tier arm validates as the runner validates a run's config (`validate`: its
    stage fields, task, prompt bucket and context), with the shape of the base it starts
    from: its base's model and task (model.init_from cleared: the base is not built here)."""
    from grpo_jax.pipeline import KINDS, validate
    from grpo_jax.runner.inputs import prompt_bucket

    bases = rl_steps.base_config("full")
    for task in rl_steps.TASKS:
        config = rl_steps.arm_configs("full")[rl_steps.name(task, rl_steps.RUN)]
        base = bases[families.role(task) if task != rl_steps.MAIN_TASK else "base"]
        assert config.task.to_dict() == base.task.to_dict()
        assert config.model.name == base.model.name
        assert config.model.max_seq_len == base.model.max_seq_len
        config.model.init_from = ""
        config.mesh.num_devices = 1
        inputs = validate(config, KINDS)
        assert inputs.prompt_len + config.rl.max_new_tokens <= config.model.max_seq_len
        # the measurement samples the base with the prompt bucket the run measures
        assert prompt_bucket(base, inputs.task, inputs.tokenizer) == inputs.prompt_len


def _draw(*correct):
    """A draw of len(correct) problems, K completions each: `correct` of them correct."""
    return [_problem(rl_steps.K, c, rl_steps.K, 4 * rl_steps.K) for c in correct]


# The constructed measurements, per task: the base's draw per seed's key, and each run's
# checkpoints (RL step -> draw); the main job's step count is 2, the last step 4.
DRAWS = {
    rl_steps.MAIN_TASK: {"base": {0: _draw(64, 0), 1: _draw(64, 0)},
                         "steps": {2: _draw(96, 0), 4: _draw(128, 32)}},
    FAMILY: {"base": {0: _draw(16, 0), 1: _draw(0, 16)},
             "steps": {2: _draw(32, 16), 4: _draw(64, 64)}},
}


def _constructed_runs(tmp_path):
    from grpo_jax.studies.record import RunRecord, StudyRuns

    root = str(tmp_path / "rl_steps")
    bases = {key: {"seed": i, "config_hash": key, "workdir": f"/bases/{key}",
                   "roles": {"base": f"/bases/{key}", "spell_backward:base": f"/sb/{key}"}}
             for i, key in enumerate(("a", "b"))}
    records = []
    for task in rl_steps.TASKS:
        for key in bases:
            for seed in (0, 1):
                workdir = tmp_path / "runs" / f"{task}-{key}-{seed}"
                workdir.mkdir(parents=True)
                (workdir / "report.json").write_text("{}")
                (workdir / rl_steps.FILE).write_text(json.dumps(
                    {"complete": True, "main_steps": 2, "seed": seed,
                     "steps": {str(k): v for k, v in DRAWS[task]["steps"].items()}}))
                records.append(RunRecord(rl_steps.name(task, rl_steps.RUN), key, seed,
                                         str(workdir), None))
    runs = StudyRuns(rl_steps.STUDY, "full", root, records, bases)
    for task in rl_steps.TASKS:
        for key in bases:
            for seed, problems in DRAWS[task]["base"].items():
                path = rl_steps._base_file(runs, key, seed, task)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    json.dump({"problems": problems}, f)
    return runs


def test_the_base_draws_of_each_family_are_kept_apart(tmp_path):
    from grpo_jax.studies import measure as measure_lib

    runs = _constructed_runs(tmp_path)
    main = rl_steps._base_file(runs, "a", 0, rl_steps.MAIN_TASK)
    assert main == measure_lib.base_path(runs, "a", 0)  # arithmetic's where it always was
    family = rl_steps._base_file(runs, "a", 0, FAMILY)
    assert family != main and os.path.basename(os.path.dirname(family)) == FAMILY
    assert rl_steps._base_model(runs.bases["a"], FAMILY) == "/sb/a"
    assert rl_steps._base_model(runs.bases["a"], rl_steps.MAIN_TASK) == "/bases/a"
    # a mini-tier base (the main base alone): its roles hold "base" only
    assert rl_steps._base_model({"workdir": "/toy", "roles": {"base": "/toy"}},
                                rl_steps.MAIN_TASK) == "/toy"


def test_analysis_of_both_families_against_hand_computed_contrasts(tmp_path):
    """Constructed runs of both families (2 bases x 2 seeds, 2 problems x K completions):
    each family's policies read its own base draws and checkpoints, and the contrasts (all
    paired differences equal, so each is its per-pair value) are, by hand:
    arithmetic: base [64, 0]/K -> pass@1 0.25, pass@K 0.5; main steps [96, 0] -> 0.375;
      last [128, 32] -> 0.625, pass@K 1, solves problem 2 the base never does (0.5); the
      redraw is the same draw (0).
    spell_backward: base [16, 0] (seed 0) or [0, 16] (seed 1) -> pass@1 0.0625, pass@K
      0.5; main steps [32, 16] -> 0.1875, pass@K 1; last [64, 64] -> 0.5, pass@K 1, solves
      the problem its seed's base draw never does (0.5), as does the other seed's draw (0.5).
    """
    runs = _constructed_runs(tmp_path)
    analysis = rl_steps.analyze(runs)
    k = f"pass@{rl_steps.K}"
    expected = {
        rl_steps.MAIN_TASK: {("main steps", "base model", "pass@1"): 0.125,
                             ("last", "main steps", "pass@1"): 0.25,
                             ("last", "base model", k): 0.5,
                             ("last", "main steps", k): 0.5,
                             ("last", "base redraw", "only_solves_rate"): 0.5},
        FAMILY: {("main steps", "base model", "pass@1"): 0.125,
                 ("last", "main steps", "pass@1"): 0.3125,
                 ("last", "base model", k): 0.5,
                 ("last", "main steps", k): 0.0,
                 ("last", "base redraw", "only_solves_rate"): 0.0},
    }
    found = {(c["a"], c["b"], c["metric"]): c["diff"]
             for c in summary_lib.contrasts(analysis.arms, analysis.specs)}
    assert len(found) == 10  # both families' contrasts, one Holm family
    for task, contrasts in expected.items():
        for (a, b, metric), diff in contrasts.items():
            test = (rl_steps.name(task, a), rl_steps.name(task, b), metric)
            assert found[test] == pytest.approx(diff), test
    # within a family only: no contrast pairs a family's policy with arithmetic's
    for a, b, _ in analysis.specs:
        assert a.startswith(f"{FAMILY}: ") == b.startswith(f"{FAMILY}: ")
    arms = analysis.arms
    assert arms[f"{FAMILY}: base model"]["metrics"]["pass@1"] == pytest.approx([0.0625] * 4)
    assert arms["base model"]["metrics"]["pass@1"] == pytest.approx([0.25] * 4)
    assert arms[f"{FAMILY}: base redraw"]["metrics"]["only_solves_rate"] == \
        pytest.approx([0.5] * 4)
    by_step = analysis.extra["held_out_by_step"]
    assert set(by_step) == set(rl_steps.TASKS) and set(by_step[FAMILY]) == {"0", "2", "4"}
    assert by_step[FAMILY]["4"]["pass@1"]["mean"] == pytest.approx(0.5)
    assert "**arithmetic**" in analysis.table and f"**{FAMILY}**" in analysis.table
    out = tmp_path / "out"
    out.mkdir()
    analysis.plots(str(out))
    assert (out / "rl_steps.png").is_file()


def test_each_claim_has_a_family_twin():
    """Each arithmetic claim with a test has one twin on spell_backward: the same text,
    expectation and margin, its source with the family said, its test on the family's
    policies (within the family) and its own can-fail statement."""
    tested = [c for c in rl_steps.ARITHMETIC_CLAIMS if c.test is not None]
    twins = rl_steps.CLAIMS[len(rl_steps.ARITHMETIC_CLAIMS):]
    assert len(twins) == len(tested) == 5
    assert rl_steps.CLAIMS[:len(rl_steps.ARITHMETIC_CLAIMS)] == rl_steps.ARITHMETIC_CLAIMS
    for original, twin in zip(tested, twins):
        assert (twin.text, twin.expect, twin.margin) == (
            original.text, original.expect, original.margin)
        assert twin.source == f"{original.source}; rerun on reasoning-gym's {FAMILY}"
        assert twin.test == tuple(rl_steps.name(FAMILY, x) for x in original.test[:2]) \
            + (original.test[2],)
        assert twin.test in rl_steps.SPECS and original.test in rl_steps.SPECS
        assert twin.failure() and twin.failure() != original.failure()
        assert "spell_backward: " in twin.failure()  # the rule's statement names its arms
        if original.headroom is None:
            assert twin.headroom is None
        else:
            assert twin.headroom == (rl_steps.name(FAMILY, original.headroom[0]),
                                     *original.headroom[1:])
    assert len(rl_steps.SPECS) == len(set(rl_steps.SPECS)) == 10


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
