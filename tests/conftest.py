"""Test set-up: CPU with 8 virtual devices so sharding tests run on any machine, XLA
without LLVM optimisation or the MLIR fusion emitters and one compilation cache for the
session (the tests are compile-bound)."""

import os
import shutil
import sys
import tempfile

# The repository root, so tests import `configs.*` under plain `pytest` as well as under
# `python -m pytest` (which adds the working directory; plain `pytest` does not, and then
# `configs` would resolve to the namespace package tests/configs).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# The tests' models are tiny, so their time goes to compiling, not running: without LLVM's
# optimisation passes the suite runs about a quarter faster (measured on 2 cores). Every
# comparison in the tests is between runs under the same flags or within a tolerance.
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
# XLA:CPU's MLIR fusion emitters take most of what is left of a compile: with the classic
# emitters a compile-bound test takes half the CPU time or less (measured on 2 cores: the
# micro-batch update test 55 -> 18 CPU s, the R1 pipeline smoke test 35 -> 18 CPU s).
if "xla_cpu_use_fusion_emitters" not in _flags:
    _flags += " --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = _flags.strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)

from grpo_jax import compilation  # noqa: E402

# One persistent compilation cache for the whole test session, shared by the xdist workers
# and the runs the tests start as subprocesses (both inherit the variable, which the
# controller sets before it starts the workers): many tests build the same programs (the
# tiny-1m train step, the sampler, the log-prob pass), and a later one loads them instead of
# compiling again. A fresh temporary directory per session, so every run starts cold as CI
# does; the process that made it removes it at the end. GRPO_JAX_COMPILATION_CACHE_DIR=""
# runs without it. tests/test_compilation.py points it elsewhere where it is the subject.
_OWN_CACHE = compilation.ENV_VAR not in os.environ
if _OWN_CACHE:
    os.environ[compilation.ENV_VAR] = tempfile.mkdtemp(prefix="grpo_jax_tests_xla_")
SESSION_CACHE = os.environ[compilation.ENV_VAR]
# Only programs that took 0.1 s or more to compile are stored: the tests run thousands of
# single jnp ops eagerly, each its own program of a few milliseconds, which cost more to
# write than to compile again (measured on 2 cores: test_algorithms, test_model and
# test_decode 88-90 s -> 81-83 s, alternated). The train steps and samplers (0.5 s and up)
# are still shared. Subprocesses the tests start keep the library's default (every program).
compilation.MIN_COMPILE_SECS = 0.1
compilation.use_cache(SESSION_CACHE)  # for every jitted program, not only the pipeline's


import pytest  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture
def example_module():
    """grpo_jax.tasks.base (the Example dataclass used by data and GSM8K tests)."""
    from grpo_jax.tasks import base

    return base


@pytest.fixture
def crash_and_resume(tmp_path, monkeypatch):
    """Checks that a run crashed and resumed ends where an uninterrupted one does.

    Returns run(config, stage): trains `config` straight into tmp_path/straight, then into
    tmp_path/resumed with a crash when `stage` logs its step 3, then resumes it; asserts both
    end with bit-identical parameters and the resumed log has steps 1..4 once each; returns the
    two runs' metric rows of `stage` for stage-specific comparisons.
    """
    import numpy as np

    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    def final_params(workdir):
        with Checkpointer(workdir / "checkpoints") as ckpt:
            state, meta = ckpt.restore()
        assert meta["stage_done"]
        assert jax.dtypes.issubdtype(state["rng"].dtype, jax.dtypes.prng_key)  # the run's key
        return state["params"]

    def run(config, crash_stage):
        # The three runs build the same programs: the session's compilation cache lets the
        # second and third load them (what a real resume does with the default cache).
        straight, resumed = tmp_path / "straight", tmp_path / "resumed"
        train_and_evaluate(config, str(straight))
        from tests.test_guards import killed_and_resumed

        killed_and_resumed(config, resumed, monkeypatch, stage=crash_stage)

        jax.tree.map(
            lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
            final_params(straight),
            final_params(resumed),
        )
        rows = lambda workdir: [
            r for r in read_metrics(workdir / "metrics.jsonl") if r["stage"] == crash_stage
        ]
        rows_straight, rows_resumed = rows(straight), rows(resumed)
        assert [r["stage_step"] for r in rows_resumed] == [1, 2, 3, 4]
        return rows_straight, rows_resumed

    return run
