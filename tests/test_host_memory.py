"""host_memory.reuse_freed_memory: a compiled program's buffers are not faulted in anew at
every call (measured in fresh processes, where the setting comes before XLA's threads)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from grpo_jax import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# A jitted function whose temporary ([8192, 2048] float32, 64 MB: above the 32 MB up to which
# glibc adapts its mmap threshold) is allocated and freed at every call; prints the median
# page faults per call over calls 16-30 (the reused heap takes some calls to reach its size,
# and an odd call may still extend it).
_PROBE = """
import json, os, resource, statistics, sys
os.environ["JAX_PLATFORMS"] = "cpu"
from grpo_jax import host_memory
applied = host_memory.reuse_freed_memory() if sys.argv[1] == "reuse" else None
import jax, jax.numpy as jnp
f = jax.jit(lambda x, w: jnp.cumsum(jnp.tanh(x), axis=0) @ w)
x, w = jnp.full((8192, 2048), 0.01, jnp.float32), jnp.ones((2048, 8), jnp.float32)
faults = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x, w).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults_per_call": statistics.median(faults[15:])}))
"""


def _probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["XLA_FLAGS"] = ""  # one device, optimised code: the tests' flags only slow it down
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc malloc's")
def test_reused_memory_is_not_faulted_in_again():
    system, reuse = _probe("system"), _probe("reuse")
    assert reuse["applied"] is True
    # 64 MB is 16384 pages: with the system's defaults each call maps them anew; with the
    # settings they stay mapped from the first calls.
    assert system["faults_per_call"] > 10000, system
    assert reuse["faults_per_call"] < 0.05 * system["faults_per_call"], (system, reuse)


def test_idempotent_and_reports_whether_applied():
    first = host_memory.reuse_freed_memory()
    assert first is GLIBC
    assert host_memory.reuse_freed_memory() is first
    assert set(host_memory.ENVIRONMENT) == {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_",
                                            "MALLOC_ARENA_MAX"}
