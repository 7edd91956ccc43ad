"""What survives what: SIGTERM, non-finite values, corrupt checkpoints, a busy workdir,
config drift and run extensions."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import main as main_lib
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.metrics import MetricWriter, read_metrics
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.runner import ConfigError
from grpo_jax.runner.guards import NonFiniteError, WorkdirLock
from grpo_jax.runner.rewards import REWARD_SOURCES
from grpo_jax.training import apply_if_finite

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from configs import default as default_config  # noqa: E402


def rl_config(steps=4, **rl):
    """RL only on the smoke config, with rewards that differ within groups (the soft
    overlong punishment on completion lengths), so every step has real gradients."""
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.stages = "rl"
    config.rl.update(dict(steps=steps, checkpoint_every=1, beta=0.04, max_new_tokens=12,
                          overlong_cache=8, **rl))
    return config


def killed_and_resumed(config, workdir, monkeypatch, *, stage="rl", step=3) -> None:
    """Runs `config` in `workdir`, killed (KeyboardInterrupt) while logging `stage`'s update
    `step`, then again to its end (resuming from its last checkpoint)."""
    original = MetricWriter.write

    def crash(self, at, metrics, *, stage=None, _stage=stage):
        if stage == _stage and metrics.get("stage_step") == step:
            raise KeyboardInterrupt("simulated crash")
        return original(self, at, metrics, stage=stage)

    monkeypatch.setattr(MetricWriter, "write", crash)
    with pytest.raises(KeyboardInterrupt):
        train_and_evaluate(config, str(workdir))
    monkeypatch.setattr(MetricWriter, "write", original)
    train_and_evaluate(config, str(workdir))


def final_params(workdir):
    with Checkpointer(os.path.join(workdir, "checkpoints")) as ckpt:
        state, meta = ckpt.restore()
    assert meta["stage_done"]
    return state["params"]


def assert_same_params(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                 a, b)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One uninterrupted 4-step run the fault tests compare against."""
    workdir = tmp_path_factory.mktemp("straight")
    train_and_evaluate(rl_config(), str(workdir))
    rows = [r for r in read_metrics(workdir / "metrics.jsonl") if r["stage"] == "rl"]
    assert np.std([r["reward_std"] for r in rows]) >= 0 and rows[0]["reward_std"] > 0
    return workdir


def test_sigterm_saves_exits_0_and_the_rerun_equals_an_uninterrupted_run(tmp_path, straight):
    workdir = tmp_path / "run"
    overrides = ["--config.stages=rl", "--config.mesh.num_devices=1", "--config.rl.steps=4",
                 "--config.model.num_layers=1",
                 "--config.rl.checkpoint_every=0", "--config.rl.beta=0.04",
                 "--config.rl.max_new_tokens=12", "--config.rl.overlong_cache=8"]
    # checkpoint_every differs from the straight run's, but only in when it saves.
    command = [sys.executable, "-m", "grpo_jax.main", "--config=configs/default.py:smoke",
               *overrides, f"--workdir={workdir}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and any(r.get("stage_step") == 1 for r in read_metrics(metrics)):
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "stopped on SIGTERM after rl step" in out and "Traceback" not in err, (out, err)
    done = [r["stage_step"] for r in read_metrics(metrics) if r["stage"] == "rl"]
    assert done and done[-1] < 4  # it stopped mid-stage
    config = rl_config()
    config.rl.checkpoint_every = 0
    train_and_evaluate(config, str(workdir))  # the same command again resumes
    assert [r["stage_step"] for r in read_metrics(metrics) if r["stage"] == "rl"] == [1, 2, 3, 4]
    assert_same_params(final_params(workdir), final_params(straight))


@pytest.mark.parametrize("damage", ["truncated", "changed"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before(tmp_path, straight,
                                                                  monkeypatch, capsys, damage):
    """Truncated array files (unreadable), or array files that still read but hold other
    values than were saved (the checksums in the metadata catch them): either way one line,
    the checkpoint set aside, and the run ends as the uninterrupted one."""
    workdir = tmp_path / "run"
    original = MetricWriter.write

    def crash_at_three(self, step, metrics, *, stage=None):
        if stage == "rl" and metrics.get("stage_step") == 3:
            raise KeyboardInterrupt("simulated crash")
        return original(self, step, metrics, stage=stage)

    monkeypatch.setattr(MetricWriter, "write", crash_at_three)
    with pytest.raises(KeyboardInterrupt):
        train_and_evaluate(rl_config(), str(workdir))
    monkeypatch.setattr(MetricWriter, "write", original)
    with Checkpointer(workdir / "checkpoints") as ckpt:
        newest = ckpt.latest_step()
    assert newest == 2
    state_dir = workdir / "checkpoints" / str(newest) / "state"
    if damage == "truncated":  # every array file of the newest checkpoint
        for root, _, files in os.walk(state_dir):
            for name in files:
                if not name.endswith(".json"):
                    with open(os.path.join(root, name), "r+b") as f:
                        f.truncate(3)
    else:  # the arrays of checkpoint 1 under checkpoint 2's metadata: readable, but other
        shutil.rmtree(state_dir)
        shutil.copytree(workdir / "checkpoints" / "1" / "state", state_dir)
    train_and_evaluate(rl_config(), str(workdir))
    lines = [line for line in capsys.readouterr().out.splitlines() if "unreadable" in line]
    assert len(lines) == 1 and "checkpoint 2 is unreadable" in lines[0], lines
    if damage == "changed":
        assert "does not match the checksum saved with it" in lines[0], lines
    assert (workdir / "checkpoints_corrupt" / "2").is_dir()  # kept, not deleted
    assert_same_params(final_params(workdir), final_params(straight))
    # Unreadable metadata is handled the same way (it falls back, nothing is lost).
    with Checkpointer(workdir / "checkpoints") as ckpt:
        newest = ckpt.latest_step()
    meta = next((workdir / "checkpoints" / str(newest)).rglob("*meta*"), None)
    if meta is not None and meta.is_file():
        meta.write_text("{not json")
    elif meta is not None:
        for path in meta.rglob("*"):
            if path.is_file():
                path.write_text("{not json")
    train_and_evaluate(rl_config(), str(workdir))
    assert "unreadable" in capsys.readouterr().out


def test_non_finite_steps_are_skipped_counted_and_stop_the_run(tmp_path, monkeypatch):
    monkeypatch.setitem(REWARD_SOURCES, "nan_reward",
                        lambda run, section: lambda completion, example: float("nan"))
    config = rl_config(steps=6)
    config.rl.rewards = {"accuracy": 1.0, "nan_reward": 1.0}
    config.max_consecutive_skips = 3
    with pytest.raises(NonFiniteError, match=r"rl step 3: non-finite loss"):
        train_and_evaluate(config, str(tmp_path))
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
    assert [r["skipped_steps"] for r in rows] == [1.0, 2.0, 3.0]
    initial = None
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        for step in ckpt.all_steps():
            state, _ = ckpt.restore(step)
            leaves = jax.tree.leaves(state["params"])
            assert all(np.all(np.isfinite(np.asarray(x))) for x in leaves)
            if initial is None:
                initial = state["params"]
            else:  # nothing was applied: the parameters never moved
                assert_same_params(state["params"], initial)
    # The command line says it in one line and exits non-zero.
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main_lib.cli(["grpo_jax", "--config=configs/default.py:smoke",
                             "--config.stages=rl", "--config.mesh.num_devices=1",
                             "--config.rl.steps=3", "--config.rl.max_new_tokens=12",
                             "--config.rl.rewards.format=nan", f"--workdir={tmp_path / 'b'}"])
    assert code == 2 and "rl.rewards.format: expected a finite weight" in err.getvalue()


def test_apply_if_finite_keeps_the_state_on_any_non_finite_value():
    params = {"w": jnp.ones(3)}
    optimizer = optax.adam(0.1)
    opt_state = optimizer.init(params)
    good = {"w": jnp.ones(3)}
    new, _, flags = apply_if_finite(optimizer, good, opt_state, params, loss=jnp.float32(1.0))
    assert float(flags["skipped"]) == 0 and not np.allclose(new["w"], 1.0)
    for grads, loss, what in (({"w": jnp.array([1.0, jnp.nan, 1.0])}, 1.0, "grad"),
                              (good, jnp.inf, "loss")):
        kept, kept_state, flags = apply_if_finite(optimizer, grads, opt_state, params,
                                                  loss=jnp.float32(loss))
        assert float(flags["skipped"]) == 1 and float(flags[f"nonfinite_{what}"]) == 1
        np.testing.assert_array_equal(kept["w"], params["w"])
        jax.tree.map(np.testing.assert_array_equal, kept_state, opt_state)


def test_the_sampler_never_emits_an_id_outside_the_vocabulary():
    from grpo_jax.sampling.choice import argmax

    x = jnp.array([[0.1, 2.0, 0.3], [jnp.nan, jnp.nan, jnp.nan]])
    np.testing.assert_array_equal(np.asarray(argmax(x)), [1, 2])


def test_a_busy_workdir_is_refused_and_a_stale_lock_taken_over(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    lock = WorkdirLock(str(workdir))
    lock.acquire()
    try:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main_lib.cli(["grpo_jax", "--config=configs/default.py:smoke",
                                 "--config.stages=eval_base", f"--workdir={workdir}"])
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1 and f"in use by process {os.getpid()}" in lines[0]
        assert not (workdir / "config.json").exists()
    finally:
        lock.release()
    (workdir / ".lock").write_text("999999999\n")  # a dead holder: no flock is held
    config = default_config.get_config("smoke")
    config.stages = "eval_base"
    train_and_evaluate(config, str(workdir))
    assert (workdir / "report.md").exists()


def test_config_drift_is_refused_and_raising_the_rl_steps_continues(tmp_path, capsys,
                                                                    straight):
    """Train longer: a finished run (RL, then an eval) whose rl.steps are raised continues
    RL from its full-state checkpoint, evaluates again, and equals the run that had the
    larger steps from the start."""
    def config_of(steps):
        config = rl_config(steps=steps)
        config.stages = "rl,eval_final"
        return config

    workdir = str(tmp_path / "run")
    train_and_evaluate(config_of(2), workdir)
    other_seed = config_of(2)
    other_seed.seed = 1
    with pytest.raises(ConfigError, match=r"seed 0 -> 1; use another --workdir \(only raising "
                                          r"rl\.steps continues this run\)"):
        train_and_evaluate(other_seed, workdir)
    with pytest.raises(ConfigError, match=r"rl\.steps 2 -> 1"):
        train_and_evaluate(config_of(1), workdir)
    # Without config.json the checkpoints still carry the run's identity.
    os.remove(os.path.join(workdir, "config.json"))
    with pytest.raises(ConfigError, match=r"seed 0 -> 1"):
        train_and_evaluate(other_seed, workdir)
    before = final_params(workdir)
    capsys.readouterr()
    train_and_evaluate(config_of(4), workdir)  # train longer: continues the run
    resumed = [line for line in capsys.readouterr().out.splitlines() if "resuming" in line]
    assert len(resumed) == 1 and "stage rl at step 2 of 4" in resumed[0], resumed
    rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    assert [r["stage_step"] for r in rows if r["stage"] == "rl"] == [1, 2, 3, 4]
    assert [r["stage"] for r in rows].count("eval_final") == 1  # evaluated again, once
    after = final_params(workdir)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    assert_same_params(after, final_params(straight))  # = 4 steps from the start
    record = json.loads(open(os.path.join(workdir, "config.json")).read())
    assert record["rl"]["steps"] == 4
    assert record["_history"][-1]["changed"] == {"rl.steps": [2, 4]}
    # The same command again has nothing left to do and changes nothing, also with the
    # compilation cache elsewhere (where compiled programs are kept is not part of a result).
    moved = config_of(4)
    moved.compilation_cache_dir = str(tmp_path / "elsewhere")
    capsys.readouterr()
    train_and_evaluate(moved, workdir)
    assert "every stage has finished" in capsys.readouterr().out
    assert_same_params(final_params(workdir), after)


def test_a_failed_save_stops_the_run_at_that_save_with_one_line(tmp_path, monkeypatch):
    """A save that fails (here: the disk is full) stops the run at that save: exit 4, one
    line, no training past it."""
    from grpo_jax import checkpoint

    original = checkpoint.Checkpointer.save

    def full_disk(self, step, **kwargs):
        if step >= 2:
            def fail(*args, **kw):
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(self._manager, "save", fail)
        return original(self, step, **kwargs)

    monkeypatch.setattr(checkpoint.Checkpointer, "save", full_disk)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main_lib.cli(["grpo_jax", "--config=configs/default.py:smoke",
                             "--config.stages=rl", "--config.mesh.num_devices=1",
                             "--config.model.num_layers=1",
                             "--config.rl.steps=4", "--config.rl.checkpoint_every=1",
                             "--config.rl.max_new_tokens=12", f"--workdir={tmp_path}"])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code == 4 and len(lines) == 1, err.getvalue()
    assert "saving checkpoint 2" in lines[0] and "No space left on device" in lines[0]
    steps = [r["stage_step"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert steps == [1, 2]  # stopped at the failed save of step 2


def test_the_drift_message_offers_an_extension_only_where_there_is_one(tmp_path):
    from grpo_jax.runner.resume import check_config_drift

    def workdir_of(config):
        (tmp_path / "checkpoints" / "1").mkdir(parents=True, exist_ok=True)
        (tmp_path / "config.json").write_text(config.to_json_best_effort())
        return str(tmp_path)

    config = default_config.get_config("smoke")
    config.stages = "eval_final"  # an eval-only run: nothing to extend
    workdir = workdir_of(config)
    config.seed = 1
    with pytest.raises(ConfigError, match=r"seed 0 -> 1; use another --workdir$"):
        check_config_drift(config, workdir)
    config = default_config.get_config("smoke")  # the main job: rl, then an eval
    workdir = workdir_of(config)
    config.seed = 1
    with pytest.raises(ConfigError, match=r"\(only raising rl\.steps continues this run\)"):
        check_config_drift(config, workdir)
    config = rl_config(steps=2)
    workdir = workdir_of(config)
    config.seed = 1
    with pytest.raises(ConfigError, match=r"\(only raising rl\.steps continues this run\)"):
        check_config_drift(config, workdir)


def test_fields_new_to_the_library_are_not_drift(tmp_path):
    """A run started before a field existed resumes: the field is recorded as added."""
    from grpo_jax.runner.resume import check_config_drift

    config = rl_config(steps=2)
    recorded = json.loads(config.to_json_best_effort())
    del recorded["rl"]["temperature"]  # as if the library had no such field then
    (tmp_path / "checkpoints" / "1").mkdir(parents=True)
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    history = check_config_drift(config, str(tmp_path))
    assert history[-1]["added"] == {"rl.temperature": config.rl.temperature}
    config.seed = 1  # a field the run had is still refused
    with pytest.raises(ConfigError, match=r"seed 0 -> 1"):
        check_config_drift(config, str(tmp_path))


def test_a_failed_asynchronous_save_is_named_and_a_full_disk_refused_before_writing(
        tmp_path, monkeypatch):
    from grpo_jax import checkpoint
    from grpo_jax.checkpoint import CheckpointSaveError

    state = {"w": jnp.arange(1000, dtype=jnp.float32)}
    with Checkpointer(tmp_path / "a") as ckpt:
        ckpt.save(1, state=state)
        ckpt.wait()

        def failed():
            raise ValueError("RESOURCE_EXHAUSTED: writing\nmore") from OSError(
                28, "No space left on device")

        monkeypatch.setattr(ckpt._manager, "check_for_errors", failed)
        with pytest.raises(CheckpointSaveError, match=r"^saving checkpoint 1 in .*\(OSError: "
                           r"\[Errno 28\] No space left on device\); the run stopped there"):
            ckpt.check_errors()
        monkeypatch.setattr(ckpt._manager, "save", lambda *a, **k: failed())
        with pytest.raises(CheckpointSaveError, match="saving checkpoint 1 "):
            ckpt.save(2, state=state)  # orbax first waits for 1: its failure is named
        monkeypatch.undo()

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda path: usage._replace(free=3000))
    with Checkpointer(tmp_path / "b") as ckpt:
        with pytest.raises(CheckpointSaveError, match=r"saving checkpoint 5 in .* needs up to "
                           r"0\.0 MiB and 0\.0 MiB are free"):
            ckpt.save(5, state=state)
        assert ckpt.all_steps() == []
    assert not any(n.startswith("5") for n in os.listdir(tmp_path / "b"))


def test_a_second_sigterm_during_the_save_stops_at_once_with_one_line(tmp_path, monkeypatch,
                                                                     straight):
    """The first SIGTERM asks for a checkpoint; a second one while it is written stops at
    once: exit 130, one line, no traceback, and the rerun resumes from the last complete
    checkpoint and equals the uninterrupted run."""
    original, calls = Checkpointer.save, []

    def save(self, step, **kwargs):
        calls.append(step)
        if len(calls) in (2, 3):  # the first after step 2's save; the second inside the next
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, step, **kwargs)

    monkeypatch.setattr(Checkpointer, "save", save)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main_lib.cli(["grpo_jax", "--config=configs/default.py:smoke",
                             "--config.stages=rl", "--config.mesh.num_devices=1",
                             "--config.model.num_layers=1", "--config.rl.steps=4",
                             "--config.rl.checkpoint_every=1", "--config.rl.beta=0.04",
                             "--config.rl.max_new_tokens=12", "--config.rl.overlong_cache=8",
                             f"--workdir={tmp_path}"])
    monkeypatch.undo()
    assert code == 130 and not err.getvalue().strip(), err.getvalue()
    stopped = [ln for ln in out.getvalue().splitlines() if "stopped at once" in ln]
    assert len(stopped) == 1 and "second SIGTERM" in stopped[0], out.getvalue()
    train_and_evaluate(rl_config(), str(tmp_path))  # resumes
    assert [r["stage_step"] for r in read_metrics(tmp_path / "metrics.jsonl")
            if r["stage"] == "rl"] == [1, 2, 3, 4]
    assert_same_params(final_params(tmp_path), final_params(straight))


def test_a_collapsed_policy_is_warned_about_once():
    from grpo_jax.runner.guards import CollapseWatch

    watch = CollapseWatch(floor=0.05, steps=3)
    entropies = [1.0, 0.01, 0.01, 0.2, 0.01, 0.01, 0.01, 0.001, 0.0]
    lines = [watch.check("rl", i + 1, {"entropy": e}) for i, e in enumerate(entropies)]
    warned = [i + 1 for i, line in enumerate(lines) if line]
    assert warned == [7]  # the third step in a row below the floor; the recovery reset it
    assert "rl step 7" in lines[6] and "rl.lr" in lines[6]
    assert watch.check("rl", 10, {}) is None  # a stage without the metric


def test_non_finite_logits_stop_the_run_with_one_line_and_the_rerun_stops_there_too(
        tmp_path, monkeypatch):
    """The sampler's log-probs come out NaN (as when a learning rate far too high leaves
    finite parameters that overflow the forward pass; here the log-prob is made NaN): the
    run stops with one line (exit 3) before training on them, and the same command stops at
    the same step again (no retry loop)."""
    from grpo_jax.sampling import choice, decode

    nan_logp = lambda logits, token: jnp.full(token.shape, jnp.nan, jnp.float32)
    monkeypatch.setattr(choice, "logp_at", nan_logp)
    monkeypatch.setattr(decode, "logp_at", nan_logp)
    argv = ["grpo_jax", "--config=configs/default.py:smoke", "--config.stages=rl",
            "--config.mesh.num_devices=1", "--config.model.num_layers=1",
            "--config.rl.steps=6", "--config.rl.checkpoint_every=1",
            # a budget no other test uses: the sampler is traced anew, with the patch
            "--config.rl.max_new_tokens=13", "--config.rl.overlong_cache=8",
            f"--workdir={tmp_path}"]
    for _ in range(2):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main_lib.cli(argv)
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert code == 3 and len(lines) == 1, err.getvalue()
        assert lines[0].startswith("error: rl step 1: the sampler's logits are not finite "
                                   "in 16 of 16 rows although the parameters are finite")
    assert not [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
