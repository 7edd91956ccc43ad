"""A multi-controller run on this machine: `launch_local` with 2 processes x 2 CPU devices
trains the smoke RL stage (real gradients), writes each metrics step once from process 0,
checkpoints, resumes after its processes are killed, and matches a 1-process run over the
same 4 devices."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
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


def test_two_processes_match_one_and_resume_after_a_kill(tmp_path):
    from grpo_jax.pipeline import train_and_evaluate

    single, multi, logs = tmp_path / "single", tmp_path / "multi", tmp_path / "logs"
    config = _config()
    config.mesh.num_devices = 4  # the same 4 devices as 2 processes x 2
    train_and_evaluate(config, str(single))

    command = [sys.executable, "-m", "grpo_jax.launch_local", "--num_processes=2",
               "--devices_per_process=2", "--", f"--config={CONFIG}", f"--workdir={multi}",
               f"--config.rl.steps={STEPS}"]
    # A compilation cache of this test's own: the resumed run loads what the killed one built.
    env = {**os.environ, "PYTHONPATH": ROOT,
           "GRPO_JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla")}
    # Start, wait for the checkpoint of step 2, then kill every process.
    launcher = subprocess.Popen(command, env=env, cwd=str(tmp_path), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (multi / "checkpoints" / "2").is_dir():
        assert launcher.poll() is None, "the 2-process run ended before its step 2"
        assert time.time() < deadline, "no checkpoint of step 2 within 300 s"
        time.sleep(0.02)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) != 0
    killed_at = max(r["stage_step"] for r in read_metrics(multi))
    assert killed_at < STEPS, "the run finished before it was killed"
    # The same command again resumes from the last checkpoint and finishes.
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
    del logs
