"""A pool of math-verify worker processes; every comparison is bounded in CPU time.

math-verify (sympy underneath) can run for minutes on a short adversarial answer, and its own
timeout is a SIGALRM (main thread only), so every comparison runs in a worker process
(`grpo_jax/rewards/math_verify_worker.py`) and the calling thread waits on a pipe.

The one bound of a call is its comparison's CPU time: the worker arms a CPU-time timer
(ITIMER_PROF) of `deadline` seconds before it compares, and the kernel ends the worker when
the comparison has used them (SIGPROF); the call is then "timeout", undecided, and the worker
is replaced in the background. CPU time, not wall time, so a verdict does not depend on the
machine's load or on how many threads call at once: a pair math-verify decides well within
the deadline is decided whatever else runs.

* Calls queue, first come first served, for one of `workers` worker processes; a call is
  never turned away because the workers are busy. At most `workers` comparisons run at once,
  so a call's wall time is its wait in the queue plus its own comparison, both of which grow
  with the load; the CPU time of a comparison never exceeds `deadline` (to the kernel's
  timer resolution).
* Workers start ahead of need: the pool starts `workers` of them on its first comparison (or
  on `start()`), each reports ready after importing math-verify and deciding one warm-up
  pair; the import never counts against a comparison's deadline.
* Liveness, not a bound on a comparison: a worker that has a request and has stopped running
  (stopped, traced, or asleep, its CPU clock still) for `wait_seconds` is killed and the call
  is "error"; a worker not ready `startup_seconds` after its start is killed and started
  again (with back-off), and while the last `workers` starts in a row have failed (or after
  `shutdown()`) a call is "busy": no worker can be had.
* Verdicts are cached per (predicted, reference) pair in a bounded LRU, and concurrent calls
  on the same pair share one comparison. math-verify's verdict is deterministic and the
  deadline counts CPU time, so a timeout is cached too: a pair that timed out once keeps its
  "timeout" for the rest of the run (until the LRU evicts it or `clear_cache()`), which means
  repeats of an adversarial answer cost nothing; `stats()` says how many calls were undecided
  ("timeouts" first occurrences, "timeouts_cached" repeats, "busy", "errors"). "busy" and
  "errors" (a worker that died mid-call) are not cached: they depend on the pool's state,
  not on the text.
* Workers never outlive the pool's process: they exit when their stdin closes, they ask
  Linux to SIGKILL them when the pool's spawning thread (a thread that lives as long as the
  pool) dies (PR_SET_PDEATHSIG) and otherwise poll their parent's pid, they are started in
  the parent's process group (a kill of the group reaches them) and ignore SIGINT (the pool
  decides when they stop), and `shutdown()` (run at interpreter exit) kills them.

Works from any thread; uses poll(), not select(), so high descriptor numbers are fine.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref

# Verdicts besides True / False / None (math-verify could not parse: decided, deterministic).
TIMEOUT = "timeout"  # the comparison used its CPU deadline (cached: see the module docstring)
BUSY = "busy"  # no worker can be had: shut down, or the last starts failed (not cached)
ERROR = "error"  # the worker died or stopped running mid-call (not cached)

# Defaults of the process-wide pool (`configure` changes them).
WORKERS = 2
WAIT_SECONDS = 2.0  # a worker stopped with a request pending this long is killed
STARTUP_SECONDS = 120.0  # a worker not ready this long after its start is started again
CACHE_SIZE = 65536
_CHECK_SECONDS = 0.25  # how often a waiting call looks at its worker's CPU clock and state
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_STAT_KEYS = ("calls", "decided", "timeouts", "timeouts_cached", "busy", "errors", "cache_hits",
              "worker_restarts", "worker_start_failures")
_MISSING = object()
_CANCELLED = object()
_POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR
_POOLS: "weakref.WeakSet[VerifierPool]" = weakref.WeakSet()


class _WorkerDied(Exception):
    """The worker is gone; `sent` says whether it had the request."""

    def __init__(self, sent: bool = True):
        super().__init__()
        self.sent = sent


class _Worker:
    """One worker process and the parent's end of its pipes (owned by one thread at a time)."""

    def __init__(self, process: subprocess.Popen, boot_deadline: float):
        self.process = process
        self.stdin_fd = process.stdin.fileno()
        self.stdout_fd = process.stdout.fileno()
        self.buffer = b""
        self.sequence = 0
        self.boot_deadline = boot_deadline

    def take_line(self) -> bytes | None:
        newline = self.buffer.find(b"\n")
        if newline < 0:
            return None
        line, self.buffer = self.buffer[:newline], self.buffer[newline + 1:]
        return line

    def read_some(self) -> None:
        chunk = os.read(self.stdout_fd, 65536)
        if not chunk:
            raise _WorkerDied
        self.buffer += chunk

    def clock(self) -> tuple[float, str] | None:
        """The worker's user + system CPU seconds and its state letter (/proc/<pid>/stat;
        a zombie's still reads), None where unreadable."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICKS, fields[0].decode()
        except (OSError, IndexError, ValueError, UnicodeDecodeError):
            return None

    def request(self, predicted: str, reference: str, deadline: float, stall_seconds: float):
        """(verdict, CPU seconds the comparison used or None): the worker's verdict, or
        TIMEOUT when its CPU timer ended it; raises _WorkerDied (it died otherwise, or stopped
        running with the request pending for `stall_seconds`)."""
        self.sequence += 1
        before = self.clock()
        message = (json.dumps([self.sequence, predicted, reference, deadline]) + "\n").encode()
        try:
            while message:
                message = message[os.write(self.stdin_fd, message):]
        except OSError as error:
            raise _WorkerDied(sent=False) from error
        poller = select.poll()
        poller.register(self.stdout_fd, _POLL_IN)
        last, still_since = before, time.monotonic()
        while True:
            line = self.take_line()
            while line is not None:
                try:
                    sequence, verdict = json.loads(line)
                except (ValueError, TypeError):
                    sequence, verdict = None, None
                if sequence == self.sequence:
                    return (verdict if verdict in (True, False) else None), self._used(before)
                line = self.take_line()
            if poller.poll(int(_CHECK_SECONDS * 1000)):
                try:
                    self.read_some()
                except _WorkerDied:
                    used = self._used(before)  # read before the zombie is reaped
                    if self._exit_code() == -signal.SIGPROF:
                        return TIMEOUT, used
                    raise
                continue
            now, sample = time.monotonic(), self.clock()
            if sample is None or last is None or sample[0] > last[0] or sample[1] in "RD":
                last, still_since = sample, now  # running, runnable, or in disk sleep
            elif now - still_since >= stall_seconds:
                raise _WorkerDied

    def _used(self, before) -> float | None:
        after = self.clock()
        return None if before is None or after is None else after[0] - before[0]

    def _exit_code(self) -> int | None:
        try:
            return self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class VerifierPool:
    """A pool of math-verify worker processes (see the module docstring).

    Args:
      workers: number of worker processes.
      wait_seconds: how long a call waits on a worker that has stopped running (stopped,
        traced, or asleep, its CPU clock still) with its request pending before it kills it
        (the call is "error").
      startup_seconds: a worker not ready this long after its start is killed and started
        again.
      cache_size: entries of the verdict LRU.
      worker_args: extra command-line arguments of the workers (tests use
        `["--test-hang-prefix", PREFIX]`: a worker spins on the CPU, never answering, on a
        predicted answer that starts with PREFIX).
    """

    def __init__(self, workers: int = WORKERS, *, wait_seconds: float = WAIT_SECONDS,
                 startup_seconds: float = STARTUP_SECONDS, cache_size: int = CACHE_SIZE,
                 worker_args=()):
        self.workers = _positive_int(workers, "workers")
        self.wait_seconds = _non_negative(wait_seconds, "wait_seconds")
        self.startup_seconds = _non_negative(startup_seconds, "startup_seconds")
        self.cache_size = _positive_int(cache_size, "cache_size")
        self.worker_args = [str(arg) for arg in worker_args]
        self._cond = threading.Condition(threading.Lock())
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._flights: dict = {}
        self._counts = dict.fromkeys(_STAT_KEYS, 0)
        self._max_cpu = 0.0
        self._final = False
        self._reset_processes()
        _POOLS.add(self)

    def _reset_processes(self) -> None:
        """State of the processes and the spawning thread (none of either)."""
        self._manager = None
        self._stopped = True
        self._live: set = set()  # booting, idle and busy workers
        self._idle: list = []
        self._queue: collections.deque = collections.deque()  # tickets of waiting calls
        self._procs: set = set()  # every worker not yet killed and reaped by us
        self._kills: list = []
        self._wake = None
        self._failures_in_a_row = 0
        self._next_spawn = 0.0

    # -- public ----------------------------------------------------------------------------

    def compare(self, predicted: str, reference: str, deadline: float):
        """math-verify's verdict on (predicted, reference), its comparison given at most
        `deadline` seconds of its worker's CPU time.

        Returns:
          True / False (math-verify's verdict), None (math-verify could not parse or is not
          installed), or TIMEOUT / BUSY / ERROR (undecided). Never raises. Waits its turn for
          a worker first: the wall time of a call depends on the queue, its verdict does not.
        """
        key = (predicted, reference)
        with self._cond:
            self._counts["calls"] += 1
            verdict = self._cache.get(key, _MISSING)
            if verdict is not _MISSING:
                self._cache.move_to_end(key)
                self._counts["cache_hits"] += 1
                self._count(verdict, repeat=True)
                return verdict
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = [threading.Event(), ERROR]
        if not leader:  # the same pair is being compared right now: share its verdict
            flight[0].wait()
            verdict = flight[1]
            with self._cond:
                self._counts["cache_hits"] += verdict not in (BUSY, ERROR)
                self._count(verdict, repeat=True)
            return verdict
        verdict = ERROR
        try:
            verdict = self._compute(predicted, reference, deadline)
        except Exception:  # pylint: disable=broad-except
            verdict = ERROR
        finally:
            with self._cond:
                if verdict not in (BUSY, ERROR):
                    self._cache[key] = verdict
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
                self._flights.pop(key, None)
                self._count(verdict, repeat=False)
            flight[1] = verdict
            flight[0].set()
        return verdict

    def start(self) -> bool:
        """Starts the workers (idempotent); False after the final shutdown."""
        with self._cond:
            if self._final:
                return False
            if self._manager is not None:
                return True
            self._stopped = False
            self._wake = os.pipe()
            os.set_blocking(self._wake[0], False)
            os.set_blocking(self._wake[1], False)
            # The workers' PR_SET_PDEATHSIG fires when the thread that started them ends, so
            # one thread that lives as long as the pool starts them all.
            self._manager = threading.Thread(target=self._manage, args=(self._wake[0],),
                                             name="math-verify-pool", daemon=True)
            self._manager.start()
            return True

    def wait_ready(self, count: int | None = None, timeout: float = 30.0) -> bool:
        """Starts the pool and waits until `count` (default: all) workers are idle and ready."""
        count = self.workers if count is None else count
        if not self.start():
            return False
        end = time.monotonic() + timeout
        with self._cond:
            while len(self._idle) < count:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def resize(self, workers: int) -> None:
        """Changes the number of workers (extra idle ones stop, missing ones start)."""
        workers = _positive_int(workers, "workers")
        with self._cond:
            self.workers = workers
            while len(self._live) > workers and self._idle:
                self._retire(self._idle.pop())
            self._wake_manager()  # to start missing ones
            self._cond.notify_all()  # calls in the queue see the new count of failed starts

    def stats(self) -> dict:
        """Cumulative counts of this pool: calls = decided + timeouts + timeouts_cached + busy
        + errors; cache_hits (answered from the cache or a concurrent identical call),
        worker_restarts (workers replaced after a timeout, a death or a failed start),
        worker_start_failures (workers that died or hung before they were ready)."""
        with self._cond:
            return dict(self._counts)

    def max_cpu_seconds(self) -> float:
        """The most CPU seconds one comparison of this pool has used (/proc's clock ticks;
        0.0 where unreadable): at most the deadline, to the timer's and the ticks'
        resolution."""
        with self._cond:
            return self._max_cpu

    def worker_pids(self) -> list:
        """Process ids of the live workers (booting, idle or busy)."""
        with self._cond:
            return sorted(worker.process.pid for worker in self._live)

    def clear_cache(self) -> None:
        with self._cond:
            self._cache.clear()

    def shutdown(self, *, final: bool = False) -> None:
        """Kills every worker and stops the spawning thread; calls waiting for a worker are
        "busy", calls in a comparison "error"; the pool starts again on the next comparison
        unless `final` (interpreter exit)."""
        with self._cond:
            self._final = self._final or final
            self._stopped = True
            manager, wake = self._manager, self._wake
            self._cancel_queue_locked()
        if manager is None:
            return
        self._wake_manager()
        if manager is not threading.current_thread():
            manager.join(timeout=5)
        with self._cond:
            procs = list(self._procs)
            self._reset_processes()
            self._cond.notify_all()
        for worker in procs:
            worker.kill()
        for fd in wake:
            try:
                os.close(fd)
            except OSError:
                pass

    # -- calls -----------------------------------------------------------------------------

    def _count(self, verdict, *, repeat: bool) -> None:
        if verdict == TIMEOUT:
            self._counts["timeouts_cached" if repeat else "timeouts"] += 1
        elif verdict == BUSY:
            self._counts["busy"] += 1
        elif verdict == ERROR:
            self._counts["errors"] += 1
        else:
            self._counts["decided"] += 1

    def _compute(self, predicted: str, reference: str, deadline: float):
        if not _math_verify_installed():
            return None
        if not deadline > 0:
            return TIMEOUT
        if not self.start():
            return BUSY
        while True:
            worker = self._acquire()
            if worker is None:
                return BUSY
            try:
                verdict, used = worker.request(predicted, reference, deadline, self.wait_seconds)
            except _WorkerDied as died:
                self._replace(worker)
                if not died.sent:  # it died before it had the request: try another
                    continue
                return ERROR
            with self._cond:
                self._max_cpu = max(self._max_cpu, used or 0.0)
            if verdict == TIMEOUT:
                self._replace(worker)
            else:
                self._release(worker)
            return verdict

    def _acquire(self):
        """The next worker for this call, first come first served; None when none can be had
        (shut down, or the last `workers` starts failed)."""
        with self._cond:
            ticket = None
            while True:
                if ticket is not None and ticket[0] is not None:
                    return None if ticket[0] is _CANCELLED else ticket[0]
                if self._stopped or self._failures_in_a_row >= self.workers:
                    if ticket is not None:
                        self._queue.remove(ticket)
                    return None
                if ticket is None:
                    while self._idle and not self._queue:
                        worker = self._idle.pop()
                        if worker.process.poll() is None:
                            return worker
                        self._replace_locked(worker)  # died while idle: try another
                    ticket = [None]
                    self._queue.append(ticket)
                self._cond.wait()

    def _cancel_queue_locked(self) -> None:
        while self._queue:
            self._queue.popleft()[0] = _CANCELLED
        self._cond.notify_all()

    def _hand_over_locked(self, worker) -> None:
        """(Lock held.) Gives a free worker to the first call in the queue, else makes it idle."""
        if self._queue:
            self._queue.popleft()[0] = worker
        else:
            self._idle.append(worker)
        self._cond.notify_all()  # waiters of wait_ready share the condition

    def _release(self, worker) -> None:
        with self._cond:
            if worker not in self._live:  # the pool was shut down meanwhile
                return
            if len(self._live) > self.workers:
                self._retire(worker)
            else:
                self._hand_over_locked(worker)

    def _replace(self, worker) -> None:
        with self._cond:
            self._replace_locked(worker)

    def _replace_locked(self, worker) -> None:
        if worker in self._live:
            self._counts["worker_restarts"] += 1
            self._retire(worker)

    def _retire(self, worker) -> None:
        """(Lock held.) Hands the worker to the spawning thread to kill; it starts another
        where fewer than `workers` are left."""
        self._live.discard(worker)
        self._kills.append(worker)
        self._wake_manager()

    # -- the spawning thread ---------------------------------------------------------------

    def _wake_manager(self) -> None:
        wake = self._wake
        if wake is not None:
            try:
                os.write(wake[1], b"x")
            except OSError:  # full (it will wake anyway) or closed (shut down)
                pass

    def _manage(self, wake_fd: int) -> None:
        """Starts, boots (waits for the ready line) and kills workers; the only thread that
        starts worker processes."""
        poller = select.poll()
        poller.register(wake_fd, select.POLLIN)
        booting: dict = {}
        while True:
            with self._cond:
                kills, self._kills = self._kills, []
                stopped = self._stopped or self._manager is not threading.current_thread()
                missing = 0 if stopped else self.workers - len(self._live)
            for worker in kills:
                if booting.get(worker.stdout_fd) is worker:
                    poller.unregister(booting.pop(worker.stdout_fd).stdout_fd)
                self._kill(worker)
            if stopped:
                for worker in booting.values():
                    self._kill(worker)
                return
            now = time.monotonic()
            if missing > 0 and now >= self._next_spawn:
                for _ in range(missing):
                    worker = self._spawn()
                    if worker is not None:
                        booting[worker.stdout_fd] = worker
                        poller.register(worker.stdout_fd, _POLL_IN)
            timeout = 1.0
            if booting:
                timeout = min(timeout, min(w.boot_deadline for w in booting.values()) - now)
            if missing > 0:
                timeout = min(timeout, self._next_spawn - now)
            for fd, event in poller.poll(max(0, int(timeout * 1000) + 1)):
                if fd == wake_fd and event & select.POLLNVAL:
                    return  # shut down without this thread (join timed out)
                if fd == wake_fd:
                    try:
                        while os.read(wake_fd, 4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                    continue
                worker = booting.get(fd)
                if worker is None:
                    continue
                try:
                    worker.read_some()
                except (_WorkerDied, OSError):
                    poller.unregister(fd)
                    self._boot_failed(booting.pop(fd))
                    continue
                if self._is_ready(worker):
                    poller.unregister(fd)
                    self._ready(booting.pop(fd))
            now = time.monotonic()
            for fd, worker in list(booting.items()):
                if now >= worker.boot_deadline:
                    poller.unregister(fd)
                    self._boot_failed(booting.pop(fd))

    def _spawn(self):
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        command = [sys.executable, "-m", "grpo_jax.rewards.math_verify_worker",
                   "--parent-pid", str(os.getpid()), *self.worker_args]
        try:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, bufsize=0, env=env,
                                       start_new_session=False)
        except OSError:
            with self._cond:
                self._counts["worker_start_failures"] += 1
                self._back_off_locked()
                self._cond.notify_all()
            return None
        worker = _Worker(process, time.monotonic() + self.startup_seconds)
        with self._cond:
            if not self._stopped and self._manager is threading.current_thread():
                self._procs.add(worker)
                self._live.add(worker)
                return worker
        worker.kill()  # shut down meanwhile
        return None

    @staticmethod
    def _is_ready(worker) -> bool:
        line = worker.take_line()
        while line is not None:
            try:
                if json.loads(line).get("ready"):
                    return True
            except (ValueError, TypeError, AttributeError):
                pass
            line = worker.take_line()
        return False

    def _ready(self, worker) -> None:
        with self._cond:
            self._failures_in_a_row = 0
            self._next_spawn = 0.0
            if worker not in self._live or self._stopped:
                self._kills.append(worker)
                return
            self._hand_over_locked(worker)

    def _boot_failed(self, worker) -> None:
        with self._cond:
            self._counts["worker_start_failures"] += 1
            if worker in self._live:
                self._counts["worker_restarts"] += 1
                self._live.discard(worker)
            self._back_off_locked()
            self._cond.notify_all()  # calls in the queue give up once `workers` in a row failed
        self._kill(worker)

    def _back_off_locked(self) -> None:
        self._failures_in_a_row += 1
        delay = min(30.0, 0.5 * 2 ** (self._failures_in_a_row - 1))
        self._next_spawn = time.monotonic() + delay

    def _kill(self, worker) -> None:
        worker.kill()
        with self._cond:
            self._procs.discard(worker)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _non_negative(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


_INSTALLED = []


def _math_verify_installed() -> bool:
    if not _INSTALLED:
        import importlib.util  # pylint: disable=import-outside-toplevel

        _INSTALLED.append(importlib.util.find_spec("math_verify") is not None)
    return _INSTALLED[0]


# -- the process-wide pool ---------------------------------------------------------------------

_POOL_LOCK = threading.Lock()
_POOL: VerifierPool | None = None


def get_pool() -> VerifierPool:
    """The process-wide pool (created on first use, started on its first comparison)."""
    global _POOL  # pylint: disable=global-statement
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool()
        return _POOL


def configure(*, workers: int | None = None, wait_seconds: float | None = None,
              startup_seconds: float | None = None, worker_args=None,
              start: bool = False) -> VerifierPool:
    """Changes the process-wide pool's settings (the counts and the cache carry over).

    `worker_args` restarts the workers with those arguments (a test hook); `start` starts
    the workers now instead of on the first comparison.
    """
    pool = get_pool()
    if wait_seconds is not None:
        pool.wait_seconds = _non_negative(wait_seconds, "wait_seconds")
    if startup_seconds is not None:
        pool.startup_seconds = _non_negative(startup_seconds, "startup_seconds")
    if worker_args is not None and [str(a) for a in worker_args] != pool.worker_args:
        pool.shutdown()
        pool.worker_args = [str(arg) for arg in worker_args]
    if workers is not None:
        pool.resize(workers)
    if start:
        pool.start()
    return pool


def _shutdown_all() -> None:
    for pool in list(_POOLS):
        pool.shutdown(final=True)


def _forget_after_fork() -> None:
    """In a forked child: the workers belong to the parent; start afresh on first use."""
    # pylint: disable=protected-access
    for pool in list(_POOLS):
        for worker in pool._procs:  # this process's copies of the parent's pipes
            for stream in (worker.process.stdin, worker.process.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        for fd in pool._wake or ():
            try:
                os.close(fd)
            except OSError:
                pass
        pool._cond = threading.Condition(threading.Lock())
        pool._flights = {}
        pool._reset_processes()


atexit.register(_shutdown_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
