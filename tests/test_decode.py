"""The decode core (`sampling.decode`) and token choice (`sampling.choice`): one loop in the
package, static features, episodes on a mesh, shared-prompt prefill, tool errors, and
budget forcing sharing the queue with the environment's answers."""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, parallel
from grpo_jax.sampling import EpisodeConfig, SamplingConfig, decode, generate_episodes
from grpo_jax.sampling.choice import argmax, filter_and_sample, logp_at
from grpo_jax.text import CharTokenizer
from tests.test_episodes import _parity

TEXTS = ("12+7=", "3*4=", "99-1=", "5/5=")


def _model(seed=3):
    tokenizer = CharTokenizer()
    config = models.named_config("tiny-1m", num_layers=2, vocab_size=tokenizer.vocab_size)
    return tokenizer, models.Transformer(config, rngs=nnx.Rngs(seed))


def _prompts(tokenizer, texts):
    ids = [tokenizer.encode(text) for text in texts]
    width = max(map(len, ids))
    tokens = np.zeros((len(ids), width), np.int32)
    mask = np.zeros((len(ids), width), bool)
    for row, row_ids in enumerate(ids):
        tokens[row, width - len(row_ids):], mask[row, width - len(row_ids):] = row_ids, True
    return tokens, mask


def _stop(model, tokens, mask):
    """A one-token "closing tag" the random model emits at once: its commonest first token."""
    first = model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask))[:, -1].argmax(-1)
    return (int(np.bincount(np.asarray(first)).argmax()),)


class _Environment:
    """Answers with the turn's length; calls an answer an error when the length is odd."""

    def __call__(self, text):
        return f"<{len(text)}>"

    def is_error(self, observation):
        return int(observation[1:-1]) % 2 == 1


def test_the_sampling_package_has_one_loop():
    """decode.run is the package's only while loop: every row at once (budget forcing,
    pauses, cache phases) and rows in slots (continuous batching, single-turn or episodes)
    are its two layouts."""
    package = pathlib.Path(decode.__file__).parent
    loops = {path.name: len(re.findall(r"lax\.while_loop\(", path.read_text()))
             for path in package.glob("*.py")}
    assert {name: n for name, n in loops.items() if n} == {"decode.py": 1}, loops


def test_a_run_without_pauses_or_forcing_carries_no_fields_for_them():
    _, model = _model()
    spec = decode.DecodeSpec(sampling=SamplingConfig(max_new_tokens=8), columns=8)
    s = decode.initial_state(spec, model.init_cache(2, 12), jnp.ones((2,), jnp.int32))
    for name in ("observation", "queue", "queue_pos", "queue_len", "answering", "recent",
                 "thinking", "think_count", "pending", "waiting", "first_wait"):
        assert getattr(s, name) is None, name
    paused = decode.DecodeSpec(sampling=SamplingConfig(max_new_tokens=8), columns=8,
                               stop_ids=(5, 6), answer_width=3)
    s = decode.initial_state(paused, model.init_cache(2, 12), jnp.ones((2,), jnp.int32))
    assert s.queue.shape == (2, 3) and s.recent.shape == (2, 2) and s.thinking is None


def test_choice_functions():
    logits = jax.random.normal(jax.random.key(0), (64, 11)) * 3
    key = jax.random.key(1)
    token, logp = filter_and_sample(logits, key)
    np.testing.assert_array_equal(token, jax.random.categorical(key, logits))
    np.testing.assert_allclose(logp, logp_at(logits, token), rtol=0, atol=0)
    np.testing.assert_array_equal(argmax(logits), jnp.argmax(logits, -1))
    top1, top1_logp = filter_and_sample(logits, key, top_k=1)
    np.testing.assert_array_equal(top1, argmax(logits))
    np.testing.assert_allclose(top1_logp, 0.0, atol=1e-6)
    nucleus, _ = filter_and_sample(logits, key, top_p=1e-6)  # only the most likely token
    np.testing.assert_array_equal(nucleus, argmax(logits))


def test_episodes_on_a_mesh_equal_one_device():
    """Episodes on a model sharded over 4 virtual devices (data 2 x fsdp 2: the rollout
    layout, rows split, weights gathered once) sample the one-device tokens, with shared-
    prompt prefill and a cache that grows in phases; the teacher-forced pass over the
    layout still gives the sampler's log-probs."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices (tests/conftest.py provides 8 virtual CPU devices)")
    tokenizer, model = _model()
    tokens, mask = _prompts(tokenizer, TEXTS)
    tokens, mask = np.repeat(tokens, 2, 0), np.repeat(mask, 2, 0)
    config = EpisodeConfig(max_tokens=40, stop_ids=_stop(model, tokens, mask), max_turns=2,
                           max_observation_tokens=5, max_wait_tokens=1,
                           sampling=SamplingConfig(max_new_tokens=1, temperature=1.0,
                                                   eos_ids=tokenizer.eos_ids, prompt_group=2))
    sample = lambda m: generate_episodes(*nnx.split(m), tokens, mask, jax.random.key(4),
                                         config=config, tokenizer=tokenizer,
                                         observe=_Environment())
    local = sample(model)
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 1}, devices=jax.devices()[:4])
    spread = sample(parallel.shard_model_state(_model()[1], mesh))
    assert np.asarray(local.turns).sum() > 0
    for name in ("tokens", "generated", "observation", "turns", "length", "tool_errors"):
        np.testing.assert_array_equal(np.asarray(getattr(spread, name)),
                                      np.asarray(getattr(local, name)), err_msg=name)
    np.testing.assert_allclose(np.asarray(spread.logp), np.asarray(local.logp), atol=1e-5)
    _parity(model, tokens, mask, local)


def test_tool_errors_are_counted_when_the_environment_answers():
    tokenizer, model = _model()
    tokens, mask = _prompts(tokenizer, TEXTS)
    config = EpisodeConfig(max_tokens=48, stop_ids=_stop(model, tokens, mask), max_turns=3,
                           max_observation_tokens=6,
                           sampling=SamplingConfig(max_new_tokens=1, greedy=True,
                                                   eos_ids=tokenizer.eos_ids, cache_phases=1))
    environment = _Environment()
    out = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0), config=config,
                            tokenizer=tokenizer, observe=environment)
    texts = np.asarray(out.tokens)
    observation = np.asarray(out.observation)
    expected = []
    for row in range(len(TEXTS)):  # every answer is "<n>": split the row's observations
        answers = re.findall(r"<\d+>", tokenizer.decode(texts[row][observation[row]].tolist()))
        expected.append(sum(environment.is_error(a) for a in answers))
    assert np.asarray(out.turns).sum() > 0
    np.testing.assert_array_equal(out.tool_errors, expected)
    plain = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0),
                              config=config, tokenizer=tokenizer,
                              observe=lambda text: environment(text))
    np.testing.assert_array_equal(plain.tokens, out.tokens)
    assert not np.asarray(plain.tool_errors).any()


def test_budget_forcing_and_answers_share_one_queue():
    """In an episode, the end-of-thinking delimiter forced at max_thinking_tokens comes
    after that many policy tokens (answers and holes not counted), is generated and
    forced, and carries the model's log-prob like any generated token."""
    tokenizer, model = _model()
    tokens, mask = _prompts(tokenizer, TEXTS)
    stop = _stop(model, tokens, mask)
    delimiter = tuple(tokenizer.encode("#$"))
    config = EpisodeConfig(max_tokens=48, stop_ids=stop, max_turns=2, max_observation_tokens=5,
                           sampling=SamplingConfig(max_new_tokens=1, greedy=True,
                                                   end_thinking_ids=delimiter,
                                                   max_thinking_tokens=4))
    out = generate_episodes(*nnx.split(model), tokens, mask, jax.random.key(0), config=config,
                            tokenizer=tokenizer, observe=_Environment())
    generated, forced = np.asarray(out.generated), np.asarray(out.forced)
    assert np.asarray(out.turns).sum() > 0
    for row in range(len(TEXTS)):
        policy = np.asarray(out.tokens)[row][generated[row]]
        np.testing.assert_array_equal(policy[4:6], delimiter)
        np.testing.assert_array_equal(np.flatnonzero(forced[row][generated[row]]), [4, 5])
    assert not (forced & ~generated).any()
    _parity(model, tokens, mask, out)
