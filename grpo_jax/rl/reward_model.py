"""A learned reward model: a scalar-head transformer trained on preference pairs.

The reward of a (prompt, completion) is the scalar head read at the last valid token (the
EOS) of the row laid out as in SFT (BOS, prompt, completion, EOS; right-padded). Training
uses the Bradley-Terry loss on pairs built from the task: a correct versus an incorrect
worked solution of the same problem. The stage kind "reward_model"
(grpo_jax/stages/reward_model.py) trains one and saves it under `<workdir>/<stage name>/`;
`load_reward_model` turns that directory into a batched scorer and `RewardModel.reward_fn()`
into a reward `(completion, example) -> float`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from grpo_jax.models import ModelConfig, Transformer, logprobs
from grpo_jax.text.rows import encode_pair_rows
from grpo_jax.training import Params, Policy, jit_update, optimizer_step

REWARD_MODEL_REWARD = "reward_model"  # name of the learned reward in a stage's `rewards`


def scalar_head_policy(model_config: ModelConfig, *, batch_streams: int = 1) -> Policy:
    """The Policy (graph + abstract template) of `model_config` with a scalar value head."""
    config = model_config.replace(value_head=True)
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    policy, _ = Policy.from_model(abstract, batch_streams=batch_streams)
    return policy


def add_scalar_head(params: Params) -> Params:
    """Copies a language model's params and adds a zero scalar head (V = 0 at the start)."""
    if "value_kernel" in params:
        return jax.tree.map(jnp.copy, params)
    hidden = params["embedding"].shape[-1]
    dtype = params["embedding"].dtype
    out = jax.tree.map(jnp.copy, dict(params))
    out["value_kernel"] = jnp.zeros((hidden,), dtype)
    out["value_bias"] = jnp.zeros((), dtype)
    return out


def bradley_terry_loss(chosen_rewards, rejected_rewards):
    """Per-pair Bradley-Terry negative log-likelihood.

    loss = -log sigmoid(r_chosen - r_rejected) = softplus(r_rejected - r_chosen)
    (Bradley & Terry 1952, https://doi.org/10.2307/2334029; reward models for RLHF:
    Ouyang et al. 2022, https://arxiv.org/abs/2203.02155, eq. 1).

    Args:
      chosen_rewards: [B] scalar rewards of the preferred completions.
      rejected_rewards: [B] scalar rewards of the dispreferred completions.

    Returns:
      [B] per-pair losses.
    """
    chosen = jnp.asarray(chosen_rewards, jnp.float32)
    rejected = jnp.asarray(rejected_rewards, jnp.float32)
    if chosen.shape != rejected.shape or chosen.ndim != 1:
        raise ValueError(f"bradley_terry_loss: expected two [B] arrays, got {chosen.shape} "
                         f"and {rejected.shape}")
    return jax.nn.softplus(rejected - chosen)


def sequence_rewards(policy: Policy, params: Params, tokens, attention_mask):
    """Scalar head at the last valid token of each right-padded row: [B, L] -> [B] float32."""
    model = policy.bind(params)
    values = logprobs(model, tokens, attention_mask, return_values=True)["values"]
    last = jnp.maximum(jnp.sum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)
    return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]


def preference_pairs(task, examples, *, seed: int, max_tries: int = 8):
    """(example, chosen, rejected) per problem: a correct clean solution vs an incorrect one.

    Problems where no incorrect solution was drawn in `max_tries` are skipped.
    """
    rng = np.random.default_rng(seed)
    pairs = []
    for ex in examples:
        chosen, ok = task.solution(ex, rng=rng, error_rate=0.0, format_error_rate=0.0)
        if not ok:
            continue
        for _ in range(max_tries):
            rejected, wrong_ok = task.solution(ex, rng=rng, error_rate=1.0, format_error_rate=0.0)
            if not wrong_ok:
                pairs.append((ex, chosen, rejected))
                break
    return pairs


def encode_texts(tokenizer, prompts: Sequence[str], completions: Sequence[str], *, seq_len: int):
    """Right-padded BOS prompt completion EOS rows: (tokens int32 [B, L], mask bool [B, L])."""
    tokens, attention_mask, _ = encode_pair_rows(tokenizer, prompts, completions,
                                                 seq_len=seq_len)
    return tokens, attention_mask


@struct.dataclass
class PairBatch:
    """Bradley-Terry pairs: the chosen and the rejected (prompt, completion) rows of each
    pair, right-padded as `encode_texts` lays them out; every field [B, L]."""

    chosen_tokens: jax.Array
    chosen_mask: jax.Array
    rejected_tokens: jax.Array
    rejected_mask: jax.Array

    def take(self, rows) -> "PairBatch":
        """The pairs `rows` (an index array)."""
        return jax.tree.map(lambda x: x[rows], self)


def make_reward_model_step(policy: Policy, optimizer: optax.GradientTransformation, *,
                           micro_batches: int = 1):
    """jit(params, opt_state, batch) -> (params, opt_state, metrics) on Bradley-Terry pairs.

    batch: a PairBatch.
    """

    def loss_fn(params, batch: PairBatch, num_pairs):
        chosen = sequence_rewards(policy, params, batch.chosen_tokens, batch.chosen_mask)
        rejected = sequence_rewards(policy, params, batch.rejected_tokens, batch.rejected_mask)
        per_pair = bradley_terry_loss(chosen, rejected)
        loss = jnp.sum(per_pair) / num_pairs
        accuracy = jnp.sum((chosen > rejected).astype(jnp.float32)) / num_pairs
        margin = jnp.sum(chosen - rejected) / num_pairs
        return loss, {"loss": loss, "pair_accuracy": accuracy, "margin": margin}

    def step(params, opt_state, batch):
        num_pairs = jnp.asarray(batch.chosen_tokens.shape[0], jnp.float32)
        fn = functools.partial(loss_fn, num_pairs=num_pairs)
        return optimizer_step(fn, optimizer, params, opt_state, batch,
                              micro_batches=micro_batches, streams=policy.batch_streams)

    return jit_update(step)


class RewardModel:
    """A trained scalar-head model that scores (prompt, completion) texts in fixed batches."""

    def __init__(self, policy: Policy, params: Params, tokenizer, *, seq_len: int,
                 prompt_fn: Callable[[Any], str], batch_size: int = 32):
        self.policy, self.params, self.tokenizer = policy, params, tokenizer
        self.seq_len, self.prompt_fn, self.batch_size = seq_len, prompt_fn, batch_size
        self._score = jax.jit(functools.partial(sequence_rewards, policy))

    def score(self, completions: Sequence[str], examples: Sequence[Any]) -> np.ndarray:
        """Rewards [B] float32 of the completions of `examples` (truncated to seq_len)."""
        out = np.zeros(len(completions), np.float32)
        for start in range(0, len(completions), self.batch_size):
            texts = list(completions[start:start + self.batch_size])
            prompts = [self.prompt_fn(ex) for ex in examples[start:start + self.batch_size]]
            real = len(texts)
            texts += [texts[0]] * (self.batch_size - real)  # one compiled shape
            prompts += [prompts[0]] * (self.batch_size - real)
            texts = [self._fit(p, t) for p, t in zip(prompts, texts)]
            tokens, mask = encode_texts(self.tokenizer, prompts, texts, seq_len=self.seq_len)
            scores = self._score(self.params, jnp.asarray(tokens), jnp.asarray(mask))
            out[start:start + real] = np.asarray(scores)[:real]
        return out

    def _fit(self, prompt: str, completion: str) -> str:
        """Drops the completion's tail so BOS + prompt + completion + EOS fits seq_len."""
        room = self.seq_len - 2 - len(self.tokenizer.encode(prompt))
        ids = self.tokenizer.encode(completion)
        return completion if len(ids) <= room else self.tokenizer.decode(ids[:max(room, 0)])

    def reward_fn(self) -> Callable[[str, Any], float]:
        """A reward `(completion, example) -> float`; its `batched` attribute scores a whole
        batch in one call (`grpo_jax.rl.rollout.score_completions` uses it)."""

        def reward(completion, example) -> float:
            return float(self.score([completion], [example])[0])

        reward.batched = self.score
        return reward


def reward_model_dir(workdir: str, source: str) -> str:
    """`source` as a directory: an absolute path, or a stage name inside `workdir`."""
    path = source if os.path.isabs(source) else os.path.join(workdir, source)
    if not os.path.isdir(path):
        raise ValueError(f"reward_model: no reward model at {path!r}; run a stage of kind "
                         "'reward_model' with that name first, or give an absolute directory")
    return path


def load_reward_model(path: str, model_config: ModelConfig, tokenizer, *, seq_len: int,
                      prompt_fn: Callable[[Any], str], batch_size: int = 32) -> RewardModel:
    """The reward model saved in `path` by a "reward_model" stage (the shape of
    `model_config` with a scalar head)."""
    from grpo_jax.checkpoint import Checkpointer

    with Checkpointer(path, max_to_keep=1) as ckpt:
        state, _ = ckpt.restore()
    params = jax.tree.map(jnp.asarray, state["params"])
    return RewardModel(scalar_head_policy(model_config), params, tokenizer, seq_len=seq_len,
                       prompt_fn=prompt_fn, batch_size=batch_size)
