"""What one turn of tool answers costs on the host: R rows each waiting for a python call
(one sandbox process each), answered one at a time and `parallel_steps` at a time, as
`sampling.episodes` does at a pause; the guessing game's answers beside them.

    python benchmarks/bench_tool_turns.py [--rows 16] [--rounds 3]

Prints one line per mode (`mode=python_sequential seconds=... per_call_s=...`, ...), then
`parallel/sequential=R` (the wall-time ratio, alternated in one run).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time

from grpo_jax.tasks.base import Example
from grpo_jax.tools import make_environment
from grpo_jax.tools.calls import call_text


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
    times = {"python_sequential": [], "python_parallel": [], "guess_sequential": []}
    for _ in range(args.rounds):  # alternated
        for mode, turns, workers in (("python_sequential", python, 1),
                                     ("python_parallel", python, environment.parallel_steps),
                                     ("guess_sequential", guess, 1)):
            start = time.perf_counter()
            out = answer(turns, workers)
            times[mode].append(time.perf_counter() - start)
            assert all(not environment.is_error(o[0]) for o in out), out[0]
    best = {mode: min(values) for mode, values in times.items()}
    for mode, seconds in best.items():
        print(f"mode={mode} rows={args.rows} seconds={seconds:.3f} "
              f"per_call_s={seconds / args.rows:.4f}")
    print(f"parallel/sequential={best['python_parallel'] / best['python_sequential']:.2f} "
          f"(workers={environment.parallel_steps})")


if __name__ == "__main__":
    main()
