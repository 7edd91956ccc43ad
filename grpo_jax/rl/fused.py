"""Whole RL iterations as one XLA program, several in one `lax.scan`.

    sample (prefill + decode loop) -> device rewards -> the `Rollout` -> its batch
        -> the learner's iteration (advantages, losses, updates)

With rewards that can be read off the token ids (`grpo_jax.rewards.device`), nothing of an
iteration needs the host: `make_fused_iterations` compiles K iterations into one program
whose carry is the training state, so the host sends K batches of prompts and gets back K
rows of metrics. The update is the learner's own pure `iteration(state, batch)`, the function
the host source runs jitted on each batch, so the two share the update by construction; the
samples use the same sampler and keys, so for the same key the samples and rewards are the
same and the updates agree to float32 rounding (XLA may fuse the pieces differently inside
the bigger program).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from grpo_jax.evals.metrics import solved
from grpo_jax.rl.batch import rollout_record
from grpo_jax.rl.rollout import Rollout
from grpo_jax.sampling import SamplingConfig, generate
from grpo_jax.training import Policy, jit_update


def make_fused_iterations(policy: Policy, iteration: Callable, *, group_size: int,
                          sampling: SamplingConfig, rewards: dict[str, Callable],
                          weights: dict[str, float]):
    """jit(state, prompts [K, B, P], prompt_mask [K, B, P], answers [K, B], keys [K],
    versions [K]) -> (state, metrics: name -> [K]).

    Rows come in contiguous groups of `group_size` sharing one prompt. `iteration(state,
    batch) -> (state, metrics)` is the learner's pure iteration; `state` its state, whose
    "params" sample (donated: pass the returned state on). `rewards` maps names to device
    rewards fn(tokens, mask, answers) -> [B]; `weights` their weights (the total is summed
    in the weights' order, as on the host). `versions` [K] are the parameter versions that
    sample each iteration. Metrics per iteration: the iteration's and
    `rl.batch.rollout_record`'s.
    """
    eos_ids = jnp.asarray(sampling.eos_ids or (-1,), jnp.int32)

    def step(state, inputs):
        prompts, prompt_mask, answers, key, version = inputs
        out = generate(policy.graphdef, policy.state(state["params"]), prompts, prompt_mask,
                       key, config=sampling)
        components = {name: rewards[name](out.tokens, out.mask, answers) for name in weights}
        total = jnp.zeros(prompts.shape[0], jnp.float32)
        for name, weight in weights.items():
            total = total + jnp.float32(weight) * components[name]
        # The flags first, then the batch: the program's ops in the order they had before
        # the Rollout (the same HLO, so the main job's numbers stay those it had).
        correct = solved(components.get("accuracy", total))
        truncated = ~jnp.any(jnp.isin(out.tokens, eos_ids) & out.mask, -1)
        rollout = Rollout(prompt_tokens=prompts, prompt_mask=prompt_mask, tokens=out.tokens,
                          attention_mask=out.mask, loss_mask=out.mask, behaviour_logp=out.logp,
                          rewards=total, components=components, lengths=out.lengths,
                          truncated=truncated, version=version)
        state, metrics = iteration(state, rollout.to_batch().replace(correct=correct))
        metrics.update(rollout_record(total, components, correct, out.lengths, truncated,
                                      group_size=group_size))
        return state, metrics

    def iterations(state, prompts, prompt_mask, answers, keys, versions):
        return jax.lax.scan(step, state, (prompts, prompt_mask, answers, keys, versions))

    return jit_update(iterations, num_state_args=1)
