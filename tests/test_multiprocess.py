"""A multi-controller run on this machine: `launch_local` with 2 processes x 2 CPU devices
trains the smoke RL stage (real gradients), writes each metrics step once from process 0,
checkpoints, stops together on a signal to one process, stops at once when a process dies,
resumes, and matches a 1-process run over the same 4 devices. The launcher's own signal
forwarding and dead-child detection are tested with a stand-in for the processes."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from grpo_jax.checkpoint import Checkpointer
from grpo_jax.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "configs", "multiprocess.py")
STEPS = 6


def _config():
    spec = importlib.util.spec_from_file_location("multiprocess_config", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.rl.steps = STEPS
    return config


def _final_params(workdir, like=None):
    """The final parameters (restored onto this process's first device like `like`: a
    checkpoint written by two processes needs a target of this process's topology)."""
    target = None
    if like is not None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                             sharding=device), like)
    with Checkpointer(os.path.join(workdir, "checkpoints")) as ckpt:
        state, meta = ckpt.restore(target=target)
    assert meta["stage_done"]
    return jax.device_get(state)


def _process_pid(workdir, index: int) -> int | None:
    """The pid of process `index` of the launch_local run in `workdir` (from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "grpo_jax.main" in args and f"--workdir={workdir}" in args and \
                f"--process_id={index}" in args:
            return int(entry)
    return None


def _wait_for_checkpoint(launcher, directory, after: int, what: str) -> int:
    deadline = time.time() + 300
    while True:
        steps = [int(n) for n in os.listdir(directory) if n.isdigit()] \
            if os.path.isdir(directory) else []
        if steps and max(steps) > after:
            return max(steps)
        assert launcher.poll() is None, f"the 2-process run ended before {what}"
        assert time.time() < deadline, f"no checkpoint after {after} within 300 s"
        time.sleep(0.02)


def _stopped_checkpoint(text: str) -> str:
    lines = [ln for ln in text.splitlines() if "stopped on SIGTERM" in ln]
    assert len(lines) == 1, text[-2000:]
    return lines[0].split("checkpoint ")[1].split(";")[0]


def test_two_processes_match_one_and_survive_a_stop_and_a_dead_peer(tmp_path):
    """SIGTERM to one process stops both at the same step with a checkpoint (exit 0); a
    process killed outright stops the other within seconds, named; each rerun resumes, and
    the finished run equals the 1-process run."""
    from grpo_jax.pipeline import train_and_evaluate

    single, multi = tmp_path / "single", tmp_path / "multi"
    config = _config()
    config.mesh.num_devices = 4  # the same 4 devices as 2 processes x 2
    train_and_evaluate(config, str(single))

    command = [sys.executable, "-m", "grpo_jax.launch_local", "--num_processes=2",
               "--devices_per_process=2", "--", f"--config={CONFIG}", f"--workdir={multi}",
               f"--config.rl.steps={STEPS}"]
    # A compilation cache of this test's own: the resumed run loads what the killed one built.
    env = {**os.environ, "PYTHONPATH": ROOT,
           "GRPO_JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla")}
    checkpoints = multi / "checkpoints"

    def start():
        return subprocess.Popen(command, env=env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    # 1. A preemption notice reaching process 1 alone: both agree, save one step, exit 0.
    launcher = start()
    _wait_for_checkpoint(launcher, checkpoints, 1, "its step 2")
    os.kill(_process_pid(multi, 1), signal.SIGTERM)
    signalled = time.time()
    out, err = launcher.communicate(timeout=120)
    seconds_to_stop = time.time() - signalled
    assert launcher.returncode == 0, out[-2000:] + err[-2000:]
    saved = _stopped_checkpoint(out)  # process 0 (streamed): "SIGTERM to process 1"
    assert "SIGTERM to process 1" in out
    log_1 = (multi / "launch_local" / "process_1.log").read_text()
    assert _stopped_checkpoint(log_1) == saved  # the same step on both
    stopped_at = int(os.path.basename(saved))
    assert max(int(n) for n in os.listdir(checkpoints) if n.isdigit()) == stopped_at
    assert max(r["stage_step"] for r in read_metrics(multi)) < STEPS

    # 2. Process 1 dies outright: the launcher stops process 0 at once and names process 1.
    launcher = start()
    _wait_for_checkpoint(launcher, checkpoints, stopped_at, "a checkpoint after resuming")
    os.kill(_process_pid(multi, 1), signal.SIGKILL)
    killed = time.time()
    out, err = launcher.communicate(timeout=120)
    seconds_to_notice = time.time() - killed
    assert launcher.returncode == 128 + signal.SIGKILL, err[-2000:]
    assert "process 1 exited with status -9 (SIGKILL)" in err
    assert seconds_to_notice < 30
    print(f"seconds to exit: SIGTERM to one process {seconds_to_stop:.1f}, SIGKILL of one "
          f"process {seconds_to_notice:.1f}")

    # 3. The same command again resumes from the last checkpoint and finishes.
    done = subprocess.run(command, env=env, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    rows_multi = [r for r in read_metrics(multi) if r["stage"] == "rl"]
    rows_single = [r for r in read_metrics(single) if r["stage"] == "rl"]
    assert [r["stage_step"] for r in rows_multi] == list(range(1, STEPS + 1))  # once each
    assert any(r["reward_std"] > 0 for r in rows_multi)  # rewards differ within groups
    for a, b in zip(rows_multi, rows_single):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)  # same samples
        assert a["grad_norm"] > 0
        np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-4)
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-6)
    # Every checkpoint of the 2-process run holds the checksum of each array, computed over
    # both processes' shards: restoring it in this one process checks them all.
    from grpo_jax.checkpoint import _CHECKSUMS_FIELD, _META

    last = max(int(n) for n in os.listdir(checkpoints) if n.isdigit())
    sums = json.loads((checkpoints / str(last) / _META / "metadata").read_text())[
        _CHECKSUMS_FIELD]
    assert sums and all(isinstance(v, int) for v in sums.values())
    reference = _final_params(single)
    final = _final_params(multi, like=reference)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6),
                 final["params"], reference["params"])
    # Process 0 alone writes the run's files: the same files as the 1-process run (plus the
    # launcher's log of process 1, which process 1 itself never writes into the workdir).
    assert sorted(os.listdir(multi)) == sorted(os.listdir(single) + ["launch_local"])
    assert os.listdir(multi / "launch_local") == ["process_1.log"]
    recorded = json.loads((multi / "config.json").read_text())
    assert recorded["rl"]["steps"] == STEPS


_FAKE_MAIN = """#!{python}
import os, signal, sys, time
pid = [a for a in sys.argv if a.startswith("--process_id=")][0].split("=")[1]
out = os.path.join({directory!r}, "process_" + pid)
def stop(signum, frame):
    open(out, "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
if pid == "1" and {fail_after} >= 0:
    time.sleep({fail_after})
    sys.exit(3)
time.sleep(60)
"""


def _fake_python(tmp_path, fail_after=-1.0):
    path = tmp_path / "fake_python"
    path.write_text(_FAKE_MAIN.format(python=sys.executable, directory=str(tmp_path),
                                      fail_after=fail_after))
    path.chmod(0o755)
    return str(path)


def test_launcher_passes_a_signal_to_every_process_and_waits(tmp_path):
    from grpo_jax.launch_local import launch

    python = _fake_python(tmp_path)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.time()
    status = launch([f"--workdir={tmp_path}"], num_processes=2, devices_per_process=1,
                    python=python)
    assert status == 0 and time.time() - t0 < 20
    for pid in (0, 1):  # each process got the signal and exited on its own
        assert (tmp_path / f"process_{pid}").read_text() == "SIGTERM"


def test_launcher_stops_the_run_when_any_process_dies(tmp_path, capfd):
    from grpo_jax.launch_local import launch

    t0 = time.time()
    status = launch([f"--workdir={tmp_path}"], num_processes=2, devices_per_process=1,
                    python=_fake_python(tmp_path, fail_after=0.5))
    assert status == 3 and time.time() - t0 < 20  # process 0 would have slept 60 s
    err = capfd.readouterr().err
    assert "process 1 exited with status 3; stopping the others" in err
