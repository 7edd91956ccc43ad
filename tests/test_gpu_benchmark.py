"""benchmarks/gpu_gsm8k.py's model-FLOPs count against XLA's own count of the program the
update runs (`completion_logprobs` with the prompt shared by a group), on a tiny model."""

from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from grpo_jax.models import Transformer, completion_logprobs, named_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "gpu_gsm8k", os.path.join(ROOT, "benchmarks", "gpu_gsm8k.py"))
gpu_gsm8k = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_gsm8k)


def _xla_forward_flops(config, prompts, group, prompt_len, new):
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rows, length = prompts * group, prompt_len + new
    tokens = jnp.zeros((rows, length), jnp.int32)
    mask = jnp.ones((rows, length), bool)

    def forward(state, tokens, mask):
        return completion_logprobs(nnx.merge(graphdef, state), tokens, mask, prompt_len,
                                   group_size=group)["logp"]

    cost = jax.jit(forward).lower(state, tokens, mask).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def test_update_flops_count_what_the_code_computes():
    config = named_config("tiny-1m", num_layers=2, dtype="float32", param_dtype="float32")
    prompts, group, prompt_len, new = 2, 4, 48, 8
    counted = gpu_gsm8k.update_model_flops(config, prompts=prompts, group_size=group,
                                           prompt_len=prompt_len, new_tokens=new,
                                           reference=True)
    assert counted["passes"] == 4 and counted["total"] == 4 * counted["forward"]
    # XLA computes masked full-square attention; the model-FLOPs count is causal. Put XLA's
    # square back into the count, then the two agree up to XLA's elementwise work.
    per_head_layer = config.num_layers * config.num_heads * config.head_dim
    causal = 4 * per_head_layer * prompts * (
        prompt_len ** 2 / 2 + group * (new * prompt_len + new ** 2 / 2))
    square = 4 * per_head_layer * prompts * (
        prompt_len ** 2 + group * (new + 1) * (prompt_len + new))
    expected = counted["forward"] - causal + square
    xla = _xla_forward_flops(config, prompts, group, prompt_len, new)
    assert xla == pytest.approx(expected, rel=0.03), (xla, expected)  # 0.8% here
    # The old count (every row's prompt, the head on every position, full square) is far
    # off: the prompt shared by a group and the head on completions only matter here.
    body, head = gpu_gsm8k._body_and_head(config)
    old = prompts * group * (2 * (body + head) * (prompt_len + new)
                             + 4 * per_head_layer * (prompt_len + new) ** 2)
    assert old > 2 * xla


def test_decode_bytes_are_the_weights_and_the_cache():
    config = named_config("qwen2.5-0.5b")
    one = gpu_gsm8k.decode_bytes_per_step(config, rows=1, context=0)
    assert one == 2 * config.num_params()
    more = gpu_gsm8k.decode_bytes_per_step(config, rows=4, context=100)
    # K and V, bf16, per layer and KV head: 2 * 2 * 24 * 2 * 64 bytes per position and row.
    assert more - one == 2 * 2 * 24 * 2 * 64 * 100 * 4
