"""Adversarial answers through `accuracy_reward`: the verifier's bound, seconds per call, counts.

Answers that pass the pre-screen (`_safe_for_symbolic`) but keep sympy busy for seconds to
minutes (nested fractions and parentheses, a 999th power to expand, nested sines, a power of
a sum of square roots), a long sum (decided, fast), easy equivalences, and a forced-stuck
worker (the worker's `--test-hang-prefix` hook: it spins, never answering). Runs them in the
main thread (twice: the second pass is answered from the cache), then, cache cleared, from 8
threads at once, each thread with its own variants and one thread with the main thread's.

The bound checked is the verifier's one bound per call: a comparison uses at most the
deadline in CPU seconds (a CPU-time timer in the worker; the kernel ends it). Calls queue for
a worker, so wall seconds per call are reported, not bounded; under load no call is "busy" and
the answers math-verify decides fast get the same score in a thread as in the main thread.

    python benchmarks/verifier_adversarial.py [--deadline 2] [--workers 2] [--threads 8]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from grpo_jax.rewards import accuracy, verifier

# (answer, reference, kind) with K replaced by a digit per thread.
CASES = [
    ("\\frac{1}{" * 20 + "K" + "}" * 20, "0.5", "slow"),
    ("((" * 30 + "x+K" + "))" * 30, "x+1", "slow"),
    ("(x+K)^{999}", "x^{999}+1", "slow"),
    ("\\sin(x)^{99}+\\cos(Kx)", "\\cos(x)^{99}+\\sin(x)", "slow"),
    ("(\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+\\sqrt{1K})^{64}", "1", "slow"),
    ("\\sin(" * 8 + "K" + ")" * 8, "0.6", "slow"),
    ("+".join(str(i) for i in range(1, 60)) + "+K", None, "long sum"),
    ("(99K)^{999}", "1", "big power"),
    ("STUCK K", "1", "stuck"),
    ("\\frac{K}{2K}", "\\frac{1}{2}", "easy"),
    ("x+K", "K+x", "easy"),
    ("\\sqrt{4}+K", "K+2", "easy"),
]
FAST = ("easy", "long sum", "big power")  # kinds math-verify decides in milliseconds
TICKS = 0.05  # resolution of the CPU seconds read from /proc and of the kernel's timer


def _cases(k: int):
    out = []
    for answer, reference, kind in CASES:
        answer = answer.replace("K", str(k))
        if reference is None:  # the long sum's value
            reference = str(sum(range(1, 60)) + k)
        reference = reference.replace("K", str(k))
        assert accuracy._safe_for_symbolic(answer), answer  # pylint: disable=protected-access
        out.append((f"<think>...</think><answer>{answer}</answer>", reference, kind))
    return out


def _run(cases, times, scores):
    for completion, reference, kind in cases:
        begin = time.monotonic()
        score = accuracy.accuracy_reward(completion, reference)
        times.append((time.monotonic() - begin, kind))
        scores[(completion, reference)] = score


def _delta(after, before):
    return {key: after[key] - before.get(key, 0) for key in after}


def _report(name, times, stats):
    seconds = [s for s, _ in times]
    fast = [s for s, kind in times if kind in FAST]
    print(f"{name}: {len(seconds)} calls, wall median {statistics.median(seconds):.3f} s, "
          f"worst {max(seconds):.3f} s; answers decided fast ({len(fast)}): median "
          f"{statistics.median(fast):.3f} s, worst {max(fast):.3f} s")
    print(f"  counts: {stats}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--deadline", type=float, default=accuracy.MATH_VERIFY_TIMEOUT_SECONDS,
                        help="CPU seconds per comparison")
    parser.add_argument("--workers", type=int, default=verifier.WORKERS)
    parser.add_argument("--wait", type=float, default=verifier.WAIT_SECONDS,
                        help="seconds before a stopped worker is given up")
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    verifier.configure(worker_args=["--test-hang-prefix", "STUCK"])
    settings = accuracy.configure_verifier(deadline_seconds=args.deadline,
                                           workers=args.workers, wait_seconds=args.wait)
    bound = settings["deadline_seconds"]
    print(f"settings: {settings}; bound per call: {bound:.1f} s of CPU time per comparison "
          f"(calls queue for one of {settings['workers']} workers)")
    pool = verifier.get_pool()
    begin = time.monotonic()
    pool.wait_ready(timeout=120)
    print(f"workers ready after {time.monotonic() - begin:.2f} s (off every call's clock)")

    scores: dict = {}
    for label in ("main thread, pass 1", "main thread, pass 2 (cached)"):
        before, times = accuracy.verifier_stats(), []
        _run(_cases(9), times, scores)
        _report(label, times, _delta(accuracy.verifier_stats(), before))
    first_scores = dict(scores)
    again: dict = {}
    pool.clear_cache()
    pool.wait_ready(timeout=120)
    before, times = accuracy.verifier_stats(), []
    threads = [threading.Thread(target=_run, args=(_cases(k), times, scores if k != 9 else again))
               for k in list(range(1, args.threads)) + [9]]
    begin = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - begin
    stats = _delta(accuracy.verifier_stats(), before)
    _report(f"{args.threads} threads at once ({wall:.1f} s wall)", times, stats)
    kinds = {(completion, reference): kind for completion, reference, kind in _cases(9)}
    flipped = [key for key, score in again.items() if first_scores[key] != score]
    flipped_fast = [key for key in flipped if kinds[key] in FAST]
    print(f"the main thread's completions recomputed in a thread under load, cache cleared: "
          f"{len(flipped)} of {len(again)} scores differ ({len(flipped_fast)} of "
          f"{sum(kind in FAST for kind in kinds.values())} decided fast); busy calls: "
          f"{stats['busy']}")
    worst = pool.max_cpu_seconds()
    met = worst <= bound + TICKS and not flipped_fast and stats["busy"] == 0
    print(f"worst comparison {worst:.3f} CPU s vs bound {bound:.1f} CPU s "
          f"(+{TICKS} s for /proc's clock ticks): {'met' if met else 'NOT MET'}")
    print(f"cumulative: {accuracy.verifier_stats()}")


if __name__ == "__main__":
    main()
