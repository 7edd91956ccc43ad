"""The math-verify pool (grpo_jax.rewards.verifier): hard deadlines, bounded waits, stuck
workers replaced without stalling other calls, the same verdict for the same pair, and no
worker outliving the pool or its process. A stuck comparison is simulated by the worker's
test hook (`--test-hang-prefix`: it never answers those requests)."""

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

DEADLINE = 1.0
WAIT = 1.0
SLACK = 0.5  # bookkeeping and a loaded 2-core machine
# A stuck (spinning) comparison ends once its worker has had DEADLINE seconds of CPU, or at the
# wall bound: the tests shorten the bound (verifier.WALL_FACTOR / WALL_SLACK) to WALL seconds,
# so a stuck call returns within WALL whatever else the machine runs.
WALL_FACTOR, WALL_SLACK = 2.0, 1.0
WALL = max(WALL_FACTOR * DEADLINE, DEADLINE + WALL_SLACK)


@pytest.fixture(autouse=True)
def _short_wall_bound(monkeypatch):
    monkeypatch.setattr(verifier, "WALL_FACTOR", WALL_FACTOR)
    monkeypatch.setattr(verifier, "WALL_SLACK", WALL_SLACK)
HANG = ["--test-hang-prefix", "HANG"]


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


def test_stuck_worker_times_out_and_the_next_call_is_prompt(pool):
    verdict, seconds = _timed(pool.compare, "HANG 1", "x", DEADLINE)
    assert verdict == verifier.TIMEOUT and DEADLINE <= seconds < WALL + SLACK
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


def test_eight_threads_with_a_stuck_input_each_are_answered_within_the_bound(pool):
    bound = WAIT + WALL + SLACK
    results = {}

    def client(i):
        results[i] = [_timed(pool.compare, f"HANG {i}", "x", DEADLINE),
                      _timed(pool.compare, f"\\frac{{{i + 1}}}{{{2 * i + 2}}}", "0.5", DEADLINE)]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    begin = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * bound)
    assert not any(thread.is_alive() for thread in threads)
    assert time.monotonic() - begin < 2 * bound + SLACK
    for (stuck, stuck_s), (normal, normal_s) in results.values():
        assert stuck in (verifier.TIMEOUT, verifier.BUSY) and stuck_s < bound
        assert normal in (True, verifier.BUSY) and normal_s < bound
    stats = pool.stats()
    assert stats["calls"] == 16 and _balanced(stats)
    assert stats["timeouts"] >= 2 and stats["timeouts"] + stats["busy"] >= 8
    assert stats["worker_restarts"] == stats["timeouts"]
    assert pool.wait_ready(timeout=60)
    assert pool.compare("\\frac{9}{18}", "0.5", DEADLINE) is True


def test_busy_when_no_worker_is_free_within_the_wait_bound():
    pool = verifier.VerifierPool(1, wait_seconds=0.3, worker_args=HANG)
    try:
        assert pool.wait_ready(timeout=60)
        stuck = threading.Thread(target=pool.compare, args=("HANG", "x", DEADLINE))
        stuck.start()
        while pool._idle:  # pylint: disable=protected-access
            time.sleep(0.01)
        verdict, seconds = _timed(pool.compare, "\\frac{2}{4}", "0.5", DEADLINE)
        assert verdict == verifier.BUSY and 0.3 <= seconds < 0.3 + SLACK
        stuck.join()
        assert pool.stats()["busy"] == 1 and pool.stats()["timeouts"] == 1
        # "busy" is not cached: once a worker is back, the pair is decided.
        assert pool.wait_ready(timeout=60)
        assert pool.compare("\\frac{2}{4}", "0.5", DEADLINE) is True
    finally:
        pool.shutdown()


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
        _timed(pool.compare, "HANG same", "x", DEADLINE))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [verdict for verdict, _ in out] == [verifier.TIMEOUT] * 4
    assert max(seconds for _, seconds in out) < WALL + SLACK  # four stalls would be >= 4 s
    stats = pool.stats()
    assert stats["timeouts"] == 1 and stats["timeouts_cached"] == 3 and _balanced(stats)


def test_shutdown_kills_every_worker_even_a_stuck_one(pool):
    pids = pool.worker_pids()
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    out = []
    stuck = threading.Thread(target=lambda: out.append(pool.compare("HANG", "x", 30.0)))
    stuck.start()
    while len(pool._idle) == 2:  # pylint: disable=protected-access
        time.sleep(0.01)
    time.sleep(0.1)  # the request is on its way
    begin = time.monotonic()
    pool.shutdown()
    assert _wait_dead(pids, timeout=2.0) == []
    stuck.join(timeout=5)
    assert out == [verifier.ERROR] and time.monotonic() - begin < 2.0
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
