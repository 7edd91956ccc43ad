"""Host memory: keep freed memory for reuse instead of handing it back to the system.

Every call of a compiled XLA:CPU program allocates its buffers (one temporary block of tens
to hundreds of MB for a training step) and frees them at the end. With glibc's default
malloc a block that large is mmap'd and unmapped again, or trimmed off a per-thread heap,
so the next call faults every page in anew: the main job's pretraining step took ~37,000
page faults per call, a quarter of its CPU time in the kernel. `reuse_freed_memory()` sets
three malloc options so those pages stay mapped and are reused:

- `M_MMAP_MAX = 0`: no allocation is served by its own mmap (each would be unmapped on free);
- `M_TRIM_THRESHOLD = 1 GiB`: free memory at the top of the heap is not given back;
- `M_ARENA_MAX = 1`: every thread allocates from the main heap. By default each thread may
  get a heap of its own, of at most 64 MB, and glibc maps a larger block there whatever
  `M_MMAP_MAX` says; XLA runs a program from its worker threads as well as the caller's, so
  with 2 arenas the big blocks were still mapped anew at some calls (under load, at every
  call of tests/test_host_memory.py's probe). The price is one lock for all threads: 2.5x
  the context switches; no loss in the pretraining step, but the sampler's many small
  allocations wait for it (bench_grpo's sampling phase at hidden 128: 0.19 -> 0.26 s).

On this project's 2-core CPU machine the main job's pretraining step went from 196 to 148 ms
(median of 1500; the whole job 463 s -> 412 s, identical metrics) and the GRPO update at
hidden 128 from 0.44 to 0.35 s (benchmarks/README.md). The cost: the resident memory stays
at its high-water mark instead of shrinking between steps, and the fused RL iteration, whose
program runs ten iterations per call, gains nothing (1.54 s without, 1.69 s with, in one
series of runs). It only changes the host allocator, never what a run computes.

The arena setting applies to threads that have not allocated yet, so call it before the
first jax computation (XLA's threads start with the backend): `main` calls it before
anything else, `pipeline.train_and_evaluate` again (a no-op the second time), and the
benchmarks first thing. `config.reuse_host_memory = False` leaves the allocator as the
system set it. The same settings for any process, from outside it:
`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_ARENA_MAX=1`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_SETTINGS = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 1 << 30), (_M_ARENA_MAX, 1))
# The same settings as environment variables (read by glibc when a process starts).
ENVIRONMENT = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
               "MALLOC_ARENA_MAX": "1"}

_applied = False


def reuse_freed_memory() -> bool:
    """Sets glibc malloc to keep and reuse freed memory (see the module docstring).

    Returns True when the settings are in effect (now or from an earlier call), False where
    the C library is not glibc (macOS, musl) and nothing was changed.
    """
    global _applied
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _applied = all(mallopt(param, value) == 1 for param, value in _SETTINGS)
    return _applied
