"""XLA compilation: the persistent cache and a clock of the time spent compiling.

A run compiles its programs (the train step, the sampler, the log-prob pass, ...) once per
process. With the persistent cache (`config.compilation_cache_dir`, on by default) the
compiled executables are kept on disk, keyed by the program, the compiler options and the
jax version, so a rerun or a resume of the same run loads them instead of compiling again;
so does a second stage or Run in one process that builds the same program anew.

`CLOCK` sums what jax reports through `jax.monitoring` (tracing, lowering to StableHLO and
the backend compile or cache load), so the loops can log compilation separately from the
time of a step:

    mark = compilation.CLOCK.seconds()
    ... step ...
    compile_s = compilation.CLOCK.seconds() - mark
"""

from __future__ import annotations

import os
import sys
import threading

import jax
from jax.experimental.compilation_cache import compilation_cache

DEFAULT_CACHE_DIR = "~/.cache/grpo_jax/xla"
# When set, this directory is used instead of the config's (a cluster's shared scratch disk,
# or a test session's own cache); "" turns the cache off.
ENV_VAR = "GRPO_JAX_COMPILATION_CACHE_DIR"

# jax's duration events of turning a function into an executable (jax._src.dispatch).
_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
           "/jax/core/compile/jaxpr_to_mlir_module_duration",
           "/jax/core/compile/backend_compile_duration")
_BACKEND = _EVENTS[2]
_HIT = "/jax/compilation_cache/cache_hits"
# Programs that compiled in less than this many seconds are not written to the cache (jax's
# jax_persistent_cache_min_compile_time_secs, whose own default is 1 s): 0 keeps every one,
# as the CPU jobs' tiny models compile in well under a second. The test session raises it
# (tests/conftest.py), where thousands of single-op programs compile in milliseconds, less
# than storing each one costs.
MIN_COMPILE_SECS = 0.0


class CompileClock:
    """Process-wide totals of compilation seconds, backend compiles and cache hits."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._compiles = 0
        self._hits = 0
        self._installed = False

    def install(self) -> None:
        """Registers the listeners (once per process; jax keeps them for its lifetime)."""
        with self._lock:
            if self._installed:
                return
            self._installed = True
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, seconds: float, **_) -> None:
        if event in _EVENTS:
            with self._lock:
                self._seconds += seconds
                self._compiles += event == _BACKEND

    def _on_event(self, event: str, **_) -> None:
        if event == _HIT:
            with self._lock:
                self._hits += 1

    def seconds(self) -> float:
        """Seconds spent tracing, lowering and compiling (or loading from the cache)."""
        return self._seconds

    def compiles(self) -> int:
        """Programs handed to the backend (compiled, or loaded from the persistent cache)."""
        return self._compiles

    def cache_hits(self) -> int:
        """Programs loaded from the persistent cache instead of compiled."""
        return self._hits


CLOCK = CompileClock()


def use_cache(path: str | None) -> str | None:
    """Points jax's persistent compilation cache at `path` ("" or None: off), or at
    $GRPO_JAX_COMPILATION_CACHE_DIR when that is set.

    Every program that compiled in MIN_COMPILE_SECS or more is cached (by default every
    one: the tiny models of the CPU jobs compile in well under jax's default 1 s
    threshold). Returns the absolute directory, or None when the cache is off. Safe to
    call again with another path (the next compile uses it), e.g. for several runs in one
    process.

    A directory that cannot be created or written turns the cache off with one warning line
    on stderr and the run goes on: the cache only saves compile time, and jax would
    otherwise warn at every program it fails to store.
    """
    CLOCK.install()
    source = f"${ENV_VAR}" if ENV_VAR in os.environ else "config.compilation_cache_dir"
    path = os.environ.get(ENV_VAR, path)
    path = os.path.abspath(os.path.expanduser(path)) if path else None
    problem = _unwritable(path) if path is not None else None
    if problem:
        print(f"warning: {source}: {problem}; running without the compilation cache",
              file=sys.stderr, flush=True)
        path = None
    current = jax.config.jax_compilation_cache_dir
    if path == current:
        return path
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # the cache reads its directory once: read it again
    return path


def _unwritable(path: str) -> str | None:
    """Why the cache cannot live in `path` (created when missing), or None."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        return f"cannot create {path!r} ({err.strerror or err})"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path!r} is not writable by this user"
    return None
