"""The math-verify worker process of `grpo_jax.rewards.verifier`'s pool.

`python -m grpo_jax.rewards.math_verify_worker --parent-pid PID`: imports math-verify,
decides one warm-up pair, writes `{"ready": true, "math_verify": <installed>}`, then answers
one JSON request `[id, predicted, reference, deadline]` per stdin line with one line
`[id, verdict]` (verdict true / false / null) on its stdout. Each comparison runs under a
CPU-time timer (ITIMER_PROF) of `deadline` seconds with SIGPROF at its default action, so the
kernel ends the worker once the comparison has used them; the pool reads that exit as a
timeout and starts another worker.

The worker never outlives its parent: it exits when stdin closes, asks Linux to SIGKILL it
when the parent thread that started it ends (PR_SET_PDEATHSIG), and a watchdog thread exits
it when its parent pid changes (other systems, or a parent that died before the prctl).
It ignores SIGINT (a Ctrl-C in the terminal reaches the whole process group; the pool
decides when its workers stop). Anything a library prints goes to stderr, not to the
protocol's stdout.

`--test-hang-prefix PREFIX` (tests and benchmarks/verifier_adversarial.py only): a request
whose predicted answer starts with PREFIX never gets an answer and spins on the CPU, as a
comparison stuck in sympy would.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def compare(predicted: str, reference: str) -> bool | None:
    """math-verify's verdict without a timeout; None when it cannot decide."""
    try:
        import math_verify  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    from grpo_jax.rewards.accuracy import _as_latex  # pylint: disable=import-outside-toplevel

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns when timeouts are off
    try:
        gold = math_verify.parse(_as_latex(reference), parsing_timeout=None)
        target = math_verify.parse(_as_latex(predicted), parsing_timeout=None)
        if not gold or not target:
            return None
        return bool(math_verify.verify(gold, target, timeout_seconds=None))
    except Exception:  # pylint: disable=broad-except
        return None


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # pylint: disable=import-outside-toplevel

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent_pid <= 0:
        return
    if os.getppid() != parent_pid:  # the parent died before the prctl
        os._exit(0)

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--test-hang-prefix", default=None)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # the CPU deadline ends the process
    # The protocol gets a private copy of stdout; fd 1 (print, C libraries) goes to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="ascii")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    try:
        import math_verify  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        installed = True
    except ImportError:
        installed = False
    if installed:
        compare("\\frac{1}{2}", "0.5")  # the lazy imports and sympy's first use happen here
    out.write(json.dumps({"ready": True, "math_verify": installed}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request_id, predicted, reference, deadline = json.loads(line)
            deadline = float(deadline)
        except (ValueError, TypeError):
            continue
        # (a zero would disarm the timer; the pool sends deadlines > 0)
        signal.setitimer(signal.ITIMER_PROF, min(max(deadline, 1e-6), 1e8))
        if args.test_hang_prefix is not None and str(predicted).startswith(
                args.test_hang_prefix):
            while True:  # busy, as sympy is, until the CPU timer ends the process
                pass
        verdict = compare(predicted, reference)
        signal.setitimer(signal.ITIMER_PROF, 0)
        out.write(json.dumps([request_id, verdict]) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
