"""A whole GRPO-family iteration as one XLA program, and several in one `lax.scan`.

    sample (prefill + decode loop) -> device rewards -> group advantages
        -> reference log-probs -> clipped surrogate + KL update

With rewards that can be read off the token ids (`grpo_jax.rewards.device`), nothing of an
iteration needs the host: `make_fused_iterations` compiles K iterations into one program
whose carry is the training state, so the host sends K batches of prompts and gets back
K rows of metrics. Each iteration computes what the host path does (the same sampler, key,
advantages and train step), so for the same key the samples and rewards are the same and
the updates agree to float32 rounding (XLA may fuse the pieces differently inside the
bigger program).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from grpo_jax.rl.algorithms import compute_advantages
from grpo_jax.rl.update import (LossSettings, make_train_step, prompt_group_for,
                                 sequence_logp)
from grpo_jax.sampling import SamplingConfig, generate
from grpo_jax.training import Policy, jit_update


@dataclasses.dataclass(frozen=True)
class FusedSettings:
    """What one fused iteration needs besides the loss settings (static)."""

    algorithm: str
    group_size: int
    adv_eps: float = 1e-6
    overlong_filter: bool = False  # truncated completions carry no loss (DAPO)


def make_fused_iterations(policy: Policy, optimizer: optax.GradientTransformation,
                          loss: LossSettings, fused: FusedSettings, *, sampling: SamplingConfig,
                          rewards: dict[str, Callable], weights: dict[str, float],
                          prompt_len: int, micro_batches: int = 1):
    """jit(state, prompts [K, B, P], prompt_mask [K, B, P], answers [K, B], keys [K])
    -> (state, metrics: name -> [K]).

    Rows come in contiguous groups of `fused.group_size` sharing one prompt (each prompt is
    run once per group in the reference and policy forward). `state` holds "params",
    "opt_state" and, when loss.beta != 0, "ref_params" (donated:
    pass the returned state on). `rewards` maps names to device rewards
    fn(tokens, mask, answers) -> [B]; `weights` their weights (the total is summed in the
    weights' order, as on the host). Metrics per iteration: the train step's (loss,
    grad_norm, entropy, kl_ref, ...) plus reward_mean, reward_std, reward/<name>, pass@1
    (accuracy >= 1, or reward >= 1 without an accuracy reward), completion_length,
    truncated_frac and zero_std_groups.
    """
    g = fused.group_size
    train = make_train_step(policy, optimizer, loss, prompt_len=prompt_len,
                            micro_batches=micro_batches, group_size=g).fn
    eos_ids = jnp.asarray(sampling.eos_ids or (-1,), jnp.int32)

    def iteration(state, inputs):
        prompts, prompt_mask, answers, key = inputs
        out = generate(policy.graphdef, policy.state(state["params"]), prompts, prompt_mask,
                       key, config=sampling)
        components = {name: rewards[name](out.tokens, out.mask, answers) for name in weights}
        total = jnp.zeros(prompts.shape[0], jnp.float32)
        for name, weight in weights.items():
            total = total + jnp.float32(weight) * components[name]
        correct = components.get("accuracy", total) >= 1.0
        truncated = ~jnp.any(jnp.isin(out.tokens, eos_ids) & out.mask, -1)
        completion_mask = out.mask & ~truncated[:, None] if fused.overlong_filter else out.mask
        batch = {
            "tokens": jnp.concatenate([prompts, out.tokens], 1),
            "attention_mask": jnp.concatenate([prompt_mask, out.mask], 1),
            "completion_mask": completion_mask,
            "sample_logp": out.logp,
            "advantages": compute_advantages(total, algorithm=fused.algorithm, group_size=g,
                                             correct=correct, eps=fused.adv_eps),
        }
        if "ref_params" in state:
            batch["ref_logp"], _ = sequence_logp(policy, state["ref_params"], batch["tokens"],
                                                 batch["attention_mask"], prompt_len,
                                                 loss.temperature,
                                                 prompt_group=prompt_group_for(len(total), g))
        params, opt_state, metrics = train(state["params"], state["opt_state"], batch)
        groups = total.reshape(-1, g)
        metrics.update({
            "reward_mean": jnp.mean(total),
            "reward_std": jnp.std(total),
            **{f"reward/{name}": jnp.mean(value) for name, value in components.items()},
            "pass@1": jnp.mean(correct.astype(jnp.float32)),
            "completion_length": jnp.mean(out.lengths.astype(jnp.float32)),
            "truncated_frac": jnp.mean(truncated.astype(jnp.float32)),
        })
        if g > 1:
            metrics["zero_std_groups"] = jnp.mean((jnp.std(groups, 1) == 0).astype(jnp.float32))
        return {**state, "params": params, "opt_state": opt_state}, metrics

    def iterations(state, prompts, prompt_mask, answers, keys):
        return jax.lax.scan(iteration, state, (prompts, prompt_mask, answers, keys))

    return jit_update(iterations, num_state_args=1)
