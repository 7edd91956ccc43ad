"""`python -m grpo_jax.sweep`: expansion, names, --print, skipping finished runs, and the
summary's mean and confidence interval checked by hand on a fixture."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time

import pytest

from grpo_jax import stats, sweep
from grpo_jax.json_files import dumps_finite


def _fake_run(run, pass1, kl, steps=3):
    os.makedirs(run.workdir, exist_ok=True)
    with open(os.path.join(run.workdir, "metrics.jsonl"), "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"stage": "rl", "stage_step": step, "reward_mean": 0.1 * step,
                                "pass@1": pass1 * step / steps, "kl_ref": kl * step,
                                "completion_length": 10.0 + step}) + "\n")
    with open(os.path.join(run.workdir, "report.json"), "w") as f:
        json.dump({"summary": {"before": {"pass@1": 0.2},
                               "after": {"pass@1": pass1, "format_rate": 1.0,
                                         "eval_time_s": 3.0, "by_difficulty": {}}}}, f)


def test_expand_names_and_print(tmp_path, capsys):
    runs = sweep.expand(["rl.beta=0.0,0.04", "config.rl.algorithm=grpo,dr_grpo"], [0, 1],
                        str(tmp_path), "configs/default.py:smoke", ["--config.rl.steps=5"])
    assert len(runs) == 8
    assert runs[0].name == "rl.beta=0.0,rl.algorithm=grpo,seed=0"
    assert runs[-1].arm == "rl.beta=0.04,rl.algorithm=dr_grpo"
    assert runs[3].command[-4:] == ["--config.rl.beta=0.0", "--config.rl.algorithm=dr_grpo",
                                    "--config.seed=1", "--config.rl.steps=5"]
    assert len({r.workdir for r in runs}) == 8
    code = sweep.main(["--config=configs/default.py", f"--workdir={tmp_path}", "--set",
                       "rl.beta=0.0,0.1", "--seeds=0,1,2", "--print", "--", "--config.x=1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(lines) == 6
    assert "--config.rl.beta=0.1" in lines[-1] and "--config.seed=2" in lines[-1]
    assert lines[-1].endswith("--config.x=1")
    assert not any(tmp_path.iterdir())  # --print writes nothing
    for bad in (["--set", "rl.beta"], ["--set", "seed=1,2"], ["--seeds="],
                ["--set", "a=1", "--set", "a=2"], ["--set", "rl.algorithm=x/../../esc"],
                ["--set", "rl.algorithm=.."], ["--set", "rl/x=1"]):
        assert sweep.main(["--config=c.py", f"--workdir={tmp_path}", *bad]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written, inside the sweep or out of it


def test_finished_runs_stage_figures_and_format(tmp_path):
    """A study's reading of a sweep directory: finished runs only, rebuilt from their names
    (arm, overrides, seed), their last row per stage, and intervals as table cells."""
    runs = sweep.expand(["rl.beta=0.0,0.1"], [0, 1], str(tmp_path), "cfg.py")
    for run, pass1 in zip(runs[:3], (0.5, 0.6, 0.7)):
        _fake_run(run, pass1, kl=0.0)
    os.makedirs(runs[3].workdir)  # started, not finished
    os.makedirs(tmp_path / "notes")  # not a run
    found = sweep.finished_runs(str(tmp_path))
    assert [(r.arm, r.seed) for r in found] == [("rl.beta=0.0", 0), ("rl.beta=0.0", 1),
                                                ("rl.beta=0.1", 0)]
    assert found[2].overrides == (("rl.beta", "0.1"),) and found[2].workdir == runs[2].workdir
    assert found[1].results.stage_rows()["rl"]["pass@1"] == pytest.approx(0.6)
    assert sweep.finished_runs(str(tmp_path / "nowhere")) == []
    diff = stats.paired_interval([0.5, 0.6, 0.7], [0.4, 0.45, 0.65])  # mean 0.1, std 0.05
    half = stats.t_quantile(0.975, 2) * 0.05 / math.sqrt(3) * 100
    assert sweep.format_interval(diff, signed=True) == f"+10.0 ± {half:.1f}" == "+10.0 ± 12.4"
    assert sweep.format_interval(stats.interval([0.25]), digits=2) == "25.00 (n=1)"
    assert sweep.format_interval(stats.interval([])) == "-"


def test_write_analysis(tmp_path):
    """A study's outputs: summary.json indented by 2 (a NaN written as null, which strict
    JSON readers accept; no final newline) and table.md byte for byte as given (UTF-8)."""
    summary = {"arm": stats.interval([0.5]), "seeds": [0]}
    table = "| arm | pass@1 |\n|---|---|\n| a | 50.0 ± 1.0 |\n"
    sweep.write_analysis(str(tmp_path), summary, table)
    text = (tmp_path / "summary.json").read_text(encoding="utf-8")
    assert '"std": null' in text and "NaN" not in text
    loaded = json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}"))
    assert loaded["seeds"] == [0] and loaded["arm"]["std"] is None
    assert (tmp_path / "table.md").read_bytes() == table.encode("utf-8")


def test_summary_and_skipping_finished_runs(tmp_path, monkeypatch):
    root = str(tmp_path)
    runs = sweep.expand(["rl.beta=0.0,0.1"], [0, 1, 2], root, "cfg.py")
    for run, pass1 in zip(runs[:3], (0.5, 0.6, 0.7)):
        _fake_run(run, pass1, kl=0.0)
    for run, pass1 in zip(runs[3:5], (0.3, 0.5)):
        _fake_run(run, pass1, kl=0.01)
    # The last run is not finished: the sweep runs only it (a stand-in command writes its
    # report), then summarises all six.
    started = []
    script = ("import json, os, sys; d = sys.argv[1]; os.makedirs(d, exist_ok=True); "
              "json.dump({'summary': {'after': {'pass@1': 0.4, 'format_rate': 0.9}}}, "
              "open(os.path.join(d, 'report.json'), 'w'))")
    for run in runs:
        run.command = [sys.executable, "-c", script, run.workdir]
    original = sweep.subprocess.Popen

    def popen(cmd, **kwargs):
        started.append(cmd[-1])
        return original(cmd, **kwargs)

    monkeypatch.setattr(sweep.subprocess, "Popen", popen)
    assert sweep._run_all(runs, parallel=2, root=root) == 0
    assert started == [runs[5].workdir]
    summary = json.loads((tmp_path / "summary.json").read_text())
    base = summary["rl.beta=0.0"]["figures"]
    assert base["pass@1"]["mean"] == pytest.approx(0.6)
    # t_{0.975, 2} = 4.3026527 (the sweep's former table: 4.303)
    assert base["pass@1"]["ci95"][1] - 0.6 == pytest.approx(4.302652729911275 * 0.1 / math.sqrt(3))
    assert base["train/kl_ref"]["mean"] == 0.0 and "eval_time_s" not in base
    other = summary["rl.beta=0.1"]["figures"]
    assert other["pass@1"]["mean"] == pytest.approx(0.4) and other["pass@1"]["n"] == 3
    assert other["train/kl_ref"]["n"] == 2  # the stand-in run logged no training steps
    assert other["train/kl_ref"]["mean"] == pytest.approx(0.03)
    table = (tmp_path / "summary.md").read_text()
    assert "| rl.beta=0.0 | 3 | 0.6 ± 0.25 |" in table
    assert (tmp_path / "curves.png").stat().st_size > 1000
    # Every figure is grpo_jax.stats.interval of the seeds' values, as summary.json writes it
    # (the keys mean, std, n, ci95; NaN as null).
    for arm, entry in summary.items():
        per_seed = [r.results.final_figures() for r in runs if r.arm == arm]
        assert entry["seeds"] == [r.seed for r in runs if r.arm == arm]
        for name, figure in entry["figures"].items():
            assert list(figure) == ["mean", "std", "n", "ci95"]
            assert figure == json.loads(dumps_finite(stats.interval([f.get(name)
                                                                     for f in per_seed])))
    # Everything finished now: a rerun starts nothing.
    started.clear()
    assert sweep._run_all(runs, parallel=1, root=root) == 0 and started == []


def test_an_rl_only_run_starts_from_a_base_run(tmp_path):
    """`model.init_from=<grpo_jax run directory>`: the base run's final parameters, model
    shape and tokenizer are the new run's initial policy (an ablation does not pretrain
    again)."""
    import jax
    import numpy as np

    from configs import default
    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.pipeline import describe, train_and_evaluate

    def final_state(workdir, step=None):
        with Checkpointer(workdir / "checkpoints") as ckpt:
            return ckpt.restore(step)

    base = default.get_config("smoke")
    base.model.num_layers = 1
    base.stages = "pretrain"
    train_and_evaluate(base, str(tmp_path / "base"))
    config = default.get_config("smoke")
    config.stages = "eval_base,rl"
    config.model.init_from = str(tmp_path / "base")  # shape and tokenizer from the base run
    config.checkpoint.max_to_keep = 5
    assert "1 layers" in describe(config)
    train_and_evaluate(config, str(tmp_path / "rl"))
    (base_state, _), (first, meta) = final_state(tmp_path / "base"), final_state(
        tmp_path / "rl", 1)
    assert meta["stage"] == "eval_base" and meta["stage_done"]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(first["params"]),
                 jax.device_get(base_state["params"]))
    (last, _) = final_state(tmp_path / "rl")
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()),
                                         jax.device_get(last["params"]),
                                         jax.device_get(base_state["params"])))
    assert max(moved) > 0  # the RL steps trained it


def test_a_signal_to_the_sweep_reaches_its_running_children(tmp_path, capsys):
    """SIGTERM to the sweep: the running children get it (and stop on their own), no new run
    starts, and the sweep returns 0 without a summary."""
    root = str(tmp_path)
    runs = sweep.expand(["rl.beta=0.0,0.1,0.2"], [0], root, "cfg.py")
    script = ("import os, signal, sys, time; d = sys.argv[1]\n"
              "def stop(signum, frame):\n"
              "    open(os.path.join(d, 'signal'), 'w').write(signal.Signals(signum).name)\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, stop)\n"
              "time.sleep(60)\n")
    for run in runs:
        run.command = [sys.executable, "-c", script, run.workdir]
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.time()
    assert sweep._run_all(runs, parallel=2, root=root) == 0
    assert time.time() - t0 < 30
    for run in runs[:2]:
        assert open(os.path.join(run.workdir, "signal")).read() == "SIGTERM"
    assert not os.path.exists(runs[2].workdir)  # never started
    assert not (tmp_path / "summary.json").exists()
    out = capsys.readouterr().out
    assert "passed to 2 running run(s)" in out and out.count("[sweep] stopped") == 2


def test_bad_sweeps_are_one_line_before_any_run(tmp_path, capsys):
    """A value that makes a run's directory name longer than 255 bytes, and flags after --
    that would move every run out of the sweep's folder (or change its config or seed)."""
    long = "x" * 300
    for argv, needle in (
            ([f"--set=task.name={long}"], "bytes; a directory name holds at most 255"),
            (["--", f"--workdir={tmp_path / 'elsewhere'}"], "the sweep sets --workdir"),
            (["--", "--config=configs/ppo.py"], "the sweep sets --config"),
            (["--", "--config.seed=3"], "the sweep sets --config.seed")):
        code = sweep.main(["--config=cfg.py", f"--workdir={tmp_path / 'sweep'}", *argv])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "elsewhere").exists()


def test_only_config_overrides_pass_after_the_double_dash(tmp_path, capsys):
    """After --, the single-dash forms and a flag file that set each run's workdir or seed
    (and any flag but a --config.<field> override) are one line; the overrides pass in
    either dash form, with the value after = or a space. An empty or unusable --workdir is
    one line too."""
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "flags").write_text(f"--workdir={elsewhere}\n")
    for extra, needle in (
            ([f"-workdir={elsewhere}"], "the sweep sets --workdir"),
            (["-config.seed=4"], "the sweep sets --config.seed"),
            (["--config.seed", "4"], "the sweep sets --config.seed"),
            ([f"--flagfile={tmp_path / 'flags'}"], "a flag file could set any flag"),
            (["--print_config"], "passes only --config.<field>=<value> overrides to its runs "
                                 "(not --print_config)")):
        code = sweep.main(["--config=cfg.py", f"--workdir={tmp_path / 'sweep'}", "--print",
                           "--", *extra])
        captured = capsys.readouterr()
        assert code == 2 and captured.err.count("\n") == 1 and needle in captured.err, (
            extra, captured)
    assert sweep.main(["--config=cfg.py", f"--workdir={tmp_path / 'sweep'}", "--print", "--",
                       "-config.rl.steps=5", "--config.rl.beta", "0.1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("-config.rl.steps=5 --config.rl.beta 0.1")
    for workdir, needle in (("", "--workdir: '' is empty"),
                            ("/proc/grpo_jax_no_such/sweep", "cannot be created")):
        assert sweep.main(["--config=cfg.py", f"--workdir={workdir}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    assert sorted(os.listdir(tmp_path)) == ["flags"]


def test_a_second_sweep_on_one_folder_skips_the_runs_the_first_runs(tmp_path, capsys):
    """Two sweeps on one folder: the second skips a run the first holds (and says so), it
    does not start it or count it as failed; the run the first finished is not run again."""
    root = str(tmp_path)
    runs = sweep.expand(["rl.beta=0.0,0.1"], [0], root, "cfg.py")
    script = ("import json, os, sys; d = sys.argv[1]; os.makedirs(d, exist_ok=True); "
              "json.dump({'summary': {'after': {'pass@1': 0.4}}}, "
              "open(os.path.join(d, 'report.json'), 'w'))")
    for run in runs:
        run.command = [sys.executable, "-c", script, run.workdir]
    os.makedirs(runs[0].workdir)
    first = sweep._RunLock(runs[0])  # the first sweep, mid-run
    assert first.acquire() is None
    try:
        assert sweep._run_all(runs, parallel=1, root=root) == 0  # not a failure
    finally:
        first.release()
    out = capsys.readouterr().out
    assert f"skip {runs[0].name}: another sweep (process {os.getpid()}) is running it" in out
    assert not runs[0].finished and runs[1].finished
    assert "1 of 2 runs finished (1 skipped" in out and "summary.md" in out
    assert "FAILED" not in out
