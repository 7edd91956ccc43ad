"""The policy update: clipped surrogate + KL to the reference, aggregated with global counts.

One jitted `train_step` per (minibatch shape, loss settings): a minibatch is split into
micro-batches whose gradients are summed; every normalisation uses the minibatch's global
token and sequence counts, so 1 or k micro-batches give the same update.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from grpo_jax import losses
from grpo_jax.models import completion_logprobs
from grpo_jax.rl.algorithms import (Algorithm, EstimatorInputs, Objective, Settings,
                                    compute_advantages)
from grpo_jax.rl.batch import RolloutBatch
from grpo_jax.rl.packing import packed_completion_logprobs
from grpo_jax.training import (Params, Policy, jit_update, merge_micro_batches,
                               optimizer_step, split_micro_batches)


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Static settings of the policy loss (hashable: part of the compiled program)."""

    epsilon: float = 0.2
    epsilon_high: float | None = None
    dual_clip: float | None = None
    ratio_level: str = "token"  # token | sequence (GSPO)
    beta: float = 0.0  # coefficient of the KL term in the loss (0: none)
    kl_kind: str = "k3"
    loss_agg: str = "seq-mean-token-mean"
    on_policy: bool = True  # old_logp == stop_gradient(logp): a single pass per rollout
    temperature: float = 1.0  # logits / temperature, as in the sampling distribution
    objective: Objective = Objective.CLIP  # clip (PPO's clipped surrogate) | cispo
    entropy_coef: float = 0.0  # entropy bonus: the loss subtracts entropy_coef * entropy
    # The policy-gradient term on a fraction of the tokens only (`entropy_tokens`): the
    # highest-entropy `token_fraction` of them ("top") or the lowest ("bottom"); 1.0: all.
    token_fraction: float = 1.0
    token_side: str = "top"
    # The policy-gradient term on the tokens whose advantage has one sign only
    # (`advantage_sign_tokens`): "positive" (Zhu et al. 2025's positive sample
    # reinforcement), "negative" (negative sample reinforcement) or "both" (every token).
    advantage_sign: str = "both"

    @classmethod
    def for_algorithm(cls, algorithm, settings, *, on_policy: bool, temperature: float = 1.0,
                      dual_clip: float | None = None, entropy_coef: float = 0.0,
                      token_fraction: float = 1.0, token_side: str = "top",
                      advantage_sign: str = "both"):
        """The loss of an `rl.algorithms.Algorithm` with its resolved `Settings`."""
        return cls(epsilon=settings.epsilon, epsilon_high=settings.epsilon_high,
                   dual_clip=dual_clip, ratio_level=settings.ratio_level,
                   beta=settings.beta if algorithm.kl_placement == "loss" else 0.0,
                   kl_kind=settings.kl_kind, loss_agg=settings.loss_agg, on_policy=on_policy,
                   temperature=temperature, objective=algorithm.objective,
                   entropy_coef=entropy_coef, token_fraction=token_fraction,
                   token_side=token_side, advantage_sign=advantage_sign)


def sequence_logp(policy: Policy, params: Params, tokens, attention_mask, prompt_len: int,
                  temperature: float = 1.0, return_entropy: bool = False,
                  prompt_group: int = 1):
    """Teacher-forced log-probs of the completion part [B, N] (and entropies).

    `prompt_group` G > 1: rows come in contiguous groups of G sharing one prompt (the G
    completions of GRPO), whose prompt is then run once (`models.completion_logprobs`).
    """
    out = completion_logprobs(policy.bind(params), tokens, attention_mask, prompt_len,
                              group_size=prompt_group, return_entropy=return_entropy,
                              temperature=temperature, chunk_size=policy.logprob_chunk_size,
                              chunk_rows=policy.logprob_chunk_rows)
    return out["logp"], out.get("entropy")


def batch_logp(policy: Policy, params: Params, batch: RolloutBatch, prompt_len: int,
               temperature: float = 1.0, prompt_group: int = 1):
    """(logp, entropy) [B, N] of a batch's completions: `sequence_logp` on its padded rows,
    or the same from its packed blocks when it has them (`rl.packing`)."""
    if batch.packed is None:
        return sequence_logp(policy, params, batch.tokens, batch.attention_mask, prompt_len,
                             temperature, return_entropy=True, prompt_group=prompt_group)
    out = packed_completion_logprobs(policy.bind(params), batch.packed, temperature=temperature,
                                     return_entropy=True, chunk_size=policy.logprob_chunk_size)
    return out["logp"], out["entropy"]


def batch_split(batch: RolloutBatch, micro_batches: int, streams: int) -> tuple[int, int]:
    """(micro-batches, streams) an update splits `batch` into: as configured for padded rows,
    (1, 1) for packed blocks (a block holds several rows, so splitting the blocks would not
    split the rows)."""
    return (1, 1) if batch.packed is not None else (micro_batches, streams)


def sequence_score_grads(policy: Policy, params: Params, tokens, attention_mask,
                         prompt_len: int, loss_mask=None, temperature: float = 1.0):
    """Per-sequence score functions grad_theta log pi(y_i | x_i), one per row: a pytree like
    `params` with a leading [B] axis. log pi(y_i | x_i) sums the completion's log-probs over
    `loss_mask` (default: the completion's attention mask). For gradient-variance studies of
    baselines on the language model (`losses.optimal_baseline` takes their squared norms);
    memory grows with B x parameters, so use it on small models or few rows at a time."""
    mask = attention_mask[:, prompt_len:] if loss_mask is None else loss_mask

    def row_logp(p, row_tokens, row_attention, row_mask):
        logp, _ = sequence_logp(policy, p, row_tokens[None], row_attention[None], prompt_len,
                                temperature)
        return jnp.sum(jnp.where(row_mask[None], logp, 0.0))

    return jax.vmap(jax.grad(row_logp), in_axes=(None, 0, 0, 0))(
        params, tokens, attention_mask, mask)


def flat_sequence_score_grads(policy: Policy, params: Params, tokens, attention_mask,
                              prompt_len: int, loss_mask=None, temperature: float = 1.0):
    """[B, P] `sequence_score_grads` with each row's leaves flattened and concatenated (in
    `jax.tree.leaves` order, P = the number of parameters): rows whose Gram matrix and
    norms a gradient-variance study takes."""
    grads = sequence_score_grads(policy, params, tokens, attention_mask, prompt_len,
                                 loss_mask, temperature)
    return jnp.concatenate([g.reshape(g.shape[0], -1) for g in jax.tree.leaves(grads)], 1)


def sequence_score_sq_norms(policy: Policy, params: Params, tokens, attention_mask,
                            prompt_len: int, loss_mask=None, temperature: float = 1.0):
    """[B] squared norms ||grad_theta log pi(y_i | x_i)||^2 (`sequence_score_grads`)."""
    grads = sequence_score_grads(policy, params, tokens, attention_mask, prompt_len,
                                 loss_mask, temperature)
    return sum(jnp.sum(jnp.square(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1)
               for g in jax.tree.leaves(grads))


def entropy_tokens(entropy, mask, fraction: float, side: str = "top"):
    """[B, N] bool: the tokens of `mask` whose entropy is among the highest `fraction` of
    the masked tokens' ("top": at or above their (1 - fraction) quantile) or the lowest
    ("bottom": at or below their `fraction` quantile); every masked token for fraction 1.
    The high-entropy "forking" tokens of Wang et al. 2025 (arXiv:2506.01939) are top 0.2.
    The quantile is linear-interpolated over the masked tokens of the (micro-)batch."""
    mask = mask.astype(bool)
    if fraction >= 1.0:
        return mask
    values = jnp.where(mask, entropy, jnp.nan)
    if side == "top":
        return mask & (entropy >= jnp.nanquantile(values, 1.0 - fraction))
    if side == "bottom":
        return mask & (entropy <= jnp.nanquantile(values, fraction))
    raise ValueError(f"token_side: expected 'top' or 'bottom', got {side!r}")


ADVANTAGE_SIGNS = ("both", "positive", "negative")


def advantage_sign_tokens(advantages, mask, sign: str):
    """[B, N] bool: the tokens of `mask` whose advantage is > 0 ("positive"), < 0
    ("negative"), or every masked token ("both"); a zero advantage is in neither sign.
    Per-sequence estimators give every token of a completion its completion's advantage, so
    "positive" keeps the completions above their group's baseline (Zhu et al. 2025,
    arXiv:2506.01347: positive / negative sample reinforcement)."""
    mask = mask.astype(bool)
    if sign == "both":
        return mask
    if sign == "positive":
        return mask & (advantages > 0)
    if sign == "negative":
        return mask & (advantages < 0)
    raise ValueError(f"advantage_sign: expected one of {list(ADVANTAGE_SIGNS)}, got {sign!r}")


def prompt_group_for(rows: int, group_size: int, micro_batches: int = 1) -> int:
    """The prompt group an update over `rows` rows in `micro_batches` can share: G when a
    micro-batch holds whole groups, else 1 (nothing shared)."""
    return group_size if group_size > 1 and (rows // micro_batches) % group_size == 0 else 1


def policy_loss(params: Params, batch: RolloutBatch, *, policy: Policy,
                settings: LossSettings, prompt_len: int, num_tokens, num_sequences,
                prompt_group: int = 1):
    """Scalar loss of one micro-batch (normalised by global counts) and additive metrics.

    loss = agg(objective_t + beta * KL_t - entropy_coef * H_t) over the loss mask, where
    the objective is `settings.objective`'s (`rl.algorithms.Objective.loss`). With
    `settings.token_fraction` < 1 the objective's term counts only on the tokens
    `entropy_tokens` selects by the current policy's entropy (the aggregation's counts are
    the loss mask's, so the other tokens contribute zero; the KL and entropy terms are
    unchanged); `token_frac` logs the share selected. With `settings.advantage_sign`
    "positive" or "negative" the objective's term counts only on the tokens whose advantage
    has that sign (`advantage_sign_tokens`; the same counts, KL and entropy terms: the loss
    is the full one with the other sign's advantages set to zero); `sign_frac` logs the share
    kept.
    """
    mask = batch.loss_mask
    logp, entropy = batch_logp(policy, params, batch, prompt_len, settings.temperature,
                               prompt_group=prompt_group)
    old_logp = jax.lax.stop_gradient(logp) if settings.on_policy else batch.old_logp
    per_token, clipped = Objective(settings.objective).loss(
        logp, old_logp, batch.advantages, epsilon=settings.epsilon,
        epsilon_high=settings.epsilon_high, dual_clip=settings.dual_clip,
        ratio_level=settings.ratio_level, mask=mask)
    if batch.is_weights is not None:  # an off-policy correction's per-token weights
        per_token = per_token * batch.is_weights
    selected = None
    if settings.token_fraction < 1.0:
        selected = entropy_tokens(jax.lax.stop_gradient(entropy), mask,
                                  settings.token_fraction, settings.token_side)
        per_token = jnp.where(selected, per_token, 0.0)
    signed = None
    if settings.advantage_sign != "both":
        signed = advantage_sign_tokens(batch.advantages, mask, settings.advantage_sign)
        per_token = jnp.where(signed, per_token, 0.0)
    max_len = logp.shape[1]
    aggregate = functools.partial(losses.aggregate, mask=mask, mode=settings.loss_agg,
                                  num_tokens=num_tokens, num_sequences=num_sequences,
                                  max_len=max_len)
    token_mean = functools.partial(losses.aggregate, mask=mask, mode="token-mean",
                                   num_tokens=num_tokens)
    metrics = {
        "pg_loss": aggregate(per_token),
        "clip_frac": token_mean(clipped.astype(jnp.float32)),
        "entropy": token_mean(jax.lax.stop_gradient(entropy)),
    }
    if selected is not None:
        metrics["token_frac"] = token_mean(selected.astype(jnp.float32))
    if signed is not None:
        metrics["sign_frac"] = token_mean(signed.astype(jnp.float32))
    metrics.update(logp_mismatch(jax.lax.stop_gradient(logp), batch.behaviour_logp, mask,
                                 num_tokens=num_tokens))
    total = per_token
    if settings.beta != 0.0:
        kl = losses.kl_penalty(logp, batch.ref_logp, kind=settings.kl_kind)
        total = total + settings.beta * kl
        metrics["kl_ref"] = token_mean(jax.lax.stop_gradient(kl))
    if settings.entropy_coef != 0.0:
        total = total - settings.entropy_coef * entropy
    loss = aggregate(total)
    metrics["loss"] = loss
    return loss, metrics


def make_train_step(policy: Policy, optimizer: optax.GradientTransformation,
                    settings: LossSettings, *, prompt_len: int, micro_batches: int,
                    group_size: int = 1):
    """jit(params, opt_state, batch) -> (params, opt_state, metrics).

    `group_size` G > 1 promises that the batch's rows come in contiguous groups of G sharing
    one prompt (`sampling.check_prompt_groups`); each micro-batch and row group then runs
    each prompt once, when it holds whole groups (`prompt_group_for`). A non-finite loss,
    gradient or update is not applied (`training.apply_if_finite`; the metrics' "skipped"
    flag says so). A batch with `packed` rows (`rl.packing`) runs its blocks in one
    micro-batch and one stream (the blocks already hold only the rows' tokens)."""

    def train_step(params, opt_state, batch: RolloutBatch):
        mask = batch.loss_mask
        num_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
        num_sequences = jnp.asarray(mask.shape[0], jnp.float32)
        micro, streams = batch_split(batch, micro_batches, policy.batch_streams)
        group = (1 if batch.packed is not None
                 else prompt_group_for(mask.shape[0], group_size, micro))
        loss_fn = functools.partial(policy_loss, policy=policy, settings=settings,
                                    prompt_len=prompt_len, num_tokens=num_tokens,
                                    num_sequences=num_sequences, prompt_group=group)
        return optimizer_step(loss_fn, optimizer, params, opt_state, batch,
                              micro_batches=micro, streams=streams, row_unit=group)

    return jit_update(train_step)


def make_logp_fn(policy: Policy, *, prompt_len: int, temperature: float = 1.0,
                 group_size: int = 1):
    """jit(params, tokens, attention_mask) -> completion log-probs [B, N] (no gradient);
    `group_size` as in `make_train_step`."""

    @jax.jit
    def fn(params, tokens, attention_mask):
        group = prompt_group_for(tokens.shape[0], group_size)
        logp, _ = sequence_logp(policy, params, tokens, attention_mask, prompt_len, temperature,
                                prompt_group=group)
        return logp

    return fn


def make_prepare_fn(policy: Policy, algorithm: Algorithm, settings: Settings, *,
                    prompt_len: int, temperature: float = 1.0, group_size: int = 1,
                    adv_eps: float = 1e-6, on_policy: bool = True, micro_batches: int = 1,
                    correction: str | None = None, is_cap: float = 2.0,
                    mis_range: tuple[float, float] = (0.5, 2.0)):
    """fn(params, ref_params, batch, correct, truncated) -> (batch, metrics): a GRPO-family
    batch made ready for its update (pure; jit it, or call it inside a bigger program).

    In order: DAPO's overlong filter on the loss mask (a completion without an end token
    carries no loss), the reference log-probs (when beta != 0), the policy's log-probs at
    the sampling parameters (off-policy passes, and the KL-in-reward algorithms), the
    per-token KL penalty of KL-in-reward algorithms, and the algorithm's advantages.
    `ref_params` may be None when beta is 0. `correct` [B] bool is the verified-correct
    indicator (expert iteration); `truncated` [B] bool marks completions without an end
    token. Metrics: logp_diff_max / logp_diff_mean of the recomputed
    log-probs against the sampler's, and kl_ref (token mean) when the KL is in the reward.
    The log-prob passes run over `micro_batches` chunks of whole groups, one after another
    (`training.split_micro_batches`), so their memory is that of one chunk.

    `correction` (None: on-policy rollouts, nothing to correct) handles rollouts sampled by
    older parameters (`off_policy_weights`): the trainer's log-probs at its current
    parameters are the proximal policy; "none" takes the update's ratio against the
    sampler's log-probs (old_logp = behaviour_logp), the others against the proximal
    policy with the batch's is_weights (TIS, MIS with its dropped tokens out of the loss
    mask, decoupled). Their metrics join the batch's. Needs on_policy False.
    """
    kl_in_reward = algorithm.kl_placement == "reward" and settings.beta != 0.0
    if correction is not None and on_policy:
        raise ValueError("make_prepare_fn: an off-policy correction needs on_policy=False")
    needs_old = not on_policy or kl_in_reward

    def logp_of(params, batch):
        group = prompt_group_for(batch.rows, group_size)

        def chunk_logp(rows):
            tokens, attention_mask = rows
            return sequence_logp(policy, params, tokens, attention_mask, prompt_len,
                                 temperature, prompt_group=group)[0]

        if micro_batches == 1:
            return chunk_logp((batch.tokens, batch.attention_mask))
        rows = split_micro_batches((batch.tokens, batch.attention_mask), micro_batches,
                                   group_size)
        return merge_micro_batches(jax.lax.map(chunk_logp, rows), group_size)

    def prepare(params, ref_params, batch: RolloutBatch, correct, truncated):
        metrics = {}
        if settings.overlong_filter:
            batch = batch.replace(loss_mask=batch.loss_mask & ~truncated[:, None])
        if settings.beta != 0.0:
            batch = batch.replace(ref_logp=logp_of(ref_params, batch))
        if needs_old:
            batch = batch.replace(old_logp=logp_of(params, batch))
            metrics.update(logp_mismatch(batch.old_logp, batch.behaviour_logp,
                                         batch.loss_mask))
        if correction is not None:
            weights, kept, is_metrics = off_policy_weights(
                batch.old_logp, batch.behaviour_logp, batch.loss_mask, correction=correction,
                cap=is_cap, low=mis_range[0], high=mis_range[1])
            metrics.update(is_metrics)
            if correction == "none":
                batch = batch.replace(old_logp=batch.behaviour_logp)
            else:
                batch = batch.replace(is_weights=weights, loss_mask=kept)
        penalty = None
        if kl_in_reward:
            kl = losses.kl_penalty(batch.old_logp, batch.ref_logp, kind=settings.kl_kind)
            penalty = settings.beta * kl
            metrics["kl_ref"] = losses.aggregate(kl, batch.loss_mask, mode="token-mean")
        inputs = EstimatorInputs(rewards=batch.rewards, correct=correct, mask=batch.loss_mask,
                                 group_size=group_size, eps=adv_eps, token_penalty=penalty)
        batch = batch.replace(advantages=compute_advantages(algorithm, inputs))
        return batch, metrics

    return prepare


CORRECTIONS = ("none", "tis", "mis", "decoupled")


def off_policy_weights(proximal_logp, behaviour_logp, mask, *, correction: str,
                       cap: float = 2.0, low: float = 0.5, high: float = 2.0):
    """Per-token importance weights of rollouts sampled by an older policy, and the tokens
    kept.

    w_t = pi_prox(y_t) / mu(y_t) = exp(proximal_logp - behaviour_logp), with mu the policy
    that sampled the rollout (its own log-probs) and pi_prox the trainer's parameters when
    the update starts. The update then clips its ratio pi_theta / pi_prox and weights each
    token by:

    * "tis", truncated importance sampling: min(w_t, cap) (Ionides 2008; for RL of LMs,
      Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
      training", https://fengyao.notion.site/off-policy-rl);
    * "mis", masked importance sampling: w_t where low <= w_t <= high, and the token is
      dropped from the loss otherwise;
    * "decoupled": w_t untruncated, AReaL's decoupled PPO objective (Fu et al. 2025,
      https://arxiv.org/abs/2505.24298), the proximal policy being pi_prox;
    * "none": no weight (1); the caller then takes the ratio against mu itself.

    Args:
      proximal_logp, behaviour_logp: [B, N] float32 log-probs of the sampled tokens.
      mask: [B, N] bool, the tokens carrying loss.
      correction: one of CORRECTIONS.
      cap: TIS's C > 0.
      low, high: MIS's range, 0 <= low < 1 < high.

    Returns:
      (weights [B, N] float32, kept [B, N] bool (mask, less MIS's dropped tokens), metrics:
      is_weight_mean / is_weight_max of w_t over the masked tokens, is_truncated_frac (TIS)
      or is_masked_frac (MIS), and kl_behaviour, the k3 estimate of KL(mu || pi_prox) on
      the sampled tokens).
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction: expected one of {CORRECTIONS}, got {correction!r}")
    mask = jnp.asarray(mask, bool)
    log_ratio = jnp.where(mask, proximal_logp - behaviour_logp, 0.0)
    w = jnp.exp(log_ratio)
    count = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    mean = lambda x: jnp.sum(jnp.where(mask, x, 0.0)) / count  # noqa: E731
    metrics = {"is_weight_mean": mean(w), "is_weight_max": jnp.max(jnp.where(mask, w, 0.0)),
               "kl_behaviour": mean(losses.kl_penalty(behaviour_logp, proximal_logp,
                                                      kind="k3"))}
    kept = mask
    if correction == "none":
        weights = jnp.ones_like(w)
    elif correction == "tis":
        weights = jnp.minimum(w, cap)
        metrics["is_truncated_frac"] = mean((w > cap).astype(jnp.float32))
    elif correction == "mis":
        inside = (w >= low) & (w <= high)
        kept = mask & inside
        weights = jnp.where(inside, w, 0.0)
        metrics["is_masked_frac"] = mean((~inside).astype(jnp.float32))
    else:
        weights = w
    return jnp.where(kept, weights, 0.0), kept, metrics


def logp_mismatch(trainer_logp, sample_logp, mask, *, num_tokens=None) -> dict:
    """How far the trainer's log-probs of the sampled tokens are from the sampler's.

    logp_diff_max = max |trainer - sampler| over valid tokens; logp_diff_mean = the sum over
    valid tokens / num_tokens (default: the valid-token count, so it is the mean). A
    train/inference mismatch (dtype, kernels, truncated sampling) shows up here; in float32
    on CPU expect about 1e-6.
    """
    mask = jnp.asarray(mask, bool)
    diff = jnp.where(mask, jnp.abs(jnp.asarray(trainer_logp, jnp.float32)
                                   - jnp.asarray(sample_logp, jnp.float32)), 0.0)
    if num_tokens is None:
        num_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    return {"logp_diff_max": jnp.max(diff), "logp_diff_mean": jnp.sum(diff) / num_tokens}
