"""Token choice from logits: argmax, Gumbel-max sampling, top-k / top-p filtering, log-probs.

Every function takes logits [B, V] float32 (one row per sequence) and is jit-friendly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def argmax(x: jax.Array) -> jax.Array:
    """First index of the maximum along the last axis, as jnp.argmax.

    max then min-of-matching-index: two plain reductions, which XLA:CPU runs far faster than
    the variadic (value, index) reduction jnp.argmax lowers to. A row with no maximum (all
    NaN) gives V - 1, never an id outside the vocabulary (its log-prob is NaN, which
    `rl.rollout` reports as an error).

    Args:
      x: [B, V].

    Returns:
      [B] int32.
    """
    top = jnp.max(x, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.minimum(jnp.min(jnp.where(x == top, iota, x.shape[-1]), axis=-1),
                       x.shape[-1] - 1)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """A sample of softmax(logits) per row by Gumbel-max: argmax(logits + G), G ~ Gumbel(0, 1).

    With one key the noise is what jax.random.categorical draws for that key (the same
    samples); with a key per row ([B] keys) each row's noise comes from its own key, so a
    row's sample does not depend on the other rows of the batch.

    Args:
      key: a PRNG key, or [B] keys (one per row).
      logits: [B, V] float32 unnormalised log-probabilities.

    Returns:
      [B] int32.
    """
    if key.ndim == 0:
        noise = jax.random.gumbel(key, logits.shape, logits.dtype)
    else:
        noise = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[1:], logits.dtype))(key)
    return argmax(logits + noise)


def row_keys(key: jax.Array, rows: jax.Array, columns: jax.Array) -> jax.Array:
    """[B] keys fold_in(fold_in(key, row), column): the key of each row's column, so that a
    row's sample depends on its id and column, not on where in a batch it runs. With one
    key per row id ([R] keys), the key of row r's column is fold_in(key[r], column) (an id
    past the last, a free slot's, takes the last key).

    Args:
      key: the run's PRNG key, or [R] keys, one per row id.
      rows: [B] int, each row's id.
      columns: [B] int, or [] (one column for every row).
    """
    columns = jnp.broadcast_to(jnp.asarray(columns, jnp.int32), rows.shape)
    if is_key_per_row(key):
        own = key[jnp.minimum(rows, key.shape[0] - 1)]
        return jax.vmap(jax.random.fold_in)(own, columns)
    return jax.vmap(lambda r, c: jax.random.fold_in(jax.random.fold_in(key, r), c))(rows,
                                                                                  columns)


def is_key_per_row(key: jax.Array) -> bool:
    """Whether `key` is [R] keys (typed, or [R, 2] raw uint32 ones) rather than one key."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    return key.ndim == (1 if typed else 2)


def logp_at(logits: jax.Array, token: jax.Array) -> jax.Array:
    """log softmax(logits)[token] = logits[token] - logsumexp(logits).

    Args:
      logits: [B, V] float32.
      token: [B] int.

    Returns:
      [B] float32.
    """
    picked = jnp.take_along_axis(logits, token[:, None], -1)[:, 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def filter_and_sample(logits: jax.Array, key: jax.Array, *, top_k: int = 0,
                      top_p: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """One sample per row after top-k and top-p filtering.

    Args:
      logits: [B, V] float32, already temperature-scaled, forbidden tokens at -inf.
      key: a PRNG key, or [B] keys (one per row: `categorical`).
      top_k: keep the k most likely tokens; 0 keeps all (static).
      top_p: keep the smallest set of most likely tokens with mass >= top_p; 1.0 keeps all
        (static).

    Returns:
      (token [B] int32, logp [B] float32 under the filtered distribution).
    """
    vocab = logits.shape[-1]
    k = top_k if top_k > 0 else (vocab if top_p < 1.0 else 0)
    if k == 0:
        token = categorical(key, logits)
        return token, logp_at(logits, token)
    values, indices = jax.lax.top_k(logits, min(k, vocab))
    if top_p < 1.0:
        probs = jax.nn.softmax(values, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        values = jnp.where(mass_before < top_p, values, -jnp.inf)
    choice = categorical(key, values)
    logp = logp_at(values, choice)
    token = jnp.take_along_axis(indices, choice[:, None], -1)[:, 0]
    return token.astype(jnp.int32), logp
