"""TRPO for small language models: the natural-gradient step on group-normalised advantages.

One rollout batch gives one step (Schulman et al. 2015, https://arxiv.org/abs/1502.05477):
g = grad of the token-mean surrogate L(theta) = mean_t ratio_t A_t at theta_old; the
Fisher-vector product is the Hessian-vector product of the exact mean KL(pi_old || pi_theta)
over the vocabulary at the sampled completion positions; the full step d = sqrt(2 delta /
x^T F x) x with x = F^{-1} g by conjugate gradient; the backtracking line search accepts the
first theta + beta^k d that improves L and keeps the true KL <= delta. The exact KL needs
the [B, N, V] logits, so this is for small vocabularies / models.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import optax.tree_utils as otu

from grpo_jax import losses
from grpo_jax.training import Params, Policy


def completion_logits(policy: Policy, params: Params, tokens, attention_mask, prompt_len: int):
    """Logits predicting each completion token: [B, N, V] float32 (read after token t-1)."""
    model = policy.bind(params)
    logits = model(tokens, attention_mask=attention_mask)
    return logits[:, prompt_len - 1:-1]


def trpo_objectives(policy: Policy, old_params: Params, batch: dict, *, prompt_len: int):
    """(surrogate(params), mean_kl(params)) closures at fixed old params and batch.

    surrogate = sum_t m_t exp(logp_t - old_logp_t) A_t / sum_t m_t;
    mean_kl = sum_t m_t KL(pi_old(.|t) || pi(.|t)) / sum_t m_t (exact over the vocabulary).
    """
    tokens, attn = batch["tokens"], batch["attention_mask"]
    mask = batch["completion_mask"]
    targets = tokens[:, prompt_len:]
    num_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    old_logits = jax.lax.stop_gradient(
        completion_logits(policy, old_params, tokens, attn, prompt_len))
    old_logp = jnp.take_along_axis(jax.nn.log_softmax(old_logits), targets[..., None], -1)[..., 0]
    advantages = jnp.broadcast_to(batch["advantages"][:, None], mask.shape)

    def surrogate(params):
        logits = completion_logits(policy, params, tokens, attn, prompt_len)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
        ratio = jnp.exp(logp - old_logp)
        return jnp.sum(jnp.where(mask, ratio * advantages, 0.0)) / num_tokens

    def mean_kl(params):
        logits = completion_logits(policy, params, tokens, attn, prompt_len)
        kl = losses.full_kl(old_logits, logits)
        return jnp.sum(jnp.where(mask, kl, 0.0)) / num_tokens

    return surrogate, mean_kl


def make_trpo_step(policy: Policy, *, prompt_len: int, max_kl: float, damping: float = 0.1,
                   cg_iters: int = 10, backtrack_ratio: float = 0.5, max_backtracks: int = 10,
                   accept_ratio: float = 0.1):
    """jit(params, batch) -> (params, metrics): one TRPO step on a rollout batch.

    batch: tokens / attention_mask [B, P+N], completion_mask [B, N], advantages [B].
    metrics: surrogate_gain, expected_gain, kl (the accepted step's true mean KL), accepted,
    step_fraction, grad_norm.
    """

    @jax.jit
    def step(params, batch):
        surrogate, mean_kl = trpo_objectives(policy, params, batch, prompt_len=prompt_len)
        grad = jax.grad(surrogate)(params)
        fvp = functools.partial(losses.fisher_vector_product, mean_kl, params, damping=damping)
        full_step = losses.natural_gradient_step(grad, fvp, max_kl=max_kl, cg_iters=cg_iters)
        expected = otu.tree_vdot(grad, full_step)
        result = losses.backtracking_line_search(
            surrogate, mean_kl, params, full_step, max_kl=max_kl,
            expected_improvement=expected, backtrack_ratio=backtrack_ratio,
            max_backtracks=max_backtracks, accept_ratio=accept_ratio)
        metrics = {"surrogate_gain": result.improvement, "expected_gain": expected,
                   "kl": result.constraint, "accepted": result.accepted.astype(jnp.float32),
                   "step_fraction": result.step_fraction,
                   "grad_norm": jnp.sqrt(otu.tree_vdot(grad, grad))}
        return result.params, metrics

    return step


# ---------------------------------------------------------------------------------------
# Stage kind "trpo"


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "trpo" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "trpo"
    s.steps = 30  # TRPO iterations (one natural-gradient step per rollout batch)
    s.num_prompts = 16  # N prompts per iteration
    s.group_size = 8  # G completions per prompt (group-normalised advantages)
    s.adv_eps = 1e-6  # std floor in group normalisation
    s.max_kl = 0.01  # delta: trust-region radius in mean KL per token
    s.damping = 0.1  # Tikhonov damping of the Fisher-vector product
    s.cg_iters = 10  # conjugate gradient iterations
    s.backtrack_ratio = 0.5  # line-search shrink factor
    s.max_backtracks = 10  # line-search candidates
    s.accept_ratio = 0.1  # smallest actual / expected improvement accepted
    s.top_k = 0  # 0 = off (sampling is at temperature 1)
    s.top_p = 1.0
    s.max_new_tokens = 40
    s.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})  # name -> weight
    s.checkpoint_every = 10  # steps between checkpoints (0 = only at the end)
    return s


def validate_section(name: str, section, config) -> None:
    """Raises ValueError naming the field for an unusable "trpo" section."""
    for field in ("steps", "num_prompts", "cg_iters", "max_backtracks", "max_new_tokens"):
        if int(section[field]) < 1:
            raise ValueError(f"{name}.{field}: expected >= 1, got {section[field]}")
    if section.group_size < 2:
        raise ValueError(f"{name}.group_size: trpo uses group-normalised advantages and needs "
                         f"G >= 2, got {section.group_size}")
    if section.max_kl <= 0:
        raise ValueError(f"{name}.max_kl: expected > 0, got {section.max_kl}")
    if not 0 < section.backtrack_ratio < 1:
        raise ValueError(f"{name}.backtrack_ratio: expected in (0, 1), got "
                         f"{section.backtrack_ratio}")
    if section.damping < 0:
        raise ValueError(f"{name}.damping: expected >= 0, got {section.damping}")
    if config.task.prompt_len + section.max_new_tokens > config.model.max_seq_len:
        raise ValueError(f"{name}.max_new_tokens: prompt_len {config.task.prompt_len} + "
                         f"{section.max_new_tokens} exceeds model.max_seq_len "
                         f"{config.model.max_seq_len}")
    if len(section.rewards) == 0:
        raise ValueError(f"{name}.rewards: expected at least one reward")


def trpo_stage(run, stage) -> None:
    """TRPO iterations: sample G per prompt -> group advantages -> natural-gradient step."""
    from grpo_jax.rl.reward_sources import resolve_reward_fns
    from grpo_jax.rl.update import build_batch
    from grpo_jax.stages import _progress, collect_rollout, sampling_config
    from grpo_jax.tasks.data import prompt_iterator

    section, cfg = stage.section, run.config
    n, g = section.num_prompts, section.group_size
    iterator = prompt_iterator(run.task.examples("train", cfg.task.train_size, seed=cfg.seed),
                               batch_size=n, seed=cfg.seed + stage.index)
    start = 0
    if stage.resume_meta is not None:
        run.params = run.restore_stage({"params": run.params})["params"]
        iterator.set_state(stage.resume_meta["data_state"])
        start = int(stage.resume_meta["stage_step"])
    prompt_len = cfg.task.prompt_len
    weights = dict(section.rewards.to_dict())
    reward_fns = resolve_reward_fns(run, list(weights), section=section)
    step_fn = make_trpo_step(run.policy, prompt_len=prompt_len, max_kl=section.max_kl,
                             damping=section.damping, cg_iters=section.cg_iters,
                             backtrack_ratio=section.backtrack_ratio,
                             max_backtracks=section.max_backtracks,
                             accept_ratio=section.accept_ratio)
    sampling = sampling_config(run, max_new_tokens=section.max_new_tokens, temperature=1.0,
                               top_k=section.top_k, top_p=section.top_p)
    bar = _progress(stage, section.steps, start)
    for step in range(start, section.steps):
        t0 = time.time()
        ro, examples, _ = collect_rollout(run, stage, iterator, step, sampling=sampling,
                                          weights=weights, reward_fns=reward_fns, dynamic=False)
        advantages = losses.group_advantages(jnp.asarray(ro.rewards), group_size=g,
                                             scale="group", eps=section.adv_eps)
        batch = build_batch(ro, advantages)
        t_sample = time.time() - t0
        run.params, m = step_fn(run.params, batch)
        m = jax.device_get(m)
        correct = ro.components.get("accuracy", ro.rewards) >= 1.0
        record = {
            "stage_step": step + 1,
            "reward_mean": float(ro.rewards.mean()),
            "reward_std": float(ro.rewards.std()),
            **{f"reward/{k}": float(v.mean()) for k, v in ro.components.items()},
            "pass@1": float(correct.mean()),
            "zero_std_groups": float((ro.rewards.reshape(n, g).std(axis=1) == 0).mean()),
            "completion_length": float(ro.lengths.mean()),
            "truncated_frac": float(ro.truncated.mean()),
            **{k: float(v) for k, v in m.items()},
            "loss": -float(m["surrogate_gain"]),
            "sample_time_s": t_sample,
            "step_time_s": time.time() - t0,
        }
        run.global_step += 1
        run.writer.write(run.global_step, record, stage=stage.name)
        bar.update(1)
        bar.set_postfix(reward=f"{record['reward_mean']:.3f}", kl=f"{record['kl']:.4f}")
        every = section.checkpoint_every
        if every and (step + 1) % every == 0 and step + 1 < section.steps:
            run.save(stage, {"params": run.params}, stage_step=step + 1, done=False,
                     data_state=iterator.get_state())
    bar.close()
    run.finish_stage(stage, section.steps)
