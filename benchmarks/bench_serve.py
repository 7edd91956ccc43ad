"""Server throughput: 16 concurrent clients against the same 16 requests sent one at a time,
through the OpenAI-compatible endpoint (`grpo_jax.serve`) with the `openai` client.

A random Qwen2-shaped policy (hidden 256, 4 layers, 4 heads, 2 KV heads, MLP 688, the
character tokenizer's vocabulary) is served on 127.0.0.1 by a child process (`ServerThread`:
uvicorn in a thread, the engine's scheduler thread sampling); the clients are threads of this
process, as an external harness's would be another program. Each of the 16 requests has
its own prompt and seed, temperature 1 and `max_tokens` 64, no EOS (the tokenizer has no end
id, so every request writes its 64 tokens). The engine decodes 16 slots at once and starts a
batch as soon as it is free (`batch_wait_s` 0: a request waits only for the batch in
progress, so the one-at-a-time requests are not delayed); the concurrent requests that
arrive while a batch runs form the next one. Every row count a batch can have is compiled
first (`Engine.warm_up`) and each mode runs once untimed, then `--rounds` rounds alternate the
two modes. Prints each mode's completion tokens per second (the median round), the concurrent
batches' sizes and `concurrent/sequential=R`: the median over the rounds of each round's ratio
(a round runs the two modes back to back, so a change in the machine's load between rounds
moves both).

    JAX_PLATFORMS=cpu python benchmarks/bench_serve.py [--rounds 5] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import platform
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from flax import nnx  # noqa: E402
from openai import OpenAI  # noqa: E402

from grpo_jax import models  # noqa: E402
from grpo_jax.serve import Engine, ServerThread, Settings, served_model  # noqa: E402
from grpo_jax.text import CharTokenizer, prompt_ids  # noqa: E402

CLIENTS = 16


class EndlessTokenizer(CharTokenizer):
    """The character tokenizer with no end id: every request writes its max_tokens."""

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return ()


def prompt(i: int) -> str:
    return f"Q: {i} + {3 * i} = ?\nA: "


SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
             mlp_size=688, max_seq_len=256)


def serve(max_tokens: int, ready, stop, batches) -> None:
    """The child process: the policy served on a free port (its URL put on `ready`) until
    `stop` is set; then the rows of every batch it sampled put on `batches`."""
    tokenizer = EndlessTokenizer()
    model = models.Transformer(models.ModelConfig(vocab_size=tokenizer.vocab_size, **SHAPE),
                               rngs=nnx.Rngs(0))
    engine = Engine(served_model(model, tokenizer, name="bench"), max_rows=CLIENTS,
                    slots=CLIENTS, batch_wait_s=0.0)
    # every row count a batch of these requests can have, compiled before any request
    engine.warm_up(len(prompt_ids(tokenizer, prompt(CLIENTS - 1))), max_tokens,
                   Settings(temperature=1.0))
    with ServerThread(engine) as server:
        ready.put(server.base_url)
        stop.wait()
    batches.put(list(engine.batches))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    spawn = multiprocessing.get_context("spawn")
    ready, stop, batches = spawn.Queue(), spawn.Event(), spawn.Queue()
    server = spawn.Process(target=serve, args=(args.max_tokens, ready, stop, batches))
    server.start()
    client = OpenAI(base_url=ready.get(timeout=600), api_key="unused", max_retries=0)

    def ask(i: int) -> int:
        response = client.completions.create(model="bench", prompt=prompt(i),
                                             max_tokens=args.max_tokens, temperature=1.0,
                                             seed=i)
        return response.usage.completion_tokens

    def sequential() -> int:
        return sum(ask(i) for i in range(CLIENTS))

    def concurrent_() -> int:
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            return sum(pool.map(ask, range(CLIENTS)))

    modes = {"sequential": sequential, "concurrent": concurrent_}
    for run in modes.values():  # once untimed: connections open, caches warm
        run()
    rates: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, run in modes.items():
            start = time.perf_counter()
            tokens = run()  # the completion tokens the responses report
            rates[name].append(tokens / (time.perf_counter() - start))
    stop.set()
    sampled = batches.get(timeout=60)
    server.join()
    median = {name: statistics.median(values) for name, values in rates.items()}
    params = models.ModelConfig(vocab_size=EndlessTokenizer().vocab_size, **SHAPE).num_params()
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, jax {jax.__version__} "
          f"{jax.default_backend()}; policy {params / 1e6:.2f}M parameters, {CLIENTS} requests "
          f"x {args.max_tokens} tokens ({tokens} written a round), {args.rounds} rounds")
    print(f"concurrent batches (rows; the first ones untimed): {[b for b in sampled if b > 1]}")
    for name in modes:
        print(f"{name}: {median[name]:.1f} tokens/s (rounds: "
              f"{', '.join(f'{r:.1f}' for r in rates[name])})")
    ratios = sorted(c / s for s, c in zip(rates["sequential"], rates["concurrent"]))
    print(f"concurrent/sequential={statistics.median(ratios):.2f} (each round's ratio: "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
