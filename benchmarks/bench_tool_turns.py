"""What one turn of tool answers costs on the host: R rows each waiting for a python call
(one sandbox process each), answered one at a time and `parallel_steps` at a time, as
`sampling.episodes` does at a pause; the guessing game's answers beside them. The python
calls run under each sandbox isolation in turn (bubblewrap's namespaces and seccomp filter,
and the weaker audit_hook mode), alternated in one run.

    python benchmarks/bench_tool_turns.py [--rows 16] [--rounds 3]

Prints one line per mode (`mode=python_sequential isolation=bwrap seconds=... per_call_s=...`,
...), then `parallel/sequential=R` and `bwrap/audit_hook=R` (wall-time ratios).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time

from grpo_jax.tasks.base import Example
from grpo_jax.tools import make_environment
from grpo_jax.tools.calls import call_text
from grpo_jax.tools.sandbox import configure_sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    environment = make_environment("json:guess,python")
    example = Example(id="g", prompt="0-31", answer="20")
    states = [environment.reset(example)[1] for _ in range(args.rows)]
    python = [call_text("python", {"code": f"print(({i}+31+1)//2)"}) for i in range(args.rows)]
    guess = [call_text("guess", {"number": str(i)}) for i in range(args.rows)]

    def answer(turns, workers):
        if workers == 1:
            return [environment.step(s, t) for s, t in zip(states, turns)]
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(environment.step, states, turns))

    answer(python[:2], 1)  # warm the imports
    isolations = ("bwrap", "audit_hook")
    modes = [(f"python_{how}", isolation, python, workers) for isolation in isolations
             for how, workers in (("sequential", 1), ("parallel", environment.parallel_steps))]
    modes.append(("guess_sequential", "-", guess, 1))
    times = {(mode, isolation): [] for mode, isolation, _, _ in modes}
    for _ in range(args.rounds):  # alternated
        for mode, isolation, turns, workers in modes:
            if isolation != "-":
                configure_sandbox(isolation=isolation)
            start = time.perf_counter()
            out = answer(turns, workers)
            times[mode, isolation].append(time.perf_counter() - start)
            assert all(not environment.is_error(o[0]) for o in out), out[0]
    configure_sandbox(isolation="bwrap")
    best = {key: min(values) for key, values in times.items()}
    for (mode, isolation), seconds in best.items():
        print(f"mode={mode} isolation={isolation} rows={args.rows} seconds={seconds:.3f} "
              f"per_call_s={seconds / args.rows:.4f}")
    for isolation in isolations:
        print(f"isolation={isolation} parallel/sequential="
              f"{best['python_parallel', isolation] / best['python_sequential', isolation]:.2f}"
              f" (workers={environment.parallel_steps})")
    for how in ("sequential", "parallel"):
        print(f"{how}: bwrap/audit_hook="
              f"{best[f'python_{how}', 'bwrap'] / best[f'python_{how}', 'audit_hook']:.2f}")

if __name__ == "__main__":
    main()
