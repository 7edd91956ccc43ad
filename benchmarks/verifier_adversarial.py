"""Adversarial answers through `accuracy_reward`: seconds per call and the pool's counts.

Answers that pass the pre-screen (`_safe_for_symbolic`) but keep sympy busy for seconds to
minutes (nested fractions and parentheses, a 999th power to expand, nested sines, a power of
a sum of square roots), a long sum (decided, fast), easy equivalences, and a forced-stuck
worker (the worker's `--test-hang-prefix` hook: it never answers). Runs them in the main
thread (twice: the second pass is answered from the cache), then from 8 threads at once,
each thread with its own variants (nothing shared through the cache). Every call must
return within wait + deadline (4 s with the defaults) whatever the others do.

    python benchmarks/verifier_adversarial.py [--deadline 2] [--workers 2] [--wait 2]
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
    other = [s for s, kind in times if kind in ("easy", "long sum", "big power")]
    print(f"{name}: {len(seconds)} calls, median {statistics.median(seconds):.3f} s, "
          f"worst {max(seconds):.3f} s; decidable-fast answers ({len(other)}): median "
          f"{statistics.median(other):.3f} s, worst {max(other):.3f} s")
    print(f"  counts: {stats}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--deadline", type=float, default=accuracy.MATH_VERIFY_TIMEOUT_SECONDS)
    parser.add_argument("--workers", type=int, default=verifier.WORKERS)
    parser.add_argument("--wait", type=float, default=verifier.WAIT_SECONDS)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    verifier.configure(worker_args=["--test-hang-prefix", "STUCK"])
    settings = accuracy.configure_verifier(deadline_seconds=args.deadline,
                                           workers=args.workers, wait_seconds=args.wait)
    bound = settings["wait_seconds"] + settings["deadline_seconds"]
    print(f"settings: {settings}; bound per call (wait + deadline): {bound:.1f} s")
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
    _report(f"{args.threads} threads at once ({wall:.1f} s wall)", times,
            _delta(accuracy.verifier_stats(), before))
    flipped = [key for key, score in again.items() if first_scores[key] != score]
    print(f"scores of the main thread's completions, recomputed from a thread after the cache "
          f"was cleared: {len(flipped)} of {len(again)} differ")
    worst = max(s for s, _ in times)
    print(f"worst call {worst:.3f} s vs bound {bound:.1f} s: "
          f"{'within' if worst <= bound + 0.5 else 'OVER'}")
    print(f"cumulative: {accuracy.verifier_stats()}")


if __name__ == "__main__":
    main()
