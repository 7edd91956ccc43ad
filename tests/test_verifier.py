"""The math-verify pool (grpo_jax.rewards.verifier): a CPU-time deadline the kernel enforces,
calls that queue for a worker (never "busy" because others are slow), the same verdict for a
decidable pair whatever the load, a stopped worker given up, stuck workers replaced without
stalling other calls, and no worker outliving the pool or its process. A stuck comparison is
simulated by the worker's test hook (`--test-hang-prefix`: it spins on the CPU, never
answering)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from grpo_jax.rewards import accuracy, verifier

pytest.importorskip("math_verify")

DEADLINE = 1.0  # CPU seconds of a comparison
WAIT = 1.0  # a worker stopped this long with a request pending is given up
TICK = 0.05  # /proc's clock ticks and the kernel's timer resolution
HANG = ["--test-hang-prefix", "HANG"]
DECIDABLE = [("\\frac{1}{2}", "0.5"), ("x+1", "1+x"), ("\\sqrt{4}", "2"), ("\\frac{1}{3}", "0.5"),
             ("2x", "x^2"), ("\\frac{6}{8}", "\\frac{3}{4}"), ("2\\pi", "\\pi+\\pi"),
             ("(x+1)^2", "x^2+2x+1"), ("\\frac{2}{3}", "0.6667"), ("3", "\\sqrt{9}"),
             ("x^2-1", "(x-1)(x+1)"), ("\\sin(0)", "0"), ("\\frac{1}{4}", "25\\%"),
             ("e^{0}", "1"), ("10^{3}", "1000"), ("\\{1,2\\}", "\\{2,1\\}")]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_dead(pids, timeout=5.0) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def _timed(fn, *args):
    begin = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - begin


@pytest.fixture
def pool():
    pool = verifier.VerifierPool(2, wait_seconds=WAIT, worker_args=HANG)
    assert pool.wait_ready(timeout=60)
    yield pool
    pool.shutdown()


def _balanced(stats) -> bool:
    return stats["calls"] == sum(stats[k] for k in ("decided", "timeouts", "timeouts_cached",
                                                    "busy", "errors"))


def _busy_pid(pool) -> int:
    """The pid of a worker in a comparison (waits until one is)."""
    # pylint: disable=protected-access
    while True:
        with pool._cond:
            idle = set(pool._idle)
            busy = [worker.process.pid for worker in pool._live if worker not in idle]
        if busy:
            return busy[0]
        time.sleep(0.01)


def test_a_stuck_comparison_ends_at_its_cpu_deadline_and_the_next_call_is_prompt(pool):
    verdict, seconds = _timed(pool.compare, "HANG 1", "x", DEADLINE)
    assert verdict == verifier.TIMEOUT and seconds >= DEADLINE
    # never past the deadline (the kernel's timer); /proc's last reading may come earlier
    assert pool.max_cpu_seconds() <= DEADLINE + TICK
    stats = pool.stats()
    assert stats["timeouts"] == 1 and stats["worker_restarts"] == 1
    # The other worker answers at once: no restart or import on this call's clock.
    verdict, seconds = _timed(pool.compare, "\\frac{1}{2}", "0.5", DEADLINE)
    assert verdict is True and seconds < DEADLINE
    # The timed-out pair is cached as undecided: no second stall, counted as a repeat.
    verdict, seconds = _timed(pool.compare, "HANG 1", "x", DEADLINE)
    assert verdict == verifier.TIMEOUT and seconds < 0.1
    assert pool.stats()["timeouts_cached"] == 1
    assert pool.wait_ready(timeout=60)  # the replacement came up in the background
    assert len(pool.worker_pids()) == 2 and _balanced(pool.stats())
    # A deadline of 0 is a timeout without a worker.
    assert pool.compare("\\frac{3}{6}", "0.5", 0.0) == verifier.TIMEOUT


def test_decidable_pairs_score_the_same_from_eight_threads_behind_stuck_comparisons(pool):
    """Cache cleared, both workers stuck on adversarial answers, then 8 threads x 16 pairs
    that math-verify decides in milliseconds: every thread gets the single-threaded verdicts
    (a call waits for a worker; it is never "busy" because the others are slow)."""
    expected = {pair: pool.compare(*pair, DEADLINE) for pair in DECIDABLE}
    assert all(verdict in (True, False, None) for verdict in expected.values()), expected
    pool.clear_cache()
    assert pool.wait_ready(timeout=60)
    before = pool.stats()
    stuck = [threading.Thread(target=pool.compare, args=(f"HANG load {i}", "x", DEADLINE))
             for i in range(2)]
    for thread in stuck:
        thread.start()
    while pool._idle:  # pylint: disable=protected-access
        time.sleep(0.01)
    results = {}

    def client(i):
        order = DECIDABLE[i:] + DECIDABLE[:i]
        results[i] = {pair: pool.compare(*pair, DEADLINE) for pair in order}

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads + stuck:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads + stuck)
    for i in range(8):
        differ = {pair: verdict for pair, verdict in results[i].items()
                  if verdict != expected[pair]}
        assert not differ, f"thread {i}: {differ}"
    stats = {key: value - before[key] for key, value in pool.stats().items()}
    assert stats["busy"] == 0 and stats["errors"] == 0 and stats["timeouts"] == 2
    assert stats["calls"] == 2 + 8 * len(DECIDABLE) and _balanced(stats)


def test_busy_only_when_no_worker_can_start():
    pool = verifier.VerifierPool(1, worker_args=["--no-such-flag"])
    try:
        verdict, seconds = _timed(pool.compare, "\\frac{2}{4}", "0.5", DEADLINE)
        assert verdict == verifier.BUSY and seconds < 30
        stats = pool.stats()
        assert stats["busy"] == 1 and stats["worker_start_failures"] >= 1 and _balanced(stats)
        # "busy" is not cached.
        assert pool.compare("\\frac{2}{4}", "0.5", DEADLINE) == verifier.BUSY
        assert pool.stats()["busy"] == 2
    finally:
        pool.shutdown()


def test_a_stopped_worker_is_given_up_after_the_wait(pool):
    out = []
    stuck = threading.Thread(target=lambda: out.append(
        _timed(pool.compare, "HANG stopped", "x", 30.0)))
    stuck.start()
    pid = _busy_pid(pool)
    time.sleep(0.1)  # the request is on its way
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    stuck.join(timeout=30)
    assert out and out[0][0] == verifier.ERROR
    assert WAIT - 0.5 <= time.monotonic() - stopped < WAIT + 5  # seen running until stopped
    assert _wait_dead([pid]) == []
    assert pool.stats()["errors"] == 1 and pool.stats()["worker_restarts"] == 1
    assert pool.compare("\\frac{5}{10}", "0.5", DEADLINE) is True


def test_same_pair_same_verdict_and_real_equivalences(pool):
    cases = [("\\frac{1}{2}", "0.5", True), ("x+1", "1+x", True), ("\\sqrt{4}", "2", True),
             ("\\frac{1}{3}", "0.5", False), ("2x", "x^2", False)]
    for predicted, reference, expected in cases:
        assert pool.compare(predicted, reference, DEADLINE) is expected
    hits = pool.stats()["cache_hits"]
    for _ in range(3):
        for predicted, reference, expected in cases:
            assert pool.compare(predicted, reference, DEADLINE) is expected
    assert pool.stats()["cache_hits"] == hits + 3 * len(cases)
    # Concurrent calls on the same pair share one comparison (one stall, not four).
    out = []
    threads = [threading.Thread(target=lambda: out.append(
        pool.compare("HANG same", "x", DEADLINE))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert out == [verifier.TIMEOUT] * 4
    stats = pool.stats()
    assert stats["timeouts"] == 1 and stats["timeouts_cached"] == 3 and _balanced(stats)
    assert stats["worker_restarts"] == 1


def test_shutdown_kills_every_worker_even_a_stuck_one(pool):
    """Calls in a comparison are "error", calls waiting for a worker "busy"."""
    pids = pool.worker_pids()
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    out = []

    def call(predicted):
        out.append((predicted, pool.compare(predicted, "x", 30.0)))

    stuck = [threading.Thread(target=call, args=(f"HANG {i}",)) for i in range(2)]
    for thread in stuck:
        thread.start()
    while pool._idle:  # pylint: disable=protected-access
        time.sleep(0.01)
    queued = threading.Thread(target=call, args=("x+2",))
    queued.start()
    while not pool._queue:  # pylint: disable=protected-access
        time.sleep(0.01)
    time.sleep(0.1)  # the requests are on their way
    begin = time.monotonic()
    pool.shutdown()
    assert _wait_dead(pids, timeout=2.0) == []
    for thread in stuck + [queued]:
        thread.join(timeout=5)
    assert sorted(out) == [("HANG 0", verifier.ERROR), ("HANG 1", verifier.ERROR),
                           ("x+2", verifier.BUSY)]
    assert time.monotonic() - begin < 2.0
    assert pool.worker_pids() == []


@pytest.mark.parametrize("ending", ["sigkill", "exit"])
def test_workers_do_not_outlive_their_process(ending):
    """SIGKILL of the parent (no atexit): PR_SET_PDEATHSIG / the watchdog; a normal exit:
    the atexit shutdown."""
    script = textwrap.dedent(f"""
        import os, signal, sys, threading
        from grpo_jax.rewards import verifier
        pool = verifier.VerifierPool(2, worker_args={HANG!r})
        assert pool.wait_ready(timeout=60)
        threading.Thread(target=pool.compare, args=("HANG", "x", 60.0), daemon=True).start()
        print(*pool.worker_pids(), flush=True)
        threading.Event().wait(0.3)
        if {ending!r} == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(0)
    """)
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert process.returncode == (-signal.SIGKILL if ending == "sigkill" else 0), process.stderr
    pids = [int(pid) for pid in process.stdout.split()]
    assert len(pids) == 2
    assert _wait_dead(pids, timeout=5.0) == []


def test_accuracy_reward_through_the_process_pool():
    before = accuracy.verifier_stats()
    settings = accuracy.configure_verifier()
    try:
        assert accuracy.configure_verifier(deadline_seconds=1.5, workers=3, wait_seconds=1.0) == {
            "deadline_seconds": 1.5, "workers": 3, "wait_seconds": 1.0,
            "startup_seconds": settings["startup_seconds"]}
        assert accuracy.accuracy_reward("<answer>\\frac{1}{2}</answer>", "0.5") == 1.0
        assert accuracy.accuracy_reward("<answer>\\frac{1}{3}</answer>", "0.5") == 0.0
        # Equal normalised strings never need a worker.
        calls = accuracy.verifier_stats()["calls"]
        assert accuracy.answers_match("\\frac{1}{7}", "\\frac{1}{7} ") is True
        after = accuracy.verifier_stats()
        assert after["calls"] == calls >= before["calls"] + 2
        assert set(after) == set(before) and _balanced(after)
        assert accuracy.math_verify_timeouts() == after["timeouts"]
        for bad in ({"deadline_seconds": 0}, {"workers": 0}, {"wait_seconds": -1}):
            with pytest.raises(ValueError):
                accuracy.configure_verifier(**bad)
    finally:
        accuracy.configure_verifier(deadline_seconds=settings["deadline_seconds"],
                                    workers=settings["workers"],
                                    wait_seconds=settings["wait_seconds"])
