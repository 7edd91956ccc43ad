"""Server throughput: 16 concurrent clients against the same 16 requests sent one at a time,
through the OpenAI-compatible endpoint (`grpo_jax.serve`) with the `openai` client.

A random Qwen2-shaped policy (hidden 256, 4 layers, 4 heads, 2 KV heads, MLP 688, the
character tokenizer's vocabulary) is served on 127.0.0.1 in this process (`ServerThread`:
uvicorn in a thread, the engine's scheduler thread sampling). Each of the 16 requests has
its own prompt and seed, temperature 1 and `max_tokens` 64, no EOS (the tokenizer has no
end id, so every request writes its 64 tokens). The engine decodes 16 slots at once and starts a batch as soon as it is free
(`batch_wait_s` 0: a request waits only for the batch in progress, so the one-at-a-time
requests are not delayed); the concurrent requests that arrive while a batch runs form the
next one. Every row count a batch can have is compiled first (`Engine.warm_up`) and each
mode runs once untimed, then `--rounds` rounds alternate the two modes. Prints each mode's
completion tokens per second (the median round), the concurrent batches' sizes and
`concurrent/sequential=R`.

    JAX_PLATFORMS=cpu python benchmarks/bench_serve.py [--rounds 3] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    tokenizer = EndlessTokenizer()
    config = models.ModelConfig(vocab_size=tokenizer.vocab_size, **SHAPE)
    model = models.Transformer(config, rngs=nnx.Rngs(0))
    engine = Engine(served_model(model, tokenizer, name="bench"), max_rows=CLIENTS,
                    slots=CLIENTS, batch_wait_s=0.0)
    # every row count a batch of these requests can have, compiled before the rounds
    engine.warm_up(len(prompt_ids(tokenizer, prompt(CLIENTS - 1))), args.max_tokens,
                   Settings(temperature=1.0))
    with ServerThread(engine) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)

        def ask(i: int) -> int:
            response = client.completions.create(
                model="bench", prompt=prompt(i), max_tokens=args.max_tokens,
                temperature=1.0, seed=i)
            return response.usage.completion_tokens

        def sequential() -> int:
            return sum(ask(i) for i in range(CLIENTS))

        def concurrent_() -> int:
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                return sum(pool.map(ask, range(CLIENTS)))

        modes = {"sequential": sequential, "concurrent": concurrent_}
        for run in modes.values():  # compile every shape each mode meets
            run()
        rates: dict[str, list[float]] = {name: [] for name in modes}
        first = len(engine.batches)
        for _ in range(args.rounds):
            for name, run in modes.items():
                start = time.perf_counter()
                tokens = run()  # the completion tokens the responses report
                rates[name].append(tokens / (time.perf_counter() - start))
    batches = engine.batches[first:]  # the rows of each batch the timed rounds sampled
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, jax {jax.__version__} "
          f"{jax.default_backend()}; policy {config.num_params() / 1e6:.2f}M parameters, "
          f"{CLIENTS} requests x {args.max_tokens} tokens ({tokens} written a round), "
          f"{args.rounds} rounds")
    print(f"concurrent batches of the rounds (rows): {[b for b in batches if b > 1]}")
    for name in modes:
        print(f"{name}: {median[name]:.1f} tokens/s (rounds: "
              f"{', '.join(f'{r:.1f}' for r in rates[name])})")
    print(f"concurrent/sequential={median['concurrent'] / median['sequential']:.2f}")


if __name__ == "__main__":
    main()
