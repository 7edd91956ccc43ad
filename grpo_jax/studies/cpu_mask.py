"""The CPU mask: make an x86 Linux machine compute the studies' runs as the CPU that built the
published bases did (`cpu_mask.c`: AMD family 19h model 01h, AVX2, its cache sizes).

The kernel libraries XLA calls pick their code from CPUID at run time (the vector set, past
`--xla_cpu_max_isa`, and matrix-product blocking from the cache sizes), so an AVX-512 CPU
capped at AVX2 still trains other weights. Under the mask, CPUID itself answers as the
canonical CPU, and `fingerprint` says whether that was enough:

    LD_PRELOAD=$(python -m grpo_jax.studies cpu-mask) XLA_FLAGS=--xla_cpu_max_isa=AVX2 \\
        python -m grpo_jax.studies fingerprint

It needs CPUID faulting (the "cpuid_fault" flag of /proc/cpuinfo) and a C compiler; the
library is built once into ~/.cache/grpo_jax/. A run made under it records the CPU as
"<cpu> (<isa> seen as <isa> under a CPUID mask...)" (`grpo_jax.machine.machine`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

from grpo_jax.machine import cpuinfo_model_and_flags

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_mask.c")


def unavailable(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """Why the mask cannot work on this machine, in one line; None where it can."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (f"the CPU mask needs x86-64 Linux; this is {platform.system()} "
                f"{platform.machine()}")
    if "cpuid_fault" not in cpuinfo_model_and_flags(cpuinfo)[1]:
        return ("the CPU mask needs CPUID faulting, and /proc/cpuinfo's flags have no "
                "cpuid_fault on this CPU or kernel; run the studies on an AVX2 CPU whose "
                "fingerprint matches instead")
    if not (shutil.which("cc") or shutil.which("gcc")):
        return "the CPU mask is built with a C compiler; install one (apt-get install gcc)"
    return None


def build(cache_dir: str | None = None) -> str:
    """The path of the mask's shared library, compiled from `cpu_mask.c` on first use into
    `cache_dir` (default ~/.cache/grpo_jax), named by the source's hash, so an edited source
    is rebuilt. Raises RuntimeError with `unavailable`'s line where it cannot work."""
    why = unavailable()
    if why:
        raise RuntimeError(f"cpu-mask: {why}")
    with open(SOURCE, "rb") as source:
        digest = hashlib.sha256(source.read()).hexdigest()[:12]
    cache_dir = cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "grpo_jax")
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"cpu_mask-{digest}.so")
    if os.path.exists(path):
        return path
    compiler = shutil.which("cc") or shutil.which("gcc")
    handle, scratch = tempfile.mkstemp(suffix=".so", dir=cache_dir)
    os.close(handle)
    try:
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", scratch, SOURCE],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"cpu-mask: {compiler} failed on {SOURCE}: "
                               + " ".join(done.stderr.split())[:300])
        os.replace(scratch, path)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)
    return path

