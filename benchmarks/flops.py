"""Model FLOP counts and the matmul throughput they are compared with (shared by benchmarks).

Counts are model FLOPs: 2 per multiply-add of the model's matmuls (the output head
included) and of attention's q.k and p.v over the causal context; nothing recomputed is
counted twice. A backward pass is 2x its forward (gradients of activations and weights).

`matmul_flops_per_s(config, rows, backward=...)` times a chain of matmuls (`matmul_chain`)
with exactly the model's weight shapes at `rows` rows ([rows, D] x [D, (N+2K)H], [rows, NH] x
[NH, D], [rows, D] x [D, 2F], [rows, F] x [F, D] per layer, then the head [rows, D] x [D, V])
inside one XLA program, optionally with its backward: the throughput this machine gives the
model's matmuls at the phase's shapes, measured in the same run as the phase it is compared
with. Timed apart from the phase, its best of a few calls moves by tens of percent from
minute to minute here; `matmul_chain` gives the call itself, so that a benchmark can time it
in the same alternating rounds as the phase (bench_ablation, bench_sampler).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def weights_per_token(config) -> int:
    """Multiply-adds of one token through the model's matmuls (output head included)."""
    d, n, k, h, f = (config.hidden_size, config.num_heads, config.num_kv_heads,
                     config.head_dim, config.mlp_size)
    per_layer = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
    return config.num_layers * per_layer + d * config.vocab_size


def attention_flops(config, length: int, *, start: int = 0) -> int:
    """q.k and p.v FLOPs of positions start..length-1 of one row over their causal context."""
    per_position = 4 * config.num_layers * config.num_heads * config.head_dim
    return per_position * sum(p + 1 for p in range(start, length))


def forward_flops(config, rows: int, length: int) -> int:
    """One teacher-forced forward of [rows, length] tokens."""
    return rows * (2 * weights_per_token(config) * length + attention_flops(config, length))


def shared_prompt_forward_flops(config, rows: int, prompt_len: int, length: int,
                                group: int) -> int:
    """The forward as `models.completion_logprobs` computes it: the prompt once per group of
    `group` rows (no output head there), the completions on every row attending over their
    causal context, the head on the C = length - prompt_len positions that predict them.
    The sampler with `SamplingConfig.prompt_group` does the same work (a prefill per group,
    the head once after it, then one per decode step but the last; one position apart)."""
    head = config.hidden_size * config.vocab_size
    layers = weights_per_token(config) - head
    new = length - prompt_len
    prompt = rows // group * (2 * layers * prompt_len + attention_flops(config, prompt_len))
    return prompt + rows * (2 * (layers + head) * new
                            + attention_flops(config, length, start=prompt_len))


def train_flops(config, rows: int, length: int) -> int:
    """Forward + backward of [rows, length] tokens (3x the forward)."""
    return 3 * forward_flops(config, rows, length)


def generate_flops(config, rows: int, prompt_len: int, new_tokens: int) -> int:
    """Prefill of the prompt plus one decode step per new token (all rows, no early stop)."""
    return forward_flops(config, rows, prompt_len + new_tokens)


def matmul_chain(config, rows: int, *, backward: bool = False, iters: int = 0):
    """(call, FLOPs per call): a compiled call of the model's matmul chain at `rows` rows
    (with its backward when `backward`), `iters` chain passes per call (0: about 2 GFLOP per
    call, so that dispatch does not count), blocked on its result."""
    d, n, k, h, f, v = (config.hidden_size, config.num_heads, config.num_kv_heads,
                        config.head_dim, config.mlp_size, config.vocab_size)
    layers = config.num_layers
    ks = jax.random.split(jax.random.key(0), 5)
    # one array per layer and matrix, as the model holds them (slices of stacked arrays
    # are copied inside the loop, which at a few rows costs more than the matmul itself)
    shapes = {"qkv": (d, (n + 2 * k) * h), "o": (n * h, d), "gu": (d, 2 * f), "down": (f, d)}
    weights = {name: [jax.random.normal(jax.random.fold_in(ks[i], layer), shape) * 0.05
                      for layer in range(layers)]
               for i, (name, shape) in enumerate(shapes.items())}
    weights["head"] = jax.random.normal(ks[4], (d, v)) * 0.05
    flops_once = 2 * rows * weights_per_token(config) * (3 if backward else 1)
    iters = iters or max(1, int(2e9 // flops_once))
    x0 = jnp.ones((rows, d))

    def chain(w, x):
        for layer in range(layers):
            qkv = x @ w["qkv"][layer]
            # (the k/v and up columns feed the next input, so none is dead code)
            x = (qkv[:, : n * h] @ w["o"][layer]
                 + 1e-3 * jnp.mean(qkv[:, n * h:], -1, keepdims=True))
            gu = x @ w["gu"][layer]
            x = gu[:, :f] @ w["down"][layer] + 1e-3 * jnp.mean(gu[:, f:], -1, keepdims=True)
        logits = x @ w["head"]
        return x + 1e-3 * jnp.mean(logits, -1, keepdims=True)

    if backward:
        grad = jax.grad(lambda w, x: jnp.sum(chain(w, x)))

        def step(_, carry):
            w, x = carry
            g = grad(w, x)
            return jax.tree.map(lambda a, b: a - 1e-6 * b, w, g), x

        run = jax.jit(lambda w, x: jax.lax.fori_loop(0, iters, step, (w, x)))
    else:  # the weights are loop invariants, as the sampler's are in its decode loop
        run = jax.jit(lambda w, x: jax.lax.fori_loop(0, iters, lambda _, x: chain(w, x), x))
    jax.block_until_ready(run(weights, x0))
    return (lambda: jax.block_until_ready(run(weights, x0))), flops_once * iters


def matmul_flops_per_s(config, rows: int, *, backward: bool = False, iters: int = 0,
                       repeats: int = 5) -> float:
    """Best FLOP/s over `repeats` timed calls of `matmul_chain` (arguments as there)."""
    call, flops_per_call = matmul_chain(config, rows, backward=backward, iters=iters)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return flops_per_call / best
