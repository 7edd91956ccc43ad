"""What a run does when the machine or the numbers turn against it.

- `StopRequest`: SIGTERM / SIGINT (what schedulers send before preemption, and Ctrl-C) set a
  flag; the loops finish the current step, checkpoint and raise `Preempted`, which the
  command line turns into one line and exit status 0. A second signal interrupts at once.
- `SkipCounter`: the update functions never apply a non-finite loss, gradient or update
  (`grpo_jax.training.apply_if_finite`); the loops count the skipped steps and stop with
  `NonFiniteError` after `config.max_consecutive_skips` in a row.
- `WorkdirLock`: one run per workdir (an advisory `flock` on `<workdir>/.lock`, released by
  the kernel when the holder dies, so a stale lock is simply taken over).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import threading


class Preempted(Exception):
    """The run stopped on a signal after writing a checkpoint (exit status 0)."""


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a non-finite loss, gradient or update."""


class WorkdirBusyError(RuntimeError):
    """Another live process holds the workdir."""


class StopRequest:
    """SIGTERM / SIGINT handlers that only set a flag (installed from the main thread).

    Use as a context manager around a run; `requested` is the signal's name once one came.
    A second signal while a stop is pending raises KeyboardInterrupt (stop now).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested: str | None = None
        self._previous = {}

    def _handler(self, signum, frame):
        del frame
        if self.requested is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping now")
        self.requested = signal.Signals(signum).name
        print(f"[grpo_jax] {self.requested} received: finishing the current step, then "
              "saving a checkpoint (send it again to stop at once)", flush=True)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}


class SkipCounter:
    """Counts steps whose update was skipped as non-finite; `check` raises after `limit`
    in a row."""

    def __init__(self, limit: int):
        self.limit, self.consecutive, self.total = limit, 0, 0
        self.what: list[str] = []

    def count(self, metrics: dict) -> dict:
        """Records one step from its update metrics (`skipped` > 0 when an update of the
        step was not applied, `nonfinite_*` naming what); returns {"skipped_steps": total}."""
        skipped = metrics.get("skipped", 0.0) > 0
        self.consecutive = self.consecutive + 1 if skipped else 0
        self.total += int(skipped)
        if skipped:
            self.what = [what for what in ("loss", "grad", "update")
                         if metrics.get(f"nonfinite_{what}", 0.0) > 0] or ["update"]
        return {"skipped_steps": float(self.total)}

    def check(self, stage_name: str, stage_step: int) -> None:
        if self.consecutive >= self.limit:
            raise NonFiniteError(
                f"{stage_name} step {stage_step}: non-finite {' and '.join(self.what)} in "
                f"{self.consecutive} consecutive steps (max_consecutive_skips={self.limit}); "
                "none of them was applied and every checkpoint holds finite parameters")


class WorkdirLock:
    """An exclusive advisory lock on `<workdir>/.lock` holding the owner's process id."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, ".lock")
        self._file = None

    def acquire(self) -> None:
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise WorkdirBusyError(
                f"workdir {os.path.dirname(self.path)} is in use by process {holder}; wait "
                "for it to finish or use another --workdir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
