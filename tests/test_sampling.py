"""Tests for grpo_jax.sampling: agreement with a full forward pass, EOS, top-k, budget forcing."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.models import ModelConfig, Transformer
from grpo_jax.sampling import SamplingConfig, generate, pad_prompts
from grpo_jax.sampling import sampler as sampler_module

CONFIG = ModelConfig(
    vocab_size=29,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_size=48,
    max_seq_len=64,
    qkv_bias=True,
)
N = 6


@pytest.fixture(scope="module")
def setup():
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    # Larger embeddings make the next-token distribution peaked enough to be interesting.
    model.embedding.value = model.embedding.value * 3
    graphdef, state = nnx.split(model)
    prompts, mask = pad_prompts([[1, 2, 3], [4, 5, 6, 7, 8], [9]], 5)
    forward = jax.jit(lambda t, m: nnx.merge(graphdef, state)(t, attention_mask=m))
    return graphdef, state, jnp.asarray(prompts), jnp.asarray(mask), forward


def full_logits(setup, out):
    """Logits for each completion position from a full (uncached) forward pass."""
    _, _, prompts, mask, forward = setup
    tokens = jnp.concatenate([prompts, out.tokens], axis=1)
    full_mask = jnp.concatenate([mask, out.mask], axis=1)
    logits = forward(tokens, full_mask)
    p = prompts.shape[1]
    return logits[:, p - 1 : p - 1 + out.tokens.shape[1]]


def run(setup, key=0, **kwargs):
    graphdef, state, prompts, mask, _ = setup
    return generate(
        graphdef,
        state,
        prompts,
        mask,
        jax.random.key(key),
        config=SamplingConfig(max_new_tokens=N, **kwargs),
    )


def test_greedy_equals_uncached_argmax_and_top_k_one(setup):
    out = run(setup, greedy=True)
    logits = full_logits(setup, out)
    np.testing.assert_array_equal(out.tokens, jnp.argmax(logits, -1))
    expected_logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), out.tokens[..., None], -1)[
        ..., 0
    ]
    np.testing.assert_allclose(out.logp, expected_logp, atol=1e-5)
    assert out.mask.all() and (out.lengths == N).all() and not out.forced.any()
    top1 = run(setup, key=5, top_k=1, temperature=0.7)
    np.testing.assert_array_equal(top1.tokens, out.tokens)
    np.testing.assert_allclose(top1.logp, 0.0, atol=1e-6)  # a point mass after top-1


def test_sampled_logp_under_temperature_and_top_k(setup):
    out = run(setup, key=1, temperature=0.7)
    scaled = full_logits(setup, out) / 0.7
    expected = jnp.take_along_axis(jax.nn.log_softmax(scaled, -1), out.tokens[..., None], -1)
    np.testing.assert_allclose(out.logp, expected[..., 0], atol=1e-4)

    out = run(setup, key=2, temperature=1.3, top_k=4)
    scaled = full_logits(setup, out) / 1.3
    top_values = jax.lax.top_k(scaled, 4)[0]
    chosen = jnp.take_along_axis(scaled, out.tokens[..., None], -1)[..., 0]
    assert bool(jnp.all(chosen >= top_values[..., -1] - 1e-5))  # always inside the top 4
    np.testing.assert_allclose(out.logp, chosen - jax.nn.logsumexp(top_values, -1), atol=1e-4)


def test_top_p_keeps_nucleus(setup):
    out = run(setup, key=3, top_p=0.5)
    probs = jax.nn.softmax(full_logits(setup, out), -1)  # [B, N, V]
    # Token v is in the nucleus iff the mass of strictly more likely tokens is < top_p.
    mass_above = jnp.sum(
        jnp.where(probs[..., None, :] > probs[..., :, None], probs[..., None, :], 0), -1
    )  # [B, N, V]
    nucleus = mass_above < 0.5
    chosen = out.tokens[..., None]
    assert bool(jnp.all(jnp.take_along_axis(nucleus, chosen, -1)))
    expected = jnp.log(jnp.take_along_axis(probs, chosen, -1)[..., 0]) - jnp.log(
        jnp.sum(jnp.where(nucleus, probs, 0), -1)
    )
    np.testing.assert_allclose(out.logp, expected, atol=1e-4)


def test_fixed_key_is_deterministic(setup):
    a, b, c = run(setup, key=7), run(setup, key=7), run(setup, key=8)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logp, b.logp)
    assert not np.array_equal(a.tokens, c.tokens)


def test_a_rows_completion_depends_on_its_id_not_its_place(setup):
    """Row r samples column t with fold_in(fold_in(key, r), t): the rows decoded in the
    reverse order, each keeping its id, write the same tokens and log-probs (what a slot of
    continuous batching needs: a row's sample does not depend on where it runs); with the
    ids of their new places they do not."""
    from grpo_jax.sampling import decode

    graphdef, state, prompts, mask, _ = setup
    config = SamplingConfig(max_new_tokens=N, temperature=1.3)
    spec = decode.DecodeSpec(sampling=config, columns=N)

    @jax.jit
    def sample(prompts, mask, row_ids):
        model = nnx.merge(graphdef, decode.rollout_state(graphdef, state))
        s = decode.prefill(model, prompts, mask, jax.random.key(3), spec, row_ids=row_ids)
        return decode.run(model, s, jax.random.key(3), spec, N)

    ids = jnp.arange(3)
    forward = sample(prompts, mask, ids)
    backward = sample(prompts[::-1], mask[::-1], ids[::-1])
    np.testing.assert_array_equal(backward.tokens[::-1], forward.tokens)
    np.testing.assert_allclose(backward.logp[::-1], forward.logp, rtol=1e-5, atol=1e-6)
    moved = sample(prompts[::-1], mask[::-1], ids)  # ids of their places: other samples
    assert not np.array_equal(moved.tokens[::-1], forward.tokens)


@pytest.mark.parametrize("kwargs", [dict(temperature=1.3, eos_ids=(26, 9)),
                                    dict(greedy=True, eos_ids=(26, 9)),
                                    dict(temperature=0.8, top_k=5, top_p=0.9, eos_ids=(7, 18)),
                                    dict(temperature=1.3, eos_ids=(26, 9), prompt_group=2),
                                    dict(temperature=1.3, eos_ids=(26, 9), end_thinking_ids=(4,),
                                         min_thinking_tokens=3, max_thinking_tokens=6,
                                         continuation_ids=(11, 12))])
def test_continuous_batching_samples_what_every_row_at_once_does(setup, kwargs):
    """Rows sampled 1, 3 or all at a time (`slots`: a slot takes the next row when its row
    ends) write the same tokens, log-probs and masks: a row's sample depends on its key,
    index and the parameters only; with prompt groups too (each group's prompt prefilled
    once, its keys and values copied into the slot a row of the group takes), and with
    budget forcing (a refilled slot starts its row's thinking count and queue afresh)."""
    graphdef, state, _, _, _ = setup
    rows = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3], [7, 1, 2, 5], [6], [8, 8, 8], [5, 9]]
    if kwargs.get("prompt_group", 1) > 1:
        rows = [row for row in rows[:4] for _ in range(kwargs["prompt_group"])]
    prompts, mask = map(jnp.asarray, pad_prompts(rows, 5))
    outputs = {}
    for slots in (0, 1, 3):
        config = SamplingConfig(max_new_tokens=12, slots=slots, cache_phases=1, **kwargs)
        outputs[slots] = generate(graphdef, state, prompts, mask, jax.random.key(5),
                                  config=config)
    reference = outputs[0]
    lengths = np.asarray(reference.lengths)
    assert len(set(lengths.tolist())) >= 2  # rows end at different steps
    for slots in (1, 3):
        out = outputs[slots]
        np.testing.assert_array_equal(out.tokens, reference.tokens, err_msg=str(slots))
        np.testing.assert_array_equal(out.mask, reference.mask, err_msg=str(slots))
        np.testing.assert_array_equal(out.lengths, reference.lengths, err_msg=str(slots))
        np.testing.assert_array_equal(out.forced, reference.forced, err_msg=str(slots))
        np.testing.assert_allclose(out.logp, reference.logp, rtol=1e-5, atol=1e-5)
    if "max_thinking_tokens" in kwargs:  # forcing wrote tokens, in rows that took a slot late
        assert np.asarray(reference.forced)[3:].any()


def test_continuous_batching_grows_its_cache_in_phases(setup):
    """Slots with a cache that grows in phases (16, 32, 40 columns: a run stops when a
    slot's row reaches the phase's last column) sample what every row at once does with the
    whole cache, rows refilled after a growth included."""
    graphdef, state, _, _, _ = setup
    rows = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3], [7, 1, 2, 5], [6], [8, 8, 8], [5, 9]]
    prompts, mask = map(jnp.asarray, pad_prompts(rows, 5))
    common = dict(max_new_tokens=40, temperature=1.3, eos_ids=(26, 9, 14))
    reference = generate(graphdef, state, prompts, mask, jax.random.key(2),
                         config=SamplingConfig(**common, cache_phases=1))
    lengths = np.asarray(reference.lengths)
    assert lengths.max() > 16 and lengths.min() < 16  # a row crosses a phase, another not
    for slots in (2, 3):
        out = generate(graphdef, state, prompts, mask, jax.random.key(2),
                       config=SamplingConfig(**common, cache_phases=3, slots=slots))
        np.testing.assert_array_equal(out.tokens, reference.tokens, err_msg=str(slots))
        np.testing.assert_array_equal(out.mask, reference.mask, err_msg=str(slots))
        np.testing.assert_allclose(out.logp, reference.logp, rtol=1e-5, atol=1e-5)


def test_eos_rows_stop_and_are_masked(setup):
    greedy = run(setup, greedy=True)
    eos = int(greedy.tokens[0, 2])
    out = run(setup, greedy=True, eos_ids=(eos, 28), pad_id=0)
    for row in range(3):
        row_tokens = np.asarray(greedy.tokens[row])
        hits = np.flatnonzero(np.isin(row_tokens, [eos, 28]))
        length = int(hits[0]) + 1 if hits.size else N
        assert int(out.lengths[row]) == length
        np.testing.assert_array_equal(out.tokens[row, :length], row_tokens[:length])
        np.testing.assert_array_equal(out.tokens[row, length:], 0)
        np.testing.assert_array_equal(out.mask[row], np.arange(N) < length)
        np.testing.assert_array_equal(out.logp[row, length:], 0.0)
    assert int(out.lengths[0]) <= 3


def test_one_compile_per_shape(setup, monkeypatch):
    graphdef, state, prompts, mask, _ = setup
    traced = jax.jit(
        chex.assert_max_traces(sampler_module._generate_core, n=1),
        static_argnames=("graphdef", "config"),
    )
    monkeypatch.setattr(sampler_module, "_generate_jit", traced)
    config = SamplingConfig(max_new_tokens=4, top_k=3)
    for seed in range(3):
        generate(graphdef, state, (prompts + seed) % 29, mask, jax.random.key(seed), config=config)
    _, state_again = nnx.split(nnx.merge(graphdef, state))
    generate(graphdef, state_again, prompts, mask, jax.random.key(9), config=config)
    with pytest.raises(AssertionError):  # a new batch size is a new shape: a second trace
        generate(graphdef, state, prompts[:2], mask[:2], jax.random.key(0), config=config)


def test_phase_ends():
    ends = lambda n, phases=4: SamplingConfig(max_new_tokens=n, cache_phases=phases).phase_ends
    assert ends(64) == (16, 32, 48, 64)
    assert ends(1024) == (256, 512, 768, 1024)
    assert ends(40) == (16, 32, 40)  # phases are at least 16 new tokens
    assert ends(10) == (10,)
    assert ends(64, phases=1) == (64,)
    assert ends(64, phases=3) == (22, 44, 64)
    with pytest.raises(ValueError, match="cache_phases"):
        SamplingConfig(max_new_tokens=8, cache_phases=0)


def test_growing_cache_matches_full_forward_and_one_allocation(setup):
    """40 new tokens run as phases of 16/16/8 over a cache grown twice: the same tokens as one
    phase over the whole cache, and the full forward pass agrees at every position."""
    graphdef, state, prompts, mask, _ = setup
    sample = lambda key, **kw: generate(
        graphdef,
        state,
        prompts,
        mask,
        jax.random.key(key),
        config=SamplingConfig(max_new_tokens=40, **kw),
    )
    greedy = sample(0, greedy=True)
    np.testing.assert_array_equal(greedy.tokens, jnp.argmax(full_logits(setup, greedy), -1))
    one = sample(0, greedy=True, cache_phases=1)
    np.testing.assert_array_equal(greedy.tokens, one.tokens)
    np.testing.assert_allclose(greedy.logp, one.logp, atol=1e-6)

    hot = sample(4, temperature=1.5)
    hot_one = sample(4, temperature=1.5, cache_phases=1)
    np.testing.assert_array_equal(hot.tokens, hot_one.tokens)
    expected = jnp.take_along_axis(
        jax.nn.log_softmax(full_logits(setup, hot) / 1.5, -1), hot.tokens[..., None], -1
    )[..., 0]
    np.testing.assert_allclose(hot.logp, expected, atol=1e-4)

    # Rows that end in different phases: EOS = the tokens greedy decoding emits at 3 and 20.
    eos = (int(greedy.tokens[0, 3]), int(greedy.tokens[1, 20]))
    ended = sample(0, greedy=True, eos_ids=eos)
    for row in range(3):
        hits = np.flatnonzero(np.isin(np.asarray(greedy.tokens[row]), eos))
        length = int(hits[0]) + 1 if hits.size else 40
        assert int(ended.lengths[row]) == length
        np.testing.assert_array_equal(ended.tokens[row, :length], greedy.tokens[row, :length])


def test_cache_grow_keeps_contents(setup):
    graphdef, state, prompts, mask, _ = setup
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(3, 8)
    _, cache = model.decode(prompts, jnp.zeros_like(prompts), mask, cache)
    grown = cache.grow(12)
    assert grown.size == 12 and int(grown.index) == int(cache.index) == 5
    pairs = [(s, b, 2) for s, b in zip(cache.keys, grown.keys)]  # keys [Z, H, S]
    pairs += [(s, b, 1) for s, b in zip(cache.values, grown.values)]  # values [Z, S, H]
    for small, big, axis in pairs:
        assert big.shape[axis] == 12
        np.testing.assert_array_equal(jax.lax.slice_in_dim(big, 0, 8, axis=axis), small)
        assert not np.any(jax.lax.slice_in_dim(big, 8, 12, axis=axis))
    np.testing.assert_array_equal(grown.key_valid[:, :8], cache.key_valid)
    assert not grown.key_valid[:, 8:].any()
    np.testing.assert_array_equal(grown.rope[0][:8], cache.rope[0])
    np.testing.assert_array_equal(grown.rope[1][:8], cache.rope[1])
    with pytest.raises(ValueError, match="smaller than the cache"):
        cache.grow(4)


def test_bad_input_errors(setup):
    graphdef, state, prompts, mask, _ = setup
    with pytest.raises(ValueError, match="prompt row 1 has 6 tokens, longer than the bucket of 5"):
        pad_prompts([[1], [1, 2, 3, 4, 5, 6]], 5)
    config = SamplingConfig(max_new_tokens=2)
    with pytest.raises(ValueError, match="row 0 is not left-padded"):
        generate(
            graphdef, state, prompts, mask.at[0, 4].set(False), jax.random.key(0), config=config
        )
    with pytest.raises(ValueError, match="row 2 is empty"):
        generate(graphdef, state, prompts, mask.at[2].set(False), jax.random.key(0), config=config)
    with pytest.raises(ValueError, match="prompt_mask shape"):
        generate(graphdef, state, prompts, mask[:, 1:], jax.random.key(0), config=config)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(max_new_tokens=2, top_p=0.0)
    with pytest.raises(ValueError, match="end_thinking_ids"):
        SamplingConfig(max_new_tokens=2, min_thinking_tokens=3)


def test_budget_forcing(setup):
    greedy = run(setup, greedy=True)
    first = np.asarray(greedy.tokens[:, 0])
    # 1) A premature end-of-thinking is replaced by the continuation (s1 "Wait").
    end = int(first[0])
    out = run(
        setup,
        greedy=True,
        end_thinking_ids=(end,),
        min_thinking_tokens=2,
        continuation_ids=(26, 27),
    )
    np.testing.assert_array_equal(out.tokens[0, :2], [26, 27])
    np.testing.assert_array_equal(out.forced[0, :2], [True, True])
    for row in np.flatnonzero(first != end):  # rows that did not try to end keep greedy token 0
        assert int(out.tokens[row, 0]) == int(first[row]) and not bool(out.forced[row, 0])

    # 2) Without a continuation the delimiter (and EOS) are masked out before the minimum.
    out = run(setup, greedy=True, end_thinking_ids=(end,), eos_ids=(28,), min_thinking_tokens=N)
    assert not np.isin(np.asarray(out.tokens), [end, 28]).any()
    logits0 = full_logits(setup, out)[:, 0]
    np.testing.assert_array_equal(
        out.tokens[:, 0], jnp.argmax(logits0.at[:, end].set(-jnp.inf).at[:, 28].set(-jnp.inf), -1)
    )
    assert not out.forced.any()

    # 3) At the maximum the (two-token) delimiter is forced, once.
    out = run(setup, greedy=True, end_thinking_ids=(25, 24), max_thinking_tokens=3)
    np.testing.assert_array_equal(out.tokens[:, 3:5], [[25, 24]] * 3)
    np.testing.assert_array_equal(
        out.forced, np.tile(np.arange(N) == 3, (3, 1)) | np.tile(np.arange(N) == 4, (3, 1))
    )
    # Forced tokens carry the model's log-probability (finite, negative).
    assert bool(jnp.all(jnp.isfinite(out.logp))) and bool(jnp.all(out.logp[:, 3:5] < 0))


def test_sharded_state_samples_like_unsharded(setup):
    """Greedy and sampled completions with the state on a (data, fsdp, tensor) = (2, 2, 2)
    mesh (q/k/v and MLP kernels split over `tensor`) equal the single-device ones."""
    from grpo_jax.parallel import DEFAULT_RULES, make_mesh, shard_model_state

    graphdef, state, prompts, mask, _ = setup
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py provides 8 virtual CPU devices)")
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = shard_model_state(state, mesh, DEFAULT_RULES)
    for config in (SamplingConfig(max_new_tokens=N, greedy=True, eos_ids=(0,), pad_id=0),
                   SamplingConfig(max_new_tokens=N, temperature=1.0, eos_ids=(0,), pad_id=0)):
        key = jax.random.key(3)
        local = generate(graphdef, state, prompts, mask, key, config=config)
        spread = generate(graphdef, sharded, prompts, mask, key, config=config)
        np.testing.assert_array_equal(np.asarray(spread.tokens), np.asarray(local.tokens))
        np.testing.assert_array_equal(np.asarray(spread.mask), np.asarray(local.mask))
        np.testing.assert_allclose(np.asarray(spread.logp), np.asarray(local.logp),
                                   rtol=1e-4, atol=1e-5)


def test_prompt_group_prefills_once_and_samples_the_same(setup):
    """Rows in groups of 4 sharing a prompt: prefilling once per group and broadcasting the
    cache gives the same tokens (same key) and log-probs as prefilling every row; with more
    than one cache phase, so the broadcast cache also grows."""
    graphdef, state, prompts, mask, _ = setup
    rows, grouped = jnp.repeat(prompts, 4, 0), jnp.repeat(mask, 4, 0)
    outs = [generate(graphdef, state, rows, grouped, jax.random.key(3),
                     config=SamplingConfig(max_new_tokens=20, cache_phases=2, prompt_group=g))
            for g in (1, 4)]
    np.testing.assert_array_equal(outs[1].tokens, outs[0].tokens)
    np.testing.assert_array_equal(outs[1].mask, outs[0].mask)
    np.testing.assert_allclose(outs[1].logp, outs[0].logp, atol=1e-5)
    # the rows of a group sample different completions from the one prefill
    assert len({tuple(r) for r in np.asarray(outs[1].tokens[:4])}) > 1
    config = SamplingConfig(max_new_tokens=2, prompt_group=4)
    with pytest.raises(ValueError, match="prompt_group 4 does not divide the batch of 3"):
        generate(graphdef, state, prompts, mask, jax.random.key(0), config=config)
    with pytest.raises(ValueError, match=r"rows 4\.\.7 should share one prompt but their "
                                         r"prompt tokens differ"):
        generate(graphdef, state, rows.at[5, 4].set(0), grouped, jax.random.key(0),
                 config=config)
    with pytest.raises(ValueError, match="prompt_group must be an int >= 1"):
        SamplingConfig(max_new_tokens=2, prompt_group=0)
