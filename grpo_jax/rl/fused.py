"""A whole GRPO-family iteration as one XLA program, and several in one `lax.scan`.

    sample (prefill + decode loop) -> device rewards -> the rollout batch
        -> reference log-probs and advantages -> the algorithm's update

With rewards that can be read off the token ids (`grpo_jax.rewards.device`), nothing of an
iteration needs the host: `make_fused_iterations` compiles K iterations into one program
whose carry is the training state, so the host sends K batches of prompts and gets back K
rows of metrics. Each iteration computes what the host path does (the same sampler, key,
batch builder, prepare function and train step), so for the same key the samples and rewards
are the same and the updates agree to float32 rounding (XLA may fuse the pieces differently
inside the bigger program).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from grpo_jax.rl.batch import rollout_batch, rollout_record
from grpo_jax.rl.update import LossSettings, make_train_step
from grpo_jax.sampling import SamplingConfig, generate
from grpo_jax.training import Policy, jit_update


def make_fused_iterations(policy: Policy, optimizer: optax.GradientTransformation,
                          loss: LossSettings, prepare: Callable, *, group_size: int,
                          sampling: SamplingConfig, rewards: dict[str, Callable],
                          weights: dict[str, float], prompt_len: int, micro_batches: int = 1):
    """jit(state, prompts [K, B, P], prompt_mask [K, B, P], answers [K, B], keys [K],
    versions [K]) -> (state, metrics: name -> [K]).

    Rows come in contiguous groups of `group_size` sharing one prompt (each prompt is run
    once per group in the reference and policy forward). `state` holds "params",
    "opt_state" and, when the algorithm has a reference, "ref_params" (donated: pass the
    returned state on). `prepare` is `rl.update.make_prepare_fn`'s function (reference
    log-probs, overlong filter, advantages), the same the host loop runs. `rewards` maps
    names to device rewards fn(tokens, mask, answers) -> [B]; `weights` their weights (the
    total is summed in the weights' order, as on the host). `versions` [K] are the
    parameter versions that sample each iteration. Metrics per iteration: the train step's
    (loss, grad_norm, entropy, kl_ref, ...) and `rl.batch.rollout_record`'s.
    """
    g = group_size
    train = make_train_step(policy, optimizer, loss, prompt_len=prompt_len,
                            micro_batches=micro_batches, group_size=g).fn
    eos_ids = jnp.asarray(sampling.eos_ids or (-1,), jnp.int32)

    def iteration(state, inputs):
        prompts, prompt_mask, answers, key, version = inputs
        out = generate(policy.graphdef, policy.state(state["params"]), prompts, prompt_mask,
                       key, config=sampling)
        components = {name: rewards[name](out.tokens, out.mask, answers) for name in weights}
        total = jnp.zeros(prompts.shape[0], jnp.float32)
        for name, weight in weights.items():
            total = total + jnp.float32(weight) * components[name]
        correct = components.get("accuracy", total) >= 1.0
        truncated = ~jnp.any(jnp.isin(out.tokens, eos_ids) & out.mask, -1)
        batch = rollout_batch(prompts, prompt_mask, out.tokens, out.mask, out.logp, total,
                              version=version)
        batch, prep_metrics = prepare(state["params"], state.get("ref_params"), batch,
                                      correct, truncated)
        params, opt_state, metrics = train(state["params"], state["opt_state"], batch)
        metrics.update(prep_metrics)
        metrics.update(rollout_record(total, components, correct, out.lengths, truncated,
                                      group_size=g))
        return {**state, "params": params, "opt_state": opt_state}, metrics

    def iterations(state, prompts, prompt_mask, answers, keys, versions):
        return jax.lax.scan(iteration, state, (prompts, prompt_mask, answers, keys, versions))

    return jit_update(iterations, num_state_args=1)
