"""The math-verify worker process: one JSON request per stdin line, one JSON verdict per
stdout line (`python -m grpo_jax.rewards.math_verify_worker`; started by
`grpo_jax.rewards.accuracy`, which enforces the timeout by waiting on the pipe)."""

from __future__ import annotations

import json
import logging
import sys


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


def main() -> None:
    for line in sys.stdin:
        predicted, reference = json.loads(line)
        sys.stdout.write(json.dumps(compare(predicted, reference)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
