"""python -m grpo_jax.studies: `list`, and `run NAME --tier=mini` for every ported study from
one temporary workdir (the mini tier is the full pipeline at toy size: shared bases keyed by
their config, paired runs, analysis, summary.json in the schema, table.md, plots, README
block), without writing into experiments/."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from grpo_jax import studies
from grpo_jax.studies import __main__ as cli
from grpo_jax.studies import common
from grpo_jax.studies import summary as summary_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree_digest(path: str) -> str:
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(full.encode())
            with open(full, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def test_list_names_every_study_with_its_tiers(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    folder = os.path.join(ROOT, "experiments")
    assert sorted(studies.NAMES) == sorted(
        n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n)))
    for name in studies.NAMES:
        assert out.count(f"{name}:") == 1, name
    for name in studies.NAMES:
        study = studies.get(name)
        assert set(study.tiers) == {"full", "mini"}
        assert "  mini: " in out and "  full: " in out


def test_publish_is_refused_for_the_mini_tier(tmp_path, capsys):
    code = cli.main(["run", studies.NAMES[0], "--tier=mini", f"--workdir={tmp_path}",
                     "--publish"])
    assert code == 2 and "--publish" in capsys.readouterr().err


def test_run_names_every_study_before_running_any(tmp_path, capsys):
    code = cli.main(["run", studies.NAMES[0], "bogus", "--tier=mini", f"--workdir={tmp_path}"])
    assert code == 2 and "unknown study 'bogus'" in capsys.readouterr().err
    assert not os.listdir(tmp_path)  # nothing ran, not even the first study


def test_a_run_another_process_holds_is_skipped_and_said(tmp_path, capsys, monkeypatch):
    """A second `studies run` on a workdir in use skips the run the first holds (its run
    lock), runs the others and leaves the analysis to the same command later; an unusable
    --workdir is one line."""
    from grpo_jax import pipeline
    from grpo_jax.runner.guards import WorkdirLock

    def train(config, workdir):  # a run as Run holds it: the workdir's lock, then a report
        del config
        lock = WorkdirLock(workdir)
        lock.acquire()
        try:
            with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as f:
                f.write("{}")
        finally:
            lock.release()

    monkeypatch.setattr(pipeline, "train_and_evaluate", train)
    study = common.Study(name="held", question="?", arms=("a",),
                         tiers={"mini": common.Tier(bases=(), seeds=(0, 1), cost="")},
                         arm_configs=lambda tier: {"a": common.main_job("smoke")},
                         analyze=lambda runs: pytest.fail("analysed with a run in progress"))
    records = common.plan(study, "mini", str(tmp_path), {})
    os.makedirs(records[0].workdir)
    first = WorkdirLock(records[0].workdir)  # the other process, mid-run
    first.acquire()
    try:
        assert common.execute(study, "mini", str(tmp_path), argv=["test"]) is None
    finally:
        first.release()
    out = capsys.readouterr().out
    assert f"skip run 1/2: a  seed=0: process {os.getpid()} is running it in " \
           f"{records[0].workdir}" in out
    assert "held: not analysed: 1 of 2 runs are in progress in another process" in out
    assert not records[0].finished and records[1].finished
    assert cli.main(["run", studies.NAMES[0], "--tier=mini",
                     "--workdir=/proc/grpo_jax_no_such/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: --workdir: '/proc/grpo_jax_no_such/x' cannot be " \
                                    "created" in err, err


def test_a_run_records_the_instruction_set_its_numbers_depend_on(tmp_path, monkeypatch):
    """machine() reads the CPU's model and its widest x86 vector set from cpuinfo (XLA
    compiles for it, and one config gives other weights under another), with XLA_FLAGS."""
    from grpo_jax.machine import machine

    def info(flags):
        path = tmp_path / f"cpuinfo-{len(flags)}"
        path.write_text("processor\t: 0\nmodel name\t: Test CPU 9\nflags\t\t: "
                        f"fpu {flags}\n\nprocessor\t: 1\nflags\t\t: fpu\n")
        return str(path)

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    found = machine(info("sse4_2 avx avx2 fma avx512f avx512bw"))
    assert found["cpu"] == "Test CPU 9" and found["isa"] == "AVX512"
    assert found["xla_flags"] == "--xla_cpu_max_isa=AVX2"
    assert machine(info("sse4_2 avx fma"))["isa"] == "AVX"
    assert machine(info("sse4_2"))["isa"] == "SSE4_2" and machine(info(""))["isa"] is None
    assert machine(str(tmp_path / "missing"))["isa"] is None


def test_the_machine_fingerprint_repeats_and_follows_the_data():
    """fingerprint() hashes every loss of a short main-base pretraining: the same run twice
    gives the same hash on one machine, another seed (other data and weights) another hash,
    and a bad step count is refused before anything runs."""
    from unittest import mock

    from grpo_jax.machine import machine
    from grpo_jax.studies import configs
    from grpo_jax.studies.fingerprint import fingerprint

    first, again = fingerprint(1, tier="mini"), fingerprint(1, tier="mini")
    assert first == again and len(first["fingerprint"]) == 16 and first["steps"] == 1
    assert first["machine"].startswith(f"{machine()['cpu']} (")
    built = configs.main_base

    def reseeded(tier):
        config = built(tier)
        config.seed += 1
        return config
    with mock.patch.object(configs, "main_base", reseeded):
        other = fingerprint(1, tier="mini")
    assert other["fingerprint"] != first["fingerprint"]
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        fingerprint(0)


def test_a_studys_compute_is_the_stage_time_its_runs_and_bases_recorded(tmp_path):
    """stage_time sums the stages' wall time of each finished run once (a run listed twice,
    as two studies' shared run, counts once; an unfinished run counts nothing), run_commits
    names each finished run's commit once, and the results block's header says the time
    beside the analysing command's own."""
    import json

    from grpo_jax.studies import publish
    from grpo_jax.studies.runs import run_commits, run_machines, stage_time

    for name, timing, commit in (
            ("a", {"rl": {"wall_s": 1200.0}, "eval_final": {"wall_s": 30.5}}, "f" * 40),
            ("b", {"pretrain": {"wall_s": 4400.0}}, "e" * 40)):
        os.makedirs(tmp_path / name)
        machine = {"cpu": "AMD EPYC", "isa": "AVX2", "cpus": 2, "xla_flags": ""}
        (tmp_path / name / "report.json").write_text(json.dumps(
            {"timing": timing, "provenance": {"commit": commit,
                                              **({"machine": machine} if name == "a" else {})}}))
    os.makedirs(tmp_path / "unfinished")
    runs = [str(tmp_path / n) for n in ("a", "a", "unfinished")]
    assert stage_time(runs) == 1230.5 and stage_time([str(tmp_path / "b")]) == 4400.0
    assert run_commits(runs) == ["f" * 40]
    assert run_commits([str(tmp_path / n) for n in ("b", "a")]) == ["e" * 40, "f" * 40]
    assert run_machines(runs) == ["AMD EPYC (AVX2)"]  # b's code did not record its machine
    assert run_machines([str(tmp_path / n) for n in ("b", "a")]) == ["AMD EPYC (AVX2)",
                                                                     "unrecorded"]
    capped = {"cpu": "AMD EPYC", "isa": "AVX512", "cpus": 2,
              "xla_flags": "--xla_foo=1 --xla_cpu_max_isa=avx2"}
    os.makedirs(tmp_path / "c")
    (tmp_path / "c" / "report.json").write_text(json.dumps(
        {"timing": {}, "provenance": {"commit": "f" * 40, "machine": capped}}))
    assert run_machines([str(tmp_path / n) for n in ("a", "c")]) == [
        "AMD EPYC (AVX2)", "AMD EPYC (AVX512, capped at AVX2)"]
    result = {"study": "t", "tier": "full", "contrasts": [],
              "provenance": {"commit": "c" * 40, "run_commits": ["r" * 40],
                             "wall_time_s": 12.0, "runs_time_s": 9000.0,
                             "bases_time_s": 1230.5},
              "protocol": {"problems": 8, "samples_per_problem": 2, "eval_seed": 0,
                           "problems_fixed_across_seeds": True, "seeds": [0, 1]}}
    header = publish.generated_block(result, common.Analysis(arms={}, specs=[]))
    assert "(analysis at ccccccc; runs at rrrrrrr; its runs' stages 2.5 h, its bases' " \
           "21 min, the analysing command 12 s)." in header.splitlines()[0]


def test_a_failing_study_is_said_and_the_ones_after_it_run(tmp_path, capsys, monkeypatch):
    """`run A B C` with B raising: A and C still run, B's error is named on stderr with its
    traceback, and the exit status is 1; `run B` alone raises as it is."""
    first, failing, last = studies.NAMES[:3]
    called = []

    def execute(study, tier, workdir, **kwargs):
        called.append(study.name)
        if study.name == failing:
            raise RuntimeError("a mended bug")
        return None  # as when another process holds its runs: said by execute, skipped

    monkeypatch.setattr(common, "execute", execute)
    code = cli.main(["run", first, failing, last, "--tier=mini", f"--workdir={tmp_path}"])
    assert (code, called) == (1, [first, failing, last])
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a mended bug" in err
    assert f"[studies] {failing} failed: RuntimeError: a mended bug; the studies after it " \
           "go on" in err
    assert err.rstrip().splitlines()[-1] == (
        f"error: run: 1 of 3 studies failed: {failing} (each one's traceback above)")
    with pytest.raises(RuntimeError, match="a mended bug"):
        cli.main(["run", failing, "--tier=mini", f"--workdir={tmp_path}"])


def test_a_field_at_its_listed_neutral_value_leaves_the_hash_as_it_was(monkeypatch):
    from grpo_jax.studies import configs

    config = common.main_job("smoke")
    before = common.config_hash(config)
    monkeypatch.setattr(configs, "NEUTRAL_DEFAULTS", {**configs.NEUTRAL_DEFAULTS,
                                                      "rl.new_option": "off",
                                                      "task.new_knob": 0})
    added = common.main_job("smoke")
    added.rl.new_option, added.task.new_knob = "off", 0
    assert common.config_hash(added) == before  # a new field at its neutral value: same runs
    added.rl.new_option = "on"
    assert common.config_hash(added) != before
    added.rl.new_option, added.task.new_knob = "off", 1
    assert common.config_hash(added) != before
    # a stage-kind key applies to every section of that kind, whatever its name
    other = common.main_job("smoke")
    other.rl2 = other.rl.copy_and_resolve_references()
    plain = common.config_hash(other)
    other.rl2.new_option = "off"
    assert common.config_hash(other) == plain


def test_bases_are_keyed_by_their_resolved_config(tmp_path):
    config = common.main_job("smoke")
    config.stages = "pretrain"
    other = common.main_job("smoke")
    other.stages = "pretrain"
    assert common.config_hash(config) == common.config_hash(other)
    other.pretrain.steps += 1
    assert common.config_hash(config) != common.config_hash(other)
    other = common.main_job("smoke")
    other.stages = "pretrain"
    other.compilation_cache_dir = "/elsewhere"  # where caches live does not change a run
    assert common.config_hash(config) == common.config_hash(other)
    # a base directory built for another config is never reused
    config.seed = 0
    key = f"s0-{common.config_hash(config)[:10]}"
    os.makedirs(tmp_path / "bases" / key)
    (tmp_path / "bases" / key / "base_config_hash").write_text("0" * 64)
    with pytest.raises(RuntimeError, match="another config"):
        common.build_base(config, str(tmp_path), 0)


def test_an_arms_readable_link_follows_its_current_config(tmp_path):
    """A study's readable path of a run (<study>/runs/<arm>/<base>,seed=<s>) points at the
    directory of the arm's current config, also after the arm's config changed."""
    config = common.main_job("smoke")
    link = str(tmp_path / "study" / "runs" / "arm" / "seed=0")

    def record(cfg):
        run = str(tmp_path / "runs" / common.config_hash(cfg)[:16])
        return common.RunRecord("arm", "", 0, run, cfg, link)

    first = record(config)
    common.link_run(first)
    common.link_run(first)  # again: unchanged
    assert os.path.realpath(link) == os.path.realpath(first.workdir)
    changed = common.main_job("smoke")
    changed.rl.epsilon = 0.3
    second = record(changed)
    common.link_run(second)
    assert second.workdir != first.workdir
    assert os.path.realpath(link) == os.path.realpath(second.workdir)
    # the earlier run is left where it was, still marked with its own config's hash
    assert (open(os.path.join(first.workdir, "run_config_hash")).read().strip()
            == common.config_hash(config))


def _bases(summary: dict, workdir: str) -> dict:
    """The bases a summary.json names, as `common.plan` takes them (their roles' dirs)."""
    bases = {}
    for key, base in summary["protocol"]["bases"].items():
        roles = {role: os.path.join(workdir, "bases", d) for role, d in base["roles"].items()}
        bases[key] = {**base, "roles": roles, "workdir": next(iter(roles.values()))}
    return bases


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    """One workdir per process: a worker that runs other modules' tests between the mini
    tiers and the sharing checks keeps it (a module-scoped one would be made anew)."""
    return str(tmp_path_factory.mktemp("studies"))


# The mini tiers run in two xdist groups (pytest.ini's --dist loadgroup), one worker each
# when there are two: the first eleven studies, the later ones that ask for their runs
# (REUSING: one workdir makes those runs once) and the sharing checks after them (which see
# those studies' runs in one workdir); and the other later ones.
STUDIES_GROUP = pytest.mark.xdist_group("studies")
FIRST = studies.NAMES[:studies.NAMES.index("tool_use") + 1]
# sharpening and test_time_scaling sample pass_at_k's runs; onpolicy_distill and
# distillation_bias start from distill_vs_rl's bases, and their GRPO arm (and
# onpolicy_distill's R1 arm) is distill_vs_rl's run
REUSING = ("sharpening", "onpolicy_distill", "test_time_scaling", "distillation_bias")


def _grouped(name):
    group = "studies" if name in FIRST + REUSING else "studies_later"
    return pytest.param(name, marks=pytest.mark.xdist_group(group), id=name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [_grouped(n) for n in studies.NAMES])
def test_mini_tier(name, workdir):
    experiments = os.path.join(ROOT, "experiments", name)
    before = _tree_digest(experiments)
    study = studies.get(name)
    result = common.execute(study, "mini", workdir, argv=["test", name])
    assert _tree_digest(experiments) == before  # nothing published without --publish
    out = os.path.join(workdir, name, "out")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        loaded = json.load(f)
    summary_lib.check(loaded)
    assert loaded["study"] == name and loaded["tier"] == "mini"
    assert loaded["contrasts"] and all("p_holm" in c for c in loaded["contrasts"])
    tier = study.tiers["mini"]
    for arm in loaded["arms"].values():
        assert len(arm["seeds"]) == len(tier.seeds) * len(tier.bases)
        assert set(arm["bases"]) <= set(loaded["protocol"]["bases"])
    assert loaded["protocol"]["problems_fixed_across_seeds"] is True
    with open(os.path.join(out, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert summary_lib.MARK_BEGIN in readme and summary_lib.MARK_END in readme
    with open(os.path.join(out, "table.md"), encoding="utf-8") as f:
        assert f.read().strip() in readme
    assert any(n.endswith(".png") for n in os.listdir(out))
    # every run finished; running again builds nothing and gives the same arms
    records = common.plan(study, "mini", workdir, _bases(loaded, workdir))
    assert records and all(r.finished for r in records)
    for record in records:  # the mini tier's runs: no tracker, no PNG in their reports
        made = os.listdir(record.workdir)
        assert "report.md" in made and "tensorboard" not in made, made
        assert not [n for n in made if n.endswith(".png")], made
    again = common.execute(study, "mini", workdir, argv=["test", name])
    assert json.loads(summary_lib.to_json(again))["arms"] == json.loads(
        summary_lib.to_json(result))["arms"]


def _run_here(workdir) -> tuple[str, ...]:
    """The studies whose mini tier ran in this workdir (skips unless the first eleven and
    REUSING did)."""
    ran = tuple(n for n in studies.NAMES
                if os.path.exists(os.path.join(workdir, n, "out", "summary.json")))
    if not set(FIRST + REUSING) <= set(ran):
        pytest.skip("needs the first studies' mini tiers above in the same process")
    return ran


@STUDIES_GROUP
def test_studies_asking_for_one_base_config_share_it(workdir):
    """After the mini tiers above: the studies that start from the main job's pretraining
    share one base run, and every base directory is one some study asked for."""
    asked: dict[str, set] = {}
    losses: dict[str, set] = {}
    for name in _run_here(workdir):
        path = os.path.join(workdir, name, "out", "summary.json")
        with open(path, encoding="utf-8") as f:
            for base in json.load(f)["protocol"]["bases"].values():
                for role, directory in base["roles"].items():
                    asked.setdefault(directory, set()).add(name)
                    losses.setdefault(directory, set()).add(base["last_loss"][role])
    assert sorted(os.listdir(os.path.join(workdir, "bases"))) == sorted(asked)
    # each base's weights fingerprint: its last training loss, read here from its own
    # metrics.jsonl, the same in every study that names it
    for directory, recorded in losses.items():
        with open(os.path.join(workdir, "bases", directory, "metrics.jsonl")) as f:
            rows = [row for row in map(json.loads, f) if "loss" in row]
        assert recorded == {rows[-1]["loss"]}, directory
    config = common.for_tier_base(common.main_job("smoke"), "mini")
    config.stages, config.seed = "pretrain", 0
    main_base = f"s0-{common.config_hash(config)[:10]}"
    assert {"off_policy", "cold_start", "kl_beta"} <= asked[main_base]


@STUDIES_GROUP
def test_studies_asking_for_one_run_share_it(workdir):
    """After the mini tiers above: every run directory is keyed by its config and asked for
    by some study, and a run two studies ask for (length_growth's redo arm is length_bias's
    grpo arm; onpolicy_distill's GRPO arm is distill_vs_rl's rl arm) is made once."""
    users: dict[str, set] = {}
    for name in _run_here(workdir):
        path = os.path.join(workdir, name, "out", "summary.json")
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)
        for record in common.plan(studies.get(name), "mini", workdir, _bases(loaded, workdir)):
            assert os.path.realpath(record.link) == os.path.realpath(record.workdir)
            users.setdefault(os.path.basename(record.workdir), set()).add(name)
    assert sorted(os.listdir(os.path.join(workdir, "runs"))) == sorted(users)
    assert any({"length_bias", "length_growth"} <= names for names in users.values())
    assert any({"distill_vs_rl", "onpolicy_distill"} <= names for names in users.values())


def test_cold_start_arms_share_their_rl_prompts_and_keys_per_seed(tmp_path):
    """The R1-Zero and R1 pipelines run their `rl` stage at different positions of
    config.stages; seeds derive from the stage's name, so seed s of both draws the same RL
    prompts and sampling keys (the pairing the study's contrasts assume), and another seed
    does not."""
    import numpy as np

    from grpo_jax.runner.rl_loop import stage_prompts
    from grpo_jax.runner.run import Run, StageSpec
    from grpo_jax.stages import KINDS
    from grpo_jax.studies import cold_start

    configs = cold_start.arm_configs("mini")
    names = {arm: [n.strip() for n in c.stages.split(",")] for arm, c in configs.items()}
    assert names["zero"].index("rl") != names["cold"].index("rl")
    drawn = {}
    for seed in (0, 1):
        for arm, config in configs.items():
            config = common.for_tier(config, "mini")
            config.seed = seed
            run = Run(config, str(tmp_path / f"{arm}{seed}"), KINDS)
            try:
                batches = []
                for name in ("rl", "final_rl"):
                    stage = StageSpec(names[arm].index(name), name, config[name], None)
                    batch = next(iter(stage_prompts(run, stage)))
                    batches.append((batch, np.asarray(jax_key_data(run.stage_key(name, 3)))))
                drawn[arm, seed] = batches
            finally:
                run.close()
    for seed in (0, 1):
        for (zero_batch, zero_key), (cold_batch, cold_key) in zip(drawn["zero", seed],
                                                                  drawn["cold", seed]):
            assert _same_batch(zero_batch, cold_batch)
            np.testing.assert_array_equal(zero_key, cold_key)
    assert not _same_batch(drawn["zero", 0][0][0], drawn["zero", 1][0][0])


def jax_key_data(key):
    import jax

    return jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype,
                                                              jax.dtypes.prng_key) else key


def _same_batch(a, b) -> bool:
    import jax
    import numpy as np

    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        np.asarray(x).shape == np.asarray(y).shape and np.array_equal(np.asarray(x),
                                                                      np.asarray(y))
        for x, y in zip(leaves_a, leaves_b))
