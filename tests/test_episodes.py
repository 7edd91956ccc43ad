"""Multi-turn episodes: KV-cache continuation equals a full teacher-forced pass over the
episode, observations land where the environment put them, and carry no loss."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models
from grpo_jax.sampling import SamplingConfig
from grpo_jax.sampling.episodes import (EpisodeConfig, episode_rows, episode_texts,
                                        generate_episodes, turn_texts)
from grpo_jax.text import CharTokenizer


@pytest.fixture(scope="module")
def episodes():
    tokenizer = CharTokenizer()
    config = models.named_config("tiny-1m", num_layers=2, vocab_size=tokenizer.vocab_size)
    model = models.Transformer(config, rngs=nnx.Rngs(3))
    prompts = [tokenizer.encode(text) for text in ("12+7=", "3*4=", "99-1=", "5/5=") * 2]
    width = max(map(len, prompts))
    tokens = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros((len(prompts), width), bool)
    for row, ids in enumerate(prompts):
        tokens[row, width - len(ids):], mask[row, width - len(ids):] = ids, True
    # A one-token "closing tag" the random model emits at once: its greedy first token.
    first = model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask))[:, -1].argmax(-1)
    stop = [int(np.bincount(np.asarray(first)).argmax())]
    seen = []

    def observe(text):
        seen.append(text)
        return f"<{len(text)}>"

    episode = EpisodeConfig(max_tokens=96, stop_ids=tuple(stop), max_turns=3,
                            max_observation_tokens=6,
                            sampling=SamplingConfig(max_new_tokens=1, greedy=True,
                                                    eos_ids=tokenizer.eos_ids))
    out = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0),
                            config=episode, tokenizer=tokenizer, observe=observe)
    # No turns allowed: every episode ends at its first call, with no answer appended.
    capped = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0),
                               config=dataclasses.replace(episode, max_turns=0),
                               tokenizer=tokenizer, observe=observe)
    return model, tokenizer, tokens, mask, out, seen, stop, capped


def _parity(model, tokens, mask, out):
    """The teacher-forced log-probs of the episodes' layout, next to the sampler's."""
    rows, attention, loss_mask = episode_rows(tokens, mask, out)
    full = models.completion_logprobs(model, jnp.asarray(rows), jnp.asarray(attention),
                                      tokens.shape[1])["logp"]
    sampled = np.asarray(out.logp)[:, :loss_mask.shape[1]]
    np.testing.assert_allclose(np.where(loss_mask, full, 0.0), np.where(loss_mask, sampled, 0),
                               atol=2e-5)
    assert np.all(np.asarray(full)[loss_mask] != 0)  # every generated token has a context


def test_answers_are_written_beside_rows_still_generating(episodes):
    """With max_wait_tokens 0 the environment answers a row as soon as it closes its call,
    and its answer is written while the other rows go on generating; no generated token
    ever follows a hole, and the layout reproduces the sampler's log-probs exactly.
    (Sampled at temperature 1, so that rows close their calls at different slots.)"""
    model, tokenizer, tokens, mask, _, _, stop, _ = episodes
    episode = EpisodeConfig(max_tokens=96, stop_ids=tuple(stop), max_turns=3,
                            max_observation_tokens=6, max_wait_tokens=0,
                            sampling=SamplingConfig(max_new_tokens=1, temperature=1.0,
                                                    eos_ids=tokenizer.eos_ids))
    out = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0),
                            config=episode, tokenizer=tokenizer,
                            observe=lambda text: f"<{len(text)}>")
    _parity(model, tokens, mask, out)
    generated, observation = np.asarray(out.generated), np.asarray(out.observation)
    attended = generated | observation
    assert np.asarray(out.turns).sum() > 0
    # At some slot one row writes an answer while another generates.
    assert np.any(observation.any(0) & generated.any(0))
    assert not np.any(generated[:, 1:] & ~attended[:, :-1]), "a generated token after a hole"
    # Every answer is whole: "<" + the turn's length + ">" in consecutive slots.
    for row in np.flatnonzero(np.asarray(out.turns)):
        text = tokenizer.decode(np.asarray(out.tokens)[row][observation[row]].tolist())
        assert text.startswith("<") and text.endswith(">")


def test_episodes_take_turns_and_observations_carry_no_loss(episodes):
    _, tokenizer, _, _, out, seen, stop, capped = episodes
    turns = np.asarray(out.turns)
    assert turns.sum() >= 3 and turns.max() <= 3, turns  # calls happened, capped at 3
    generated, observation = np.asarray(out.generated), np.asarray(out.observation)
    assert not (generated & observation).any()
    assert observation.sum() > 0 and generated.sum() > observation.sum()
    # What the environment was given ends with the stop sequence (the call's closing tag).
    assert seen and all(text.endswith(tokenizer.decode(stop)) for text in seen)
    # Each observation is the environment's answer, and it is what the next turn follows.
    tokens = np.asarray(out.tokens)
    for row in np.flatnonzero(turns):
        slots = np.flatnonzero(observation[row])
        first = tokenizer.decode(tokens[row, slots].tolist())
        assert first.startswith("<") and ">" in first
        after = slots[-1] + 1  # the next generated token sits right after the answer
        assert generated[row, after], (row, slots)
    assert not np.asarray(capped.turns).any() and not np.asarray(capped.observation).any()
    for text in episode_texts(capped, tokenizer):
        assert text.endswith(tokenizer.decode(stop))
    texts = episode_texts(out, tokenizer)
    assert all(isinstance(t, str) for t in texts)
    assert turn_texts(tokens, generated, observation, tokenizer)


def test_cache_continuation_equals_a_full_teacher_forced_pass(episodes):
    """The sampler never re-reads the history (prefill once, each token decoded once, each
    answer decoded as one chunk), yet its log-probs of the generated tokens are those of
    one teacher-forced pass over [prompt | slots] with holes and answers masked as the
    layout says; observation tokens get no gradient (they are outside the loss mask)."""
    model, _, tokens, mask, out, _, _, _ = episodes
    _parity(model, tokens, mask, out)
    rows, attention, loss_mask = episode_rows(tokens, mask, out)
    prompt_len = tokens.shape[1]

    def loss(model):
        logp = models.completion_logprobs(model, jnp.asarray(rows), jnp.asarray(attention),
                                          prompt_len)["logp"]
        return jnp.sum(jnp.where(jnp.asarray(loss_mask), logp, 0.0))

    # The gradient with respect to the observation tokens' own log-probs is zero: perturbing
    # only an observation's target logit leaves the loss unchanged.
    grads = nnx.grad(loss)(model)
    assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(nnx.to_pure_dict(grads)))


class _Counter:
    """A stateful environment: answers a turn with its length and the turn number, rewards
    each turn by its length parity, and ends an episode after its third call."""

    stop_text = ""

    def step(self, state, text):
        state = (state or 0) + 1
        return f"<{len(text)}.{state}>", float(len(text) % 2), state >= 3, state


def test_episodes_in_slots_sample_what_any_other_slot_count_does(episodes):
    """Continuous batching over episodes (`sampling.slots` S < rows: a slot whose episode
    ended takes the next row; a slot whose row waits for the environment keeps it and
    writes nothing): with 1, 3 and 5 slots every row gets the same tokens, log-probs,
    observations, turns and turn rewards, since a row's columns depend on its own key,
    index, parameters and answers only. The layout has no holes, and teacher-forcing it
    reproduces the sampler's log-probs."""
    model, tokenizer, tokens, mask, _, _, stop, _ = episodes
    outs = {}
    for slots in (1, 3, 5):
        episode = EpisodeConfig(max_tokens=64, stop_ids=tuple(stop), max_turns=3,
                                max_observation_tokens=6, max_wait_tokens=1,
                                sampling=SamplingConfig(max_new_tokens=1, temperature=1.0,
                                                        eos_ids=tokenizer.eos_ids,
                                                        slots=slots))
        outs[slots] = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(4),
                                        config=episode, tokenizer=tokenizer, observe=_Counter())
    reference = outs[1]
    turns = np.asarray(reference.turns)
    assert turns.sum() > 0 and len(set(turns.tolist())) >= 2  # rows differ in turns
    assert np.asarray(reference.ended_by_environment).any()
    for slots in (3, 5):
        out = outs[slots]
        for name in ("tokens", "generated", "observation", "turns", "turn_rewards",
                     "ended_by_environment", "length"):
            np.testing.assert_array_equal(getattr(out, name), getattr(reference, name),
                                          err_msg=f"{name}, {slots} slots")
        np.testing.assert_allclose(out.logp, reference.logp, rtol=1e-5, atol=1e-5)
    generated, observation = np.asarray(reference.generated), np.asarray(reference.observation)
    attended = generated | observation
    # no holes: each row's written columns are a prefix
    lengths = attended.sum(1)
    assert all(attended[r, :lengths[r]].all() for r in range(len(lengths)))
    assert int(reference.length) == lengths.max()
    _parity(model, tokens, mask, reference)
