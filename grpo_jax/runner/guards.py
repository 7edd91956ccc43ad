"""What a run does when the machine or the numbers turn against it.

- `StopRequest`: SIGTERM / SIGINT (what schedulers send before preemption, and Ctrl-C) set a
  flag; the loops finish the current step, checkpoint and raise `Preempted`, which the
  command line turns into one line and exit status 0. In a multi-process run the processes
  agree on the flag at every step end (`agreed`: a notice reaching one host stops all of
  them at the same step). A second signal to the same process interrupts at once.
- `SkipCounter`: the update functions never apply a non-finite loss, gradient or update
  (`grpo_jax.training.apply_if_finite`); the loops count the skipped steps and stop with
  `NonFiniteError` after `config.max_consecutive_skips` in a row.
- `CollapseWatch`: one warning line when the policy's entropy stays below a floor for
  several steps (a collapsed policy explores nothing).
- `WorkdirLock`: one run per workdir (an advisory `flock` on `<workdir>/.lock`, released by
  the kernel when the holder dies, so a stale lock is simply taken over). A workdir on an
  object store has no lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import threading

from grpo_jax import storage


class Preempted(Exception):
    """The run stopped on a signal: after writing a checkpoint (`status` 0), or at once on
    a second signal (`status` 130; the last complete checkpoint is where a rerun resumes)."""

    def __init__(self, line: str, status: int = 0):
        super().__init__(line)
        self.status = status


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a non-finite loss, gradient or update."""


class WorkdirBusyError(RuntimeError):
    """Another live process holds the workdir (`holder`: its process id, as its lock file
    says)."""

    def __init__(self, message: str, holder: str = "unknown"):
        super().__init__(message)
        self.holder = holder


class StopRequest:
    """SIGTERM / SIGINT handlers that only set a flag (installed from the main thread).

    Use as a context manager around a run; `requested` is the signal's name once one came
    (to this process, or to another process of the run once `agreed` has run). A second
    signal to this process while a stop is pending raises KeyboardInterrupt (stop now).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested: str | None = None
        self.received = 0  # signals that reached this process
        self._signum = 0  # the first of them
        self._previous = {}

    def _handler(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        self.received += 1
        if self.received > 1:  # stop now; a third signal ends the process outright
            for sig in self.SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            raise KeyboardInterrupt(f"second {name}")
        self._signum = int(signum)
        self.requested = self.requested or name
        print(f"[grpo_jax] {name} received: finishing the current step, then saving a "
              "checkpoint (send it again to stop at once)", flush=True)

    def agreed(self) -> str | None:
        """The stop request every process of the run agrees on (None: go on).

        With one process, `requested`. With several, a collective: every process must call
        it at the same point of the same step (the loops do, at each step end, before
        deciding to save), and all get the same answer: a signal that reached any one of
        them stops every one at this step.
        """
        import jax  # pylint: disable=import-outside-toplevel

        if jax.process_count() == 1:
            return self.requested
        import numpy as np  # pylint: disable=import-outside-toplevel

        from grpo_jax.parallel import allgather_rows  # pylint: disable=import-outside-toplevel

        codes = allgather_rows(np.asarray([self._signum], np.int32))
        if self.requested is None and codes.any():
            first = int(np.flatnonzero(codes)[0])
            self.requested = f"{signal.Signals(int(codes[first])).name} to process {first}"
        return self.requested

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


class CollapseWatch:
    """Warns once, in one line, when the policy's entropy per token (the `entropy` metric of
    the update) stays below `floor` nats for `steps` steps in a row: the policy has collapsed
    onto near-deterministic outputs and RL has nothing left to explore (typically a
    learning rate far too high)."""

    FLOOR, STEPS = 0.05, 5

    def __init__(self, floor: float = FLOOR, steps: int = STEPS):
        self.floor, self.steps = floor, steps
        self.below, self.warned = 0, False

    def check(self, stage_name: str, stage_step: int, metrics: dict) -> str | None:
        """The warning (printed) the first time the condition holds, else None."""
        entropy = metrics.get("entropy")
        if entropy is None:
            return None
        self.below = self.below + 1 if entropy < self.floor else 0
        if self.warned or self.below < self.steps:
            return None
        self.warned = True
        line = (f"[grpo_jax] warning: {stage_name} step {stage_step}: the policy's entropy "
                f"has stayed below {self.floor:g} nats per token for {self.below} steps (now "
                f"{entropy:.3g}): it has collapsed onto near-deterministic completions; lower "
                f"{stage_name}.lr, or raise {stage_name}.beta or {stage_name}.entropy_coef")
        print(line, flush=True)
        return line


class WorkdirLock:
    """An exclusive advisory lock on `<workdir>/.lock` holding the owner's process id.

    A workdir on an object store (gs://...) has no lock (`path` None): an object store has
    no `flock`, so one run at a time there is up to whoever starts them.
    """

    def __init__(self, workdir: str):
        local = storage.local_path(workdir)
        self.path = None if local is None else os.path.join(local, ".lock")
        self._file = None

    def acquire(self) -> None:
        if self.path is None:
            return
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
                "for it to finish or use another --workdir", holder) from None
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
