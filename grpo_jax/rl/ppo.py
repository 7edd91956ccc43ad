"""PPO for language models with a critic: the four roles and the stage kind "ppo".

Roles (Ouyang et al. 2022, https://arxiv.org/abs/2203.02155; Ziegler et al. 2019,
https://arxiv.org/abs/1909.08593):

- policy: `run.params`, trained with the clipped surrogate on per-token GAE advantages;
- value: a separate critic model, initialised from the policy's parameters plus a zero scalar
  head, trained with the clipped value loss (its own AdamW);
- reference: a frozen copy of the policy at the start of the stage;
- reward: the task's rule rewards and/or a learned reward model ("reward_model").

The per-token reward is r_t = -beta (log pi(y_t) - log pi_ref(y_t)) with the scalar reward
added on the last valid completion token; advantages come from `token_gae` and are whitened
over the valid tokens of the batch.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from grpo_jax import losses
from grpo_jax.models import logprobs
from grpo_jax.rl.reward_model import (REWARD_MODEL_REWARD, add_scalar_head, load_reward_model,
                                      scalar_head_policy)
from grpo_jax.rl.reward_sources import resolve_reward_fns
from grpo_jax.training import Params, Policy, accumulate_gradients, init_opt_state, jit_update


# ---------------------------------------------------------------------------------------
# Pure pieces


def last_valid_index(mask):
    """Index of the last True entry of each row of `mask` [B, T] -> [B] int32 (0 if none)."""
    mask = jnp.asarray(mask, bool)
    t = mask.shape[-1]
    return (t - 1 - jnp.argmax(mask[:, ::-1], axis=-1)).astype(jnp.int32) * jnp.any(mask, -1)


def ppo_token_rewards(scores, logp, ref_logp, mask, *, beta):
    """Per-token PPO rewards: KL penalty on every valid token, the score on the last one.

    r_t = -beta (log pi(y_t) - log pi_ref(y_t)) + 1[t = last valid] * score, and 0 on padding
    (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593, eq. 2; Ouyang et al. 2022,
    https://arxiv.org/abs/2203.02155, eq. 2). A row with no valid token gets no reward.

    Args:
      scores: [B] scalar rewards of the completions.
      logp: [B, T] log-probs of the sampled tokens under the policy.
      ref_logp: [B, T] log-probs of the same tokens under the reference.
      mask: [B, T] bool, True on valid (generated, not padding) tokens.
      beta: KL coefficient, scalar (may be a traced array).

    Returns:
      [B, T] float32 per-token rewards.
    """
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    mask = jnp.asarray(mask, bool)
    scores = jnp.asarray(scores, jnp.float32)
    if logp.ndim != 2 or logp.shape != ref_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"ppo_token_rewards: logp, ref_logp and mask must be [B, T] of one "
                         f"shape, got {logp.shape}, {ref_logp.shape}, {mask.shape}")
    if scores.shape != logp.shape[:1]:
        raise ValueError(f"ppo_token_rewards: scores must be [B]={logp.shape[:1]}, got "
                         f"{scores.shape}")
    penalty = jnp.where(mask, -jnp.asarray(beta, jnp.float32) * (logp - ref_logp), 0.0)
    positions = jnp.arange(logp.shape[1])[None, :]
    at_last = (positions == last_valid_index(mask)[:, None]) & jnp.any(mask, -1, keepdims=True)
    return penalty + jnp.where(at_last, scores[:, None], 0.0)


def adaptive_kl_coef(beta: float, kl: float, *, target: float, horizon: float,
                     num_samples: int) -> float:
    """Adaptive KL controller: the next KL coefficient.

    e = clip(KL / KL_target - 1, -0.2, 0.2), beta <- beta (1 + e n / horizon)
    (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593, sec. 2.2).

    Args:
      beta: current coefficient.
      kl: measured mean KL(pi || pi_ref) per token of the last batch.
      target: KL_target.
      horizon: horizon in samples.
      num_samples: n, completions in the last batch.

    Returns:
      the new coefficient (a Python float).
    """
    error = float(np.clip(kl / target - 1.0, -0.2, 0.2))
    return float(beta * (1.0 + error * num_samples / horizon))


def completion_logp(policy: Policy, params: Params, tokens, attention_mask, prompt_len: int,
                    return_entropy: bool = False):
    """Log-probs of the completion tokens [B, N] (and entropies) at temperature 1."""
    out = logprobs(policy.bind(params), tokens, attention_mask, return_entropy=return_entropy)
    logp = out["logp"][:, prompt_len:]
    return (logp, out["entropy"][:, prompt_len:]) if return_entropy else logp


def completion_values(critic: Policy, critic_params: Params, tokens, attention_mask,
                      prompt_len: int):
    """V(s_t) before each completion token: the value head after token t-1, [B, N]."""
    out = logprobs(critic.bind(critic_params), tokens, attention_mask, return_values=True)
    return out["values"][:, prompt_len - 1:-1]


def make_prepare_fn(policy: Policy, critic: Policy, *, prompt_len: int, gamma: float,
                    lambda_: float, whiten_advantages: bool = True, use_reference: bool = True):
    """jit(params, ref_params, critic_params, batch, beta) -> rollout-time quantities.

    Returns dict: old_logp, ref_logp, old_values, token_rewards, advantages, returns [B, N]
    and kl (scalar token-mean of log pi - log pi_ref).
    """

    @jax.jit
    def prepare(params, ref_params, critic_params, batch, beta):
        tokens, attn, mask = batch["tokens"], batch["attention_mask"], batch["completion_mask"]
        old_logp = completion_logp(policy, params, tokens, attn, prompt_len)
        ref_logp = (completion_logp(policy, ref_params, tokens, attn, prompt_len)
                    if use_reference else old_logp)
        old_values = jnp.where(mask, completion_values(critic, critic_params, tokens, attn,
                                                       prompt_len), 0.0)
        rewards = ppo_token_rewards(batch["scores"], old_logp, ref_logp, mask, beta=beta)
        advantages, returns = losses.token_gae(rewards, old_values, mask, gamma=gamma,
                                               lambda_=lambda_)
        if whiten_advantages:
            advantages = losses.whiten(advantages, mask)
        num_tokens = jnp.maximum(jnp.sum(mask), 1)
        kl = jnp.sum(jnp.where(mask, old_logp - ref_logp, 0.0)) / num_tokens
        return {"old_logp": old_logp, "ref_logp": ref_logp, "old_values": old_values,
                "token_rewards": rewards, "advantages": advantages, "returns": returns,
                "kl": kl}

    return prepare


def make_ppo_update(policy: Policy, critic: Policy, policy_optimizer, critic_optimizer, *,
                    prompt_len: int, epsilon: float, value_clip: float | None,
                    micro_batches: int = 1):
    """jit(params, opt_state, critic_params, critic_opt_state, batch) -> (..., metrics).

    Policy: token-mean clipped surrogate on per-token advantages; critic: token-mean clipped
    value loss; both normalised by the minibatch's global token count.
    """

    def policy_loss(params, batch, num_tokens):
        mask = batch["completion_mask"]
        logp, entropy = completion_logp(policy, params, batch["tokens"], batch["attention_mask"],
                                        prompt_len, return_entropy=True)
        per_token, clipped = losses.clipped_surrogate(logp, batch["old_logp"],
                                                      batch["advantages"], epsilon=epsilon,
                                                      mask=mask)
        mean = functools.partial(losses.aggregate, mask=mask, mode="token-mean",
                                 num_tokens=num_tokens)
        loss = mean(per_token)
        approx_kl = mean(jax.lax.stop_gradient(batch["old_logp"] - logp))
        return loss, {"pg_loss": loss, "clip_frac": mean(clipped.astype(jnp.float32)),
                      "entropy": mean(jax.lax.stop_gradient(entropy)),
                      "approx_kl_old": approx_kl}

    def critic_loss(critic_params, batch, num_tokens):
        mask = batch["completion_mask"]
        values = completion_values(critic, critic_params, batch["tokens"],
                                   batch["attention_mask"], prompt_len)
        per_token = losses.value_loss(values, batch["old_values"], batch["returns"],
                                      clip=value_clip)
        loss = losses.aggregate(per_token, mask, mode="token-mean", num_tokens=num_tokens)
        return loss, {"value_loss": loss}

    def update(params, opt_state, critic_params, critic_opt_state, batch):
        num_tokens = jnp.maximum(jnp.sum(batch["completion_mask"].astype(jnp.float32)), 1.0)
        _, grads, metrics = accumulate_gradients(
            functools.partial(policy_loss, num_tokens=num_tokens), params, batch, micro_batches)
        _, critic_grads, critic_metrics = accumulate_gradients(
            functools.partial(critic_loss, num_tokens=num_tokens), critic_params, batch,
            micro_batches)
        metrics = {**metrics, **critic_metrics, "grad_norm": optax.global_norm(grads),
                   "critic_grad_norm": optax.global_norm(critic_grads)}
        updates, opt_state = policy_optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        critic_updates, critic_opt_state = critic_optimizer.update(critic_grads,
                                                                   critic_opt_state,
                                                                   critic_params)
        critic_params = optax.apply_updates(critic_params, critic_updates)
        return params, opt_state, critic_params, critic_opt_state, metrics

    return jit_update(update, num_state_args=4)


# ---------------------------------------------------------------------------------------
# Stage kind "ppo"


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "ppo" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "ppo"
    s.steps = 60  # PPO iterations (sample -> score -> GAE -> updates)
    s.num_prompts = 32  # N prompts per iteration
    s.group_size = 1  # completions per prompt (PPO needs no groups; > 1 is allowed)
    s.num_iterations = 2  # epochs over each rollout batch
    s.num_minibatches = 2  # optimizer steps per epoch
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
    s.lr = 1e-3  # policy learning rate
    s.critic_lr = 1e-3  # critic learning rate
    s.epsilon = 0.2  # policy ratio clip
    s.value_clip = 0.2  # value clip c (< 0: unclipped value loss)
    s.gamma = 1.0  # discount over completion tokens
    s.lam = 0.95  # GAE lambda
    s.whiten_advantages = True  # normalise advantages over valid tokens of the batch
    s.beta = 0.05  # initial KL coefficient of the per-token reward (0 = no reference)
    s.adaptive_kl = False  # Ziegler et al. adaptive controller on beta
    s.kl_target = 0.05  # target KL per token of the adaptive controller
    s.kl_horizon = 10000  # horizon (samples) of the adaptive controller
    s.top_k = 0  # 0 = off (sampling is at temperature 1)
    s.top_p = 1.0
    s.max_new_tokens = 40
    s.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})  # name -> weight;
    #   names: task rewards, grpo_jax.rewards.get_reward_fn names, or "reward_model"
    s.reward_model = ""  # stage name (or absolute dir) of a trained "reward_model" stage
    s.checkpoint_every = 20  # steps between checkpoints (0 = only at the end)
    return s


def validate_section(name: str, section, config) -> None:
    """Raises ValueError naming the field for an unusable "ppo" section."""
    for field in ("steps", "num_prompts", "group_size", "num_iterations", "num_minibatches",
                  "micro_batches", "max_new_tokens"):
        if int(section[field]) < 1:
            raise ValueError(f"{name}.{field}: expected >= 1, got {section[field]}")
    rows = section.num_prompts * section.group_size
    if rows % section.num_minibatches:
        raise ValueError(f"{name}.num_minibatches: rollout batch {rows} is not divisible by "
                         f"{section.num_minibatches}")
    per_mb = rows // section.num_minibatches
    if per_mb % (section.micro_batches * jax.device_count()):
        raise ValueError(f"{name}.micro_batches: minibatch of {per_mb} rows is not divisible "
                         f"by micro_batches x devices = {section.micro_batches} x "
                         f"{jax.device_count()}")
    if not 0.0 <= section.gamma <= 1.0 or not 0.0 <= section.lam <= 1.0:
        raise ValueError(f"{name}.gamma/lam: expected values in [0, 1], got "
                         f"{section.gamma}, {section.lam}")
    if section.epsilon <= 0:
        raise ValueError(f"{name}.epsilon: expected > 0, got {section.epsilon}")
    if section.beta < 0:
        raise ValueError(f"{name}.beta: expected >= 0, got {section.beta}")
    if section.adaptive_kl and (section.kl_target <= 0 or section.kl_horizon <= 0
                                or section.beta <= 0):
        raise ValueError(f"{name}.adaptive_kl: needs beta > 0, kl_target > 0 and "
                         "kl_horizon > 0")
    if config.task.prompt_len + section.max_new_tokens > config.model.max_seq_len:
        raise ValueError(f"{name}.max_new_tokens: prompt_len {config.task.prompt_len} + "
                         f"{section.max_new_tokens} exceeds model.max_seq_len "
                         f"{config.model.max_seq_len}")
    if len(section.rewards) == 0:
        raise ValueError(f"{name}.rewards: expected at least one reward")
    if REWARD_MODEL_REWARD in section.rewards and not section.reward_model:
        raise ValueError(f"{name}.reward_model: the reward 'reward_model' needs the name of a "
                         "reward_model stage (or a directory)")


def score_rollout(run, section, ro, examples, reward_model):
    """Adds the learned reward (if any) to a rollout's rule rewards; returns (total, comps)."""
    total = np.asarray(ro.rewards, np.float32).copy()
    components = dict(ro.components)
    weights = dict(section.rewards.to_dict())
    if reward_model is not None:
        learned = reward_model.score(ro.texts, examples)
        components[REWARD_MODEL_REWARD] = learned
        total += np.float32(weights[REWARD_MODEL_REWARD]) * learned
    return total, components


def ppo_stage(run, stage) -> None:
    """PPO iterations: sample -> rewards -> per-token KL rewards -> GAE -> policy/critic."""
    from grpo_jax.rl.update import build_batch
    from grpo_jax.stages import _optimizer, _progress, collect_rollout, sampling_config
    from grpo_jax.tasks.data import prompt_iterator

    section, cfg = stage.section, run.config
    n, g = section.num_prompts, section.group_size
    rows = n * g
    updates = section.num_iterations * section.num_minibatches
    optimizer, schedule = _optimizer(run, section, section.steps * updates)
    critic_section = ml_collections.ConfigDict({"lr": section.critic_lr})
    critic_optimizer, _ = _optimizer(run, critic_section, section.steps * updates)
    critic = scalar_head_policy(run.model_config)
    use_reference = section.beta > 0
    critic_params = add_scalar_head(run.params)
    state = {"params": run.params,
             "opt_state": init_opt_state(optimizer, run.params, run.mesh),
             "critic_params": critic_params,
             "critic_opt_state": init_opt_state(critic_optimizer, critic_params, run.mesh)}
    if use_reference:
        state["ref_params"] = jax.tree.map(jnp.copy, run.params)
    iterator = prompt_iterator(run.task.examples("train", cfg.task.train_size, seed=cfg.seed),
                               batch_size=n, seed=cfg.seed + stage.index)
    start, beta = 0, float(section.beta)
    if stage.resume_meta is not None:
        state = run.restore_stage(state)
        iterator.set_state(stage.resume_meta["data_state"])
        start = int(stage.resume_meta["stage_step"])
        beta = float(stage.resume_meta.get("kl_coef", beta))
    run.params, opt_state = state["params"], state["opt_state"]
    critic_params, critic_opt_state = state["critic_params"], state["critic_opt_state"]
    ref_params = state.get("ref_params")

    prompt_len = cfg.task.prompt_len
    weights = dict(section.rewards.to_dict())
    rule_weights = {k: v for k, v in weights.items() if k != REWARD_MODEL_REWARD}
    reward_fns = resolve_reward_fns(run, list(rule_weights), section=section)
    reward_model = (load_reward_model(run, section.reward_model)
                    if REWARD_MODEL_REWARD in weights else None)
    prepare = make_prepare_fn(run.policy, critic, prompt_len=prompt_len, gamma=section.gamma,
                              lambda_=section.lam, whiten_advantages=section.whiten_advantages,
                              use_reference=use_reference)
    update = make_ppo_update(run.policy, critic, optimizer, critic_optimizer,
                             prompt_len=prompt_len, epsilon=section.epsilon,
                             value_clip=section.value_clip if section.value_clip > 0 else None,
                             micro_batches=section.micro_batches)
    sampling = sampling_config(run, max_new_tokens=section.max_new_tokens, temperature=1.0,
                               top_k=section.top_k, top_p=section.top_p)
    bar = _progress(stage, section.steps, start)
    for step in range(start, section.steps):
        t0 = time.time()
        ro, examples, _ = collect_rollout(run, stage, iterator, step, sampling=sampling,
                                          weights=rule_weights, reward_fns=reward_fns, dynamic=False)
        scores, components = score_rollout(run, section, ro, examples, reward_model)
        batch = build_batch(ro, np.zeros(rows, np.float32))
        batch["scores"] = jnp.asarray(scores)
        ref = ref_params if use_reference else run.params  # unused without a reference
        prep = prepare(run.params, ref, critic_params, batch, jnp.float32(beta))
        kl = float(prep.pop("kl"))
        batch.update(prep)
        t_sample = time.time() - t0
        per_mb = rows // section.num_minibatches
        collected = []
        for it in range(section.num_iterations):
            order = np.random.default_rng([cfg.seed, stage.index, step, it]).permutation(rows)
            for mb in range(section.num_minibatches):
                idx = np.sort(order[mb * per_mb:(mb + 1) * per_mb])
                mb_batch = {k: v[idx] for k, v in batch.items()}
                run.params, opt_state, critic_params, critic_opt_state, m = update(
                    run.params, opt_state, critic_params, critic_opt_state, mb_batch)
                collected.append(m)
        m = jax.device_get(jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *collected))
        correct = components.get("accuracy", scores) >= 1.0
        record = {
            "stage_step": step + 1,
            "reward_mean": float(scores.mean()),
            "reward_std": float(scores.std()),
            **{f"reward/{k}": float(np.mean(v)) for k, v in components.items()},
            "pass@1": float(np.mean(correct)),
            "completion_length": float(ro.lengths.mean()),
            "truncated_frac": float(ro.truncated.mean()),
            "kl": kl,
            "kl_coef": beta,
            "value_mean": float(jnp.sum(batch["old_values"]) /
                                max(float(jnp.sum(batch["completion_mask"])), 1.0)),
            **{k: float(v) for k, v in m.items()},
            "loss": float(m["pg_loss"] + m["value_loss"]),
            "learning_rate": float(schedule(step * updates)),
            "sample_time_s": t_sample,
            "step_time_s": time.time() - t0,
        }
        if section.adaptive_kl:
            beta = adaptive_kl_coef(beta, kl, target=section.kl_target,
                                    horizon=section.kl_horizon, num_samples=rows)
        run.global_step += 1
        run.writer.write(run.global_step, record, stage=stage.name)
        bar.update(1)
        bar.set_postfix(reward=f"{record['reward_mean']:.3f}", kl=f"{kl:.4f}")
        every = section.checkpoint_every
        if every and (step + 1) % every == 0 and step + 1 < section.steps:
            ckpt = {"params": run.params, "opt_state": opt_state,
                    "critic_params": critic_params, "critic_opt_state": critic_opt_state}
            if use_reference:
                ckpt["ref_params"] = ref_params
            run.save(stage, ckpt, stage_step=step + 1, done=False,
                     data_state=iterator.get_state(), kl_coef=beta)
    bar.close()
    run.finish_stage(stage, section.steps)
