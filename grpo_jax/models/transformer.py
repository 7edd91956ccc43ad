"""Flax NNX decoder-only transformer of the Qwen2 / Llama family, with a KV cache."""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.models.config import ATTENTION_IMPLEMENTATIONS, ModelConfig

_MASKED = -1e30  # finite, so a row with every key masked gives a uniform softmax, not NaN.


def _param(rngs: nnx.Rngs, init, shape, dtype, names: tuple[str | None, ...]) -> nnx.Param:
    """A parameter carrying logical axis names (mapped to mesh axes by grpo_jax.parallel)."""
    return nnx.Param(init(rngs.params(), shape, dtype), sharding_names=names, eager_sharding=False)


def rope_inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """Rotary inverse frequencies inv_freq_i = theta^(-2i/H), with optional Llama-3 scaling.

    RoFormer, https://arxiv.org/abs/2104.09864; Llama 3 scaling, https://arxiv.org/abs/2407.21783.

    Returns:
      float64 numpy array [H/2].
    """
    h = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, h, 2, dtype=np.float64) / h))
    if config.rope_scaling is not None:
        factor, low, high, original = config.rope_scaling
        wavelen = 2 * math.pi / inv_freq
        low_wavelen, high_wavelen = original / low, original / high
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled)
    return inv_freq


def rope_tables(positions: jax.Array, inv_freq) -> tuple[jax.Array, jax.Array]:
    """cos(p w) and sin(p w) for every position, shared by all heads and layers.

    Args:
      positions: [B, T] int.
      inv_freq: [H/2].

    Returns:
      (cos, sin), each [B, T, 1, H] float32 (halves repeated, Hugging Face layout).
    """
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x * cos + rotate_half(x) * sin for x [B, T, heads, H] and tables from `rope_tables`."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def rope_table(size: int, inv_freq) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) [size, H] for positions 0..size-1."""
    cos, sin = rope_tables(jnp.arange(size)[None], inv_freq)
    return cos[0, :, 0], sin[0, :, 0]


def gather_rope(table: tuple[jax.Array, jax.Array], positions: jax.Array):
    """(cos, sin) [B, T, 1, H] for positions [B, T] < size, read from a `rope_table`.

    Gathering from a table computed once keeps XLA from fusing cos/sin of [B, T, H] into every
    layer's rotation, where they are recomputed per head and per layer.
    """
    return tuple(jnp.take(t, positions, axis=0, mode="clip")[:, :, None, :] for t in table)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotates halves: x * cos(p w) + rotate_half(x) * sin(p w) (Hugging Face layout).

    Args:
      x: [B, T, heads, H].
      positions: [B, T] int.
      inv_freq: [H/2].

    Returns:
      [B, T, heads, H] in x.dtype.
    """
    return rotate(x, *rope_tables(positions, inv_freq))


@flax.struct.dataclass
class KVCache:
    """Per-layer key/value buffers of fixed size S, written in place at `index`.

    Rows are (batch row, KV head) pairs, row b*K + k, so both attention products of a decode
    step are plain batched matmuls reading the buffers as stored: keys are kept transposed,
    [H, S] per row, so q k^T is [Q, H] x [H, S] (with keys as [S, H] XLA:CPU re-packs the
    whole key buffer for the transposed product every step).

    Attributes:
      keys: tuple over layers of [B*K, H, S].
      values: tuple over layers of [B*K, S, H].
      key_valid: [B, S] bool, True for slots holding a real (non-pad) token.
      index: [] int32, the next slot to write; or [B] int32, each row's own next slot
        (continuous batching: rows at different columns; one token per `decode` call).
      rope: (cos, sin) [S, H] float32 `rope_table` for positions 0..S-1 (a position never
        exceeds its slot), computed outside the decode loop (see `gather_rope`).
      inv_freq: [H/2] float32, to extend the table when the cache grows.
    """

    keys: tuple
    values: tuple
    key_valid: jax.Array
    index: jax.Array
    rope: tuple
    inv_freq: jax.Array

    @classmethod
    def init(cls, config: ModelConfig, batch_size: int, size: int) -> KVCache:
        rows = batch_size * config.num_kv_heads
        zeros = lambda *shape: jnp.zeros(shape, config.compute_dtype)
        inv_freq = jnp.asarray(rope_inverse_frequencies(config), jnp.float32)
        return cls(
            keys=tuple(zeros(rows, config.head_dim, size) for _ in range(config.num_layers)),
            values=tuple(zeros(rows, size, config.head_dim) for _ in range(config.num_layers)),
            key_valid=jnp.zeros((batch_size, size), bool),
            index=jnp.zeros((), jnp.int32),
            rope=rope_table(size, inv_freq),
            inv_freq=inv_freq,
        )

    @property
    def size(self) -> int:
        return self.key_valid.shape[1]

    def grow(self, size: int) -> KVCache:
        """The same cache with room for `size` slots (new slots empty and invalid)."""
        extra = size - self.size
        if extra < 0:
            raise ValueError(f"KVCache.grow: size {size} is smaller than the cache ({self.size})")
        pad = lambda x, axis: jnp.pad(x, [(0, extra if a == axis else 0) for a in range(x.ndim)])
        return self.replace(
            keys=tuple(pad(k, 2) for k in self.keys),
            values=tuple(pad(v, 1) for v in self.values),
            key_valid=pad(self.key_valid, 1),
            rope=rope_table(size, self.inv_freq),
        )


def attention_implementation(name: str, dtype) -> str:
    """The attention implementation `attend` uses for ModelConfig.attention (name) and the
    compute dtype: "auto" is "cudnn" (fused flash attention) on a GPU in a 16-bit dtype,
    "einsum" otherwise; other names are taken as they are."""
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention: expected one of {ATTENTION_IMPLEMENTATIONS}, got {name!r}")
    if name != "auto":
        return name
    half = jnp.dtype(dtype).itemsize == 2
    return "cudnn" if half and jax.default_backend() == "gpu" else "einsum"


def attend(q, k, v, query_slots, key_valid, segment_ids=None, implementation="einsum"):
    """Grouped-query softmax(q k^T / sqrt(H) + mask) v with causal and padding masks.

    Args:
      q: [B, T, N, H] queries.
      k: [B, S, K, H] keys; v: [B, S, K, H] values.
      query_slots: [T] int, the key slot each query sits at (causal: key slot <= query slot).
      key_valid: [B, S] bool.
      segment_ids: optional [B, T] int (T == S) of packed rows: a query attends only to keys
        of its own segment.
      implementation: "einsum" (float32 scores [B, K, G, T, S] from one einsum), or "xla" /
        "cudnn", `jax.nn.dot_product_attention` with that implementation (cuDNN's fused
        attention needs a GPU and 16-bit q, k, v). With the latter a query whose keys are
        all masked (a padding position) attends to its own slot instead of uniformly to all;
        every other query gets the same result.

    Returns:
      [B, T, N, H] in v.dtype.
    """
    b, t, n, h = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    mask = (jnp.arange(s)[None, :] <= query_slots[:, None])[None] & key_valid[:, None, :]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    if implementation in ("xla", "cudnn"):
        # Every query row keeps one key (a fused kernel may give NaN for an all-masked row).
        mask = mask | (jnp.arange(s)[None, :] == query_slots[:, None])[None]
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=h**-0.5,
                                            implementation=implementation)
    if implementation != "einsum":
        raise ValueError(f"attend: unknown implementation {implementation!r}")
    q = q.reshape(b, t, kv_heads, n // kv_heads, h)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", q, k, preferred_element_type=jnp.float32)
    scores = scores * (h**-0.5)
    scores = jnp.where(mask[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v)
    return out.reshape(b, t, n, h)


def attend_cached(q, cache_k, cache_v, query_slots, key_valid):
    """Grouped-query softmax(q k^T / sqrt(H) + mask) v over a `KVCache` layer.

    Same numerics as `attend`. With (batch, KV head) merged into one leading dim both products
    are plain batched matmuls [Q, H] x [H, S] and [Q, S] x [S, H] (Q = T*G queries per KV head),
    with no transpose or reshape of the cache (a reshape of the freshly updated cache makes
    XLA:CPU duplicate the update and copy the loop-carried buffer).

    Args:
      q: [B, T, N, H] queries.
      cache_k: [B*K, H, S] keys; cache_v: [B*K, S, H] values (row b*K + k).
      query_slots: [T] int, the key slot each query sits at (causal: key slot <= query
        slot), or [B, T] (each row's own slots).
      key_valid: [B, S] bool.

    Returns:
      [B, T, N, H] in cache_v.dtype.
    """
    b, t, n, h = q.shape
    s = cache_k.shape[2]
    if query_slots.ndim == 1:
        causal = (jnp.arange(s)[None, :] <= query_slots[:, None])[None]  # [1, T, S]
    else:
        causal = jnp.arange(s)[None, None, :] <= query_slots[:, :, None]  # [B, T, S]
    kv_heads = cache_k.shape[0] // b
    groups = n // kv_heads
    q = q.reshape(b, t, kv_heads, groups, h).transpose(0, 2, 1, 3, 4).reshape(-1, t * groups, h)
    scores = jnp.einsum("ZQH,ZHS->ZQS", q, cache_k, preferred_element_type=jnp.float32)
    scores = scores * (h**-0.5)
    mask = causal & key_valid[:, None, :]
    mask = jnp.repeat(jnp.repeat(mask, groups, axis=1), kv_heads, axis=0)  # [B*K, T*G, S]
    scores = jnp.where(mask, scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(cache_v.dtype)
    out = jnp.einsum("ZQS,ZSH->ZQH", probs, cache_v)
    return out.reshape(b, kv_heads, t, groups, h).transpose(0, 2, 1, 3, 4).reshape(b, t, n, h)


def dense(x, kernel, preferred_element_type=None):
    """x [..., D] @ kernel [D, F] as one 2-D matmul over the flattened leading dims.

    The reshapes are free. Written as a matmul of 3-D activations, the weight gradient
    contracts over (batch, length), and XLA:CPU transposes the activation gradient into a
    copy for it (about a quarter of a training step at hidden 128); in 2-D it does not.
    """
    y = jnp.dot(x.reshape(-1, x.shape[-1]), kernel, preferred_element_type=preferred_element_type)
    return y.reshape(*x.shape[:-1], kernel.shape[-1])


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * scale, computed in float32."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.eps = config.rms_norm_eps
        self.dtype = config.compute_dtype
        self.scale = _param(
            rngs, nnx.initializers.ones, (config.hidden_size,), config.parameter_dtype, ("norm",)
        )

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * self.scale.value.astype(jnp.float32)).astype(self.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary positions and optional q/k/v bias."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, n, k, h = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        pdt = config.parameter_dtype
        init = nnx.initializers.normal(0.02)
        out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * config.num_layers))
        self.dtype = config.compute_dtype
        self.implementation = attention_implementation(config.attention, config.compute_dtype)
        self.q_kernel = _param(rngs, init, (d, n, h), pdt, ("embed", "heads", "head_dim"))
        self.k_kernel = _param(rngs, init, (d, k, h), pdt, ("embed", "kv_heads", "head_dim"))
        self.v_kernel = _param(rngs, init, (d, k, h), pdt, ("embed", "kv_heads", "head_dim"))
        self.o_kernel = _param(rngs, out_init, (n, h, d), pdt, ("heads", "head_dim", "embed"))
        if config.qkv_bias:
            zeros = nnx.initializers.zeros
            self.q_bias = _param(rngs, zeros, (n, h), pdt, ("heads", "head_dim"))
            self.k_bias = _param(rngs, zeros, (k, h), pdt, ("kv_heads", "head_dim"))
            self.v_bias = _param(rngs, zeros, (k, h), pdt, ("kv_heads", "head_dim"))
        else:
            self.q_bias = self.k_bias = self.v_bias = None

    def _project(self, x, kernel, bias):
        d, heads, h = kernel.value.shape
        y = dense(x, kernel.value.reshape(d, heads * h).astype(self.dtype))
        y = y.reshape(*x.shape[:-1], heads, h)
        if bias is not None:
            y = y + bias.value.astype(self.dtype)
        return y

    def qkv(self, x, rope):
        """q, k (rotated by rope = (cos, sin) from `rope_tables`) and v, [B, T, heads, H]."""
        q = rotate(self._project(x, self.q_kernel, self.q_bias), *rope)
        k = rotate(self._project(x, self.k_kernel, self.k_bias), *rope)
        v = self._project(x, self.v_kernel, self.v_bias)
        return q, k, v

    def fused_qkv(self, x, rope):
        """As `qkv`, with one matmul against the concatenated [D, (N + 2K) H] kernel."""
        d, n, h = self.q_kernel.value.shape
        kv = self.k_kernel.value.shape[1]
        kernels = (self.q_kernel, self.k_kernel, self.v_kernel)
        kernel = jnp.concatenate([w.value.reshape(d, -1) for w in kernels], axis=1)
        y = dense(x, kernel.astype(self.dtype))
        if self.q_bias is not None:
            biases = (self.q_bias, self.k_bias, self.v_bias)
            y = y + jnp.concatenate([b.value.reshape(-1) for b in biases]).astype(self.dtype)
        q, k, v = jnp.split(y, [n * h, (n + kv) * h], axis=-1)
        b, t = x.shape[:2]
        q = rotate(q.reshape(b, t, n, h), *rope)
        k = rotate(k.reshape(b, t, kv, h), *rope)
        return q, k, v.reshape(b, t, kv, h)

    def output(self, attended):
        """[B, T, N, H] -> [B, T, D] as one [B, T, N*H] x [N*H, D] matmul (both reshapes are
        free; contracting (N, H) as an einsum made XLA transpose o_kernel and the attention
        output at every decode step)."""
        b, t, n, h = attended.shape
        kernel = self.o_kernel.value.reshape(n * h, -1).astype(self.dtype)
        return dense(attended.reshape(b, t, n * h), kernel)

    def __call__(self, x, rope, attention_mask, segment_ids=None):
        q, k, v = self.qkv(x, rope)
        return self.output(attend(q, k, v, jnp.arange(x.shape[1]), attention_mask,
                                  segment_ids, self.implementation))

    def extend(self, x, rope, key_valid, prefix=None):
        """Attention of T new tokens over the keys/values of P earlier ones and their own.

        Args:
          x: [B, T, D] normed inputs; rope: (cos, sin) [B, T, 1, H] of their positions.
          key_valid: [B, P + T] bool over the earlier tokens' and the new tokens' slots.
          prefix: None (P = 0) or (keys, values) [B, P, K, H] as this returns them.

        Returns:
          ([B, T, D] output, (keys, values) [B, T, K, H] of the new tokens, keys rotated).
        """
        q, k, v = self.qkv(x, rope)
        keys, values = (k, v) if prefix is None else (
            jnp.concatenate([prefix[0], k], axis=1), jnp.concatenate([prefix[1], v], axis=1))
        slots = keys.shape[1] - x.shape[1] + jnp.arange(x.shape[1])
        return self.output(attend(q, keys, values, slots, key_valid,
                                  implementation=self.implementation)), (k, v)

    def cached(self, x, rope, key_valid, index, cache_k, cache_v):
        q, k, v = self.fused_qkv(x, rope)
        b, t, kv_heads, h = k.shape
        rows = lambda new: new.transpose(0, 2, 1, 3).reshape(b * kv_heads, t, h)
        if index.ndim == 1:  # each row at its own slot (one token): a scatter per row
            r, at = jnp.arange(b * kv_heads), jnp.repeat(index, kv_heads)
            cache_k = cache_k.at[r, :, at].set(rows(k)[:, 0].astype(cache_k.dtype))
            cache_v = cache_v.at[r, at, :].set(rows(v)[:, 0].astype(cache_v.dtype))
            query_slots = index[:, None] + jnp.arange(t)[None]
        else:
            cache_k = jax.lax.dynamic_update_slice(
                cache_k, rows(k).transpose(0, 2, 1).astype(cache_k.dtype), (0, 0, index)
            )
            cache_v = jax.lax.dynamic_update_slice(
                cache_v, rows(v).astype(cache_v.dtype), (0, index, 0)
            )
            query_slots = index + jnp.arange(t)
        attended = attend_cached(q, cache_k, cache_v, query_slots, key_valid)
        return self.output(attended), cache_k, cache_v


class MLP(nnx.Module):
    """SwiGLU: down(silu(x W_gate) * (x W_up))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, f, pdt = config.hidden_size, config.mlp_size, config.parameter_dtype
        init = nnx.initializers.normal(0.02)
        self.dtype = config.compute_dtype
        self.gate_kernel = _param(rngs, init, (d, f), pdt, ("embed", "mlp"))
        self.up_kernel = _param(rngs, init, (d, f), pdt, ("embed", "mlp"))
        self.down_kernel = _param(
            rngs,
            nnx.initializers.normal(0.02 / math.sqrt(2 * config.num_layers)),
            (f, d),
            pdt,
            ("mlp", "embed"),
        )

    def __call__(self, x):
        gate = dense(x, self.gate_kernel.value.astype(self.dtype))
        up = dense(x, self.up_kernel.value.astype(self.dtype))
        return dense(jax.nn.silu(gate) * up, self.down_kernel.value.astype(self.dtype))

    def fused(self, x):
        """As `__call__`, with one matmul against the concatenated [D, 2F] gate/up kernel."""
        kernel = jnp.concatenate([self.gate_kernel.value, self.up_kernel.value], axis=1)
        gate, up = jnp.split(dense(x, kernel.astype(self.dtype)), 2, axis=-1)
        return dense(jax.nn.silu(gate) * up, self.down_kernel.value.astype(self.dtype))


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)); x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.attention_norm = RMSNorm(config, rngs=rngs)
        self.attention = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, rope, attention_mask, segment_ids=None):
        x = x + self.attention(self.attention_norm(x), rope, attention_mask, segment_ids)
        return x + self.mlp(self.mlp_norm(x))

    def extend(self, x, rope, key_valid, prefix=None):
        """The block over T new tokens after P earlier ones (`Attention.extend`): returns
        (x [B, T, D], the new tokens' (keys, values))."""
        attended, kv = self.attention.extend(self.attention_norm(x), rope, key_valid, prefix)
        x = x + attended
        return x + self.mlp(self.mlp_norm(x)), kv

    def cached(self, x, rope, key_valid, index, cache_k, cache_v):
        attended, cache_k, cache_v = self.attention.cached(
            self.attention_norm(x), rope, key_valid, index, cache_k, cache_v
        )
        x = x + attended
        return x + self.mlp.fused(self.mlp_norm(x)), cache_k, cache_v


def first_of_groups(x: jax.Array, group: int) -> jax.Array:
    """Row 0 of each contiguous group of `group` rows: [U * group, ...] -> [U, ...]."""
    return x.reshape(x.shape[0] // group, group, *x.shape[1:])[:, 0]


def spread_to_groups(x: jax.Array, group: int, per_row: int = 1) -> jax.Array:
    """Each block of `per_row` rows repeated for the `group` rows of its group:
    [U * per_row, ...] -> [U * group * per_row, ...] (inverse layout of `first_of_groups`)."""
    u = x.shape[0] // per_row
    x = x.reshape(u, 1, per_row, *x.shape[1:])
    return jnp.broadcast_to(x, (u, group, per_row, *x.shape[3:])).reshape(-1, *x.shape[3:])


def default_positions(attention_mask: jax.Array) -> jax.Array:
    """positions = cumsum(mask) - 1, clipped at 0, so left padding does not shift positions."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


class Transformer(nnx.Module):
    """Decoder-only transformer (Qwen2 / Llama family) with optional scalar value head.

    Calling the model on int token ids [B, T] returns float32 logits [B, T, V].
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.inv_freq = tuple(float(f) for f in rope_inverse_frequencies(config))
        d, v, pdt = config.hidden_size, config.vocab_size, config.parameter_dtype
        self.embedding = _param(
            rngs, nnx.initializers.normal(0.02), (v, d), pdt, ("vocab", "embed")
        )
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = RMSNorm(config, rngs=rngs)
        if config.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = _param(
                rngs, nnx.initializers.normal(0.02), (d, v), pdt, ("embed", "vocab")
            )
        if config.value_head:
            self.value_kernel = _param(rngs, nnx.initializers.zeros, (d,), pdt, ("embed",))
            self.value_bias = _param(rngs, nnx.initializers.zeros, (), pdt, ())
        else:
            self.value_kernel = self.value_bias = None
        # Set by grpo_jax.parallel when the parameters are sharded over several devices
        # (a `parallel.ActivationSharding`): activations are then constrained to rows over
        # the batch axes at block boundaries and in the output head (`constrain`).
        self.activation_sharding = None

    def constrain(self, x: jax.Array, names=("batch", "length", None)) -> jax.Array:
        """x with its logical layout (default: rows over data x fsdp, the rest replicated)
        when the model is sharded; x itself otherwise."""
        if self.activation_sharding is None:
            return x
        return self.activation_sharding.constrain(x, names)

    def embed(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.embedding.value, tokens, axis=0).astype(self.config.compute_dtype)

    def hidden_states(self, tokens, *, attention_mask=None, positions=None, segment_ids=None):
        """Final-normed hidden states.

        Args:
          tokens: [B, T] int token ids (left-padded).
          attention_mask: [B, T] bool, False at padding; None means all True.
          positions: [B, T] int; None means cumsum(attention_mask) - 1.
          segment_ids: optional [B, T] int of packed rows (`sft.data.pack_rows`): attention
            stays within a segment; `positions` must then be given (each segment's restart
            at 0, so all are < T).

        Returns:
          [B, T, D] in the compute dtype.
        """
        if segment_ids is not None and positions is None:
            raise ValueError("hidden_states: segment_ids needs the packed rows' positions")
        if attention_mask is None:
            attention_mask = jnp.ones(tokens.shape, bool)
        attention_mask = attention_mask.astype(bool)
        default = positions is None
        if default:
            positions = default_positions(attention_mask)
        x = self.constrain(self.embed(tokens))

        if default or segment_ids is not None:  # positions < T
            rope = gather_rope(rope_table(tokens.shape[1], self.inv_freq), positions)
        else:
            rope = rope_tables(positions, self.inv_freq)

        def run_block(block, x, rope, attention_mask, segment_ids):
            return self.constrain(block(x, rope, attention_mask, segment_ids))

        x = self.run_blocks(run_block, x, rope, attention_mask, segment_ids)
        return self.final_norm(x)

    def run_blocks(self, step, carry, *args):
        """carry = step(block, carry, *args) for each block in order.

        With config.remat each step is rematerialised in the backward pass; with
        config.scan_layers the blocks run as one `lax.scan` over their weights stacked along
        a new leading axis (one compiled step for all layers; the stack is a copy made
        inside the program).
        """
        if not self.config.scan_layers:
            if self.config.remat:
                step = nnx.remat(step)
            for block in self.blocks:
                carry = step(block, carry, *args)
            return carry
        graphdef = nnx.graphdef(self.blocks[0])
        stacked = jax.tree.map(lambda *layers: jnp.stack(layers),
                               *(nnx.state(block) for block in self.blocks))

        def body(carry, layer):
            return step(nnx.merge(graphdef, layer), carry, *args), None

        if self.config.remat:
            body = jax.checkpoint(body, prevent_cse=False)
        return jax.lax.scan(body, carry, stacked)[0]

    def suffix_hidden_states(self, tokens, attention_mask, prefix_len: int, group_size: int = 1):
        """Final-normed hidden states at positions prefix_len - 1 .. T - 1, [B, 1 + T - P, D].

        The same values as `hidden_states(...)[:, prefix_len - 1:]` (up to float rounding),
        for rows in contiguous groups of `group_size` that share their first `prefix_len`
        tokens and mask (the G completions of one prompt in GRPO). The shared prefix is run
        once per group: its keys and values are computed for B / G rows and broadcast to
        the group's suffixes, which attend to them (causal attention: a prefix never sees
        its suffixes). With P prompt and C completion tokens that is P (G - 1) / G of the
        B (P + C) token rows fewer: 17.5% at P = 16, C = 64, G = 8. Gradients flow through
        the broadcast, so each prefix sums its group's. With `group_size` 1 this is the
        plain forward, sliced.

        Args:
          tokens: [B, T] int token ids, left-padded; attention_mask: [B, T] bool.
          prefix_len: P with 0 < P < T.
          group_size: G dividing B; the caller guarantees that rows g*G .. g*G + G - 1
            share tokens[:, :P] and attention_mask[:, :P].

        Returns:
          [B, 1 + T - P, D] in the compute dtype.
        """
        b, t = tokens.shape
        p, g = prefix_len, group_size
        if not 0 < p < t:
            raise ValueError(f"suffix_hidden_states: prefix_len must be in (0, {t}), got {p}")
        if g < 1 or b % g:
            raise ValueError(f"suffix_hidden_states: group_size {g} does not divide the "
                             f"batch of {b} rows")
        mask = attention_mask.astype(bool)
        if g == 1:
            return self.hidden_states(tokens, attention_mask=mask)[:, p - 1:]
        first = lambda a: first_of_groups(a, g)  # noqa: E731
        spread = lambda a: spread_to_groups(a, g)  # noqa: E731
        rope = gather_rope(rope_table(t, self.inv_freq), default_positions(mask))
        prefix_rope = tuple(first(r[:, :p]) for r in rope)
        suffix_rope = tuple(r[:, p:] for r in rope)
        prefix_valid = first(mask[:, :p])

        def run_block(block, streams, prefix_rope, suffix_rope, prefix_valid, mask):
            xp, xs = map(self.constrain, streams)
            xp, kv = block.extend(xp, prefix_rope, prefix_valid)
            xs, _ = block.extend(xs, suffix_rope, mask, tuple(spread(a) for a in kv))
            return xp, xs

        streams = self.embed(first(tokens[:, :p])), self.embed(tokens[:, p:])
        streams = self.run_blocks(run_block, streams, prefix_rope, suffix_rope, prefix_valid,
                                  mask)
        xp, xs = map(self.constrain, streams)
        return self.final_norm(jnp.concatenate([spread(xp[:, -1:]), xs], axis=1))

    def head_kernel(self) -> jax.Array:
        """Output projection [D, V] (the transposed embedding when tied)."""
        return self.embedding.value.T if self.lm_head is None else self.lm_head.value

    def logits(self, hidden: jax.Array) -> jax.Array:
        """float32 logits [.., V] = hidden [.., D] @ W_out, accumulated in float32."""
        kernel = self.head_kernel().astype(self.config.compute_dtype)
        return dense(hidden, kernel, preferred_element_type=jnp.float32)

    def values(self, hidden: jax.Array) -> jax.Array:
        """Scalar value V(s_t) = w . h_t + b in float32; hidden [.., D] -> [..]."""
        if self.value_kernel is None:
            raise ValueError("values requested but ModelConfig.value_head is False")
        return jnp.einsum(
            "...D,D->...", hidden.astype(jnp.float32), self.value_kernel.value.astype(jnp.float32)
        ) + self.value_bias.value.astype(jnp.float32)

    def __call__(self, tokens, *, attention_mask=None, positions=None):
        """Logits [B, T, V] float32 for tokens [B, T] (see hidden_states for the arguments)."""
        return self.logits(
            self.hidden_states(tokens, attention_mask=attention_mask, positions=positions)
        )

    def init_cache(self, batch_size: int, size: int) -> KVCache:
        return KVCache.init(self.config, batch_size, size)

    def decode(self, tokens, positions, token_mask, cache: KVCache):
        """Runs T new tokens against the cache, writing their keys/values at cache.index.

        Prefill is one call with the whole left-padded prompt; decoding is one call per token.

        Args:
          tokens: [B, T] int token ids.
          positions: [B, T] int rotary positions.
          token_mask: [B, T] bool, False for padding (these slots are never attended to).
          cache: KVCache with S >= cache.index + T.

        Returns:
          (hidden [B, T, D] final-normed, updated KVCache with index advanced by T).
        """
        index = cache.index
        if index.ndim == 1:  # each row's own next slot: one token per call
            if tokens.shape[1] != 1:
                raise ValueError(f"decode: a cache with a slot per row takes one token per "
                                 f"call, got {tokens.shape[1]}")
            at = jnp.arange(cache.size)[None, :] == index[:, None]
            key_valid = jnp.where(at, token_mask.astype(bool), cache.key_valid)
        else:
            key_valid = jax.lax.dynamic_update_slice(
                cache.key_valid, token_mask.astype(bool), (0, index)
            )
        x = self.embed(tokens)
        rope = gather_rope(cache.rope, positions)
        keys, values = [], []
        for block, cache_k, cache_v in zip(self.blocks, cache.keys, cache.values):
            x, cache_k, cache_v = block.cached(x, rope, key_valid, index, cache_k, cache_v)
            keys.append(cache_k)
            values.append(cache_v)
        cache = cache.replace(
            keys=tuple(keys),
            values=tuple(values),
            key_valid=key_valid,
            index=index + tokens.shape[1],
        )
        return self.final_norm(x), cache


def _chunked(fn, hidden, targets, chunk_size, chunk_rows=None):
    """Applies fn(hidden [R, C, D], targets [R, C]) -> tuple of [R, C] over tiles of C =
    `chunk_size` positions and R = `chunk_rows` rows (None: all of them), one after another.

    A tile's rows are dealt round-robin (tile i holds rows i, i + B/R, ...), so when the
    rows are split over devices in contiguous blocks every tile has its share on every
    device. `chunk_rows` must divide B (else all rows form one tile).
    """
    b, t = targets.shape
    cols = t if chunk_size is None or chunk_size >= t else chunk_size
    rows = b if chunk_rows is None or chunk_rows >= b or b % chunk_rows else chunk_rows
    if cols == t and rows == b:
        return fn(hidden, targets)
    num_cols, num_rows = -(-t // cols), b // rows
    pad = num_cols * cols - t
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))

    def tiles(x):  # [B, T', ...] -> [num_rows * num_cols, rows, cols, ...]
        x = x.reshape(rows, num_rows, num_cols, cols, *x.shape[2:])
        return jnp.moveaxis(x, (1, 2), (0, 1)).reshape(num_rows * num_cols, rows, cols,
                                                       *x.shape[4:])

    def untile(x):  # the inverse, [.., rows, cols] -> [B, T]
        x = x.reshape(num_rows, num_cols, rows, cols)
        return jnp.moveaxis(x, (0, 1), (1, 2)).reshape(b, num_cols * cols)[:, :t]

    # checkpoint: the backward pass recomputes each tile's logits instead of storing them.
    outputs = jax.lax.map(lambda xs: jax.checkpoint(fn)(*xs), (tiles(hidden), tiles(targets)))
    return tuple(untile(o) for o in outputs)


def target_logp(log_probs, targets):
    """log p(target): log-softmaxed logits [..., V] at int targets [...] -> [...] (the
    output head's log-probs, and TRPO's from its whole logits)."""
    return jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def entropy_of(log_probs):
    """-sum_v p log p over the last axis of log-softmaxed logits [..., V] -> [...]."""
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def _head_fn(kernel, temperature: float, return_entropy: bool, constrain=None):
    """fn(hidden [R, C, D], targets [R, C]) -> (log p(target), [entropy]) in float32, for
    the output `kernel` [D, V]; `constrain(x, names)` places the tiles (GSPMD), if given."""
    place = constrain or (lambda x, names: x)

    def head(h, y):
        h = place(h, ("batch", "length", None))
        z = place(dense(h, kernel, preferred_element_type=jnp.float32),
                  ("batch", "length", "vocab"))
        if temperature != 1.0:
            z = z / temperature
        log_probs = jax.nn.log_softmax(z, axis=-1)
        logp = target_logp(log_probs, y)
        if return_entropy:
            return logp, entropy_of(log_probs)
        return (logp,)

    return head


def _tiled_head(model: Transformer, hidden, targets, *, temperature: float,
                return_entropy: bool, chunk_size, chunk_rows):
    """The output head over tiles of rows and positions (`_chunked`): (log p(target),
    [entropy]) [B, C] in float32 for hidden [B, C, D] and targets [B, C].

    On a sharded model whose vocabulary is not split, each device runs the tiles of its own
    rows (`ActivationSharding.map_rows`; `chunk_rows` then counts a device's rows), with
    the kernel gathered once: the kernel's gradient is summed over devices once, not once
    per tile. Otherwise the tiles run under GSPMD with their rows over the batch axes.
    """
    kernel = model.head_kernel().astype(model.config.compute_dtype)
    sharding = model.activation_sharding
    if sharding is None:
        return _chunked(_head_fn(kernel, temperature, return_entropy), hidden, targets,
                        chunk_size, chunk_rows)
    kernel = model.constrain(kernel, (None, "vocab"))  # gathered once for all tiles
    if not sharding.splits(kernel, (None, "vocab")):
        def local(h, y, k):
            return _chunked(_head_fn(k, temperature, return_entropy), h, y, chunk_size,
                            chunk_rows)

        outputs = sharding.map_rows(local, (hidden, targets), (kernel,))
        if outputs is not None:
            return outputs
    return _chunked(_head_fn(kernel, temperature, return_entropy, model.constrain), hidden,
                    targets, chunk_size, chunk_rows)


def logprobs(
    model: Transformer,
    tokens,
    attention_mask,
    *,
    chunk_size=None,
    return_entropy=False,
    return_values=False,
    temperature=1.0,
    segment_ids=None,
    positions=None,
    chunk_rows=None,
):
    """Teacher-forced log p(tokens[:, t] | tokens[:, :t]) and entropies, in float32.

    log p_t = z_{t-1}[y_t] - logsumexp(z_{t-1}); H_t = -sum_v p_t(v) log p_t(v), where z_{t-1}
    are the logits read after token t-1. With chunk_size (and chunk_rows) the [B, T, V] logits
    exist one tile [chunk_rows, chunk_size, V] at a time (also in the backward pass).

    Args:
      model: the Transformer.
      tokens: [B, T] int token ids, left-padded.
      attention_mask: [B, T] bool, False at padding.
      chunk_size: sequence chunk for the output head; None computes all positions at once.
      chunk_rows: rows per tile of the output head (None: all rows; it must divide B), so
        the logits exist [chunk_rows, chunk_size, V] at a time.
      return_entropy: also return the entropy of the next-token distribution.
      return_values: also return the value head output V(s_t) on the hidden state at t.
      temperature: divide the logits by it first (the sampling distribution at that
        temperature, as in the sampler's log-probabilities).
      segment_ids, positions: [B, T] int of packed rows (`sft.data.pack_rows`): each
        segment is scored as its own sequence (its first token gets logp 0, like a row's).

    Returns:
      dict with logp [B, T] (logp[:, 0] = 0 and 0 wherever attention_mask is False),
      entropy [B, T] (if asked; same alignment and zeros), values [B, T] (if asked).
    """
    chex_rank = (tokens.ndim, attention_mask.ndim)
    if chex_rank != (2, 2) or tokens.shape != attention_mask.shape:
        raise ValueError(
            f"logprobs expects tokens and attention_mask of equal shape [B, T], got "
            f"{tokens.shape} and {attention_mask.shape}"
        )
    attention_mask = attention_mask.astype(bool)
    hidden = model.hidden_states(tokens, attention_mask=attention_mask, positions=positions,
                                 segment_ids=segment_ids)
    outputs = _tiled_head(model, hidden[:, :-1], tokens[:, 1:], temperature=temperature,
                          return_entropy=return_entropy, chunk_size=chunk_size,
                          chunk_rows=chunk_rows)
    valid = attention_mask[:, 1:] & attention_mask[:, :-1]
    if segment_ids is not None:  # no prediction across the boundary of two packed examples
        valid = valid & (segment_ids[:, 1:] == segment_ids[:, :-1])
    shift = lambda x: jnp.pad(jnp.where(valid, x, 0.0), ((0, 0), (1, 0)))
    result = {"logp": shift(outputs[0])}
    if return_entropy:
        result["entropy"] = shift(outputs[1])
    if return_values:
        result["values"] = jnp.where(attention_mask, model.values(hidden), 0.0)
    return result


def completion_logprobs(model: Transformer, tokens, attention_mask, prompt_len: int, *,
                        group_size: int = 1, chunk_size=None, return_entropy=False,
                        temperature=1.0, chunk_rows=None):
    """`logprobs(...)[key][:, prompt_len:]` for the completions only, and cheaper.

    The output head runs on the C = T - P positions that predict completion tokens only (not
    on the P - 1 prompt positions whose log-probs are dropped), and with `group_size` G > 1
    each group of G rows sharing a prompt runs the prompt once (`suffix_hidden_states`).

    Args:
      model: the Transformer.
      tokens: [B, P + C] int, prompts left-padded then completions; attention_mask the same.
      prompt_len: P >= 1.
      group_size: G dividing B, with rows g*G .. g*G + G - 1 sharing tokens[:, :P] and
        attention_mask[:, :P] (the caller's guarantee; 1 shares nothing).
      chunk_size, chunk_rows, return_entropy, temperature: as in `logprobs`.

    Returns:
      dict with logp [B, C] (0 where the token or the one before it is masked) and entropy
      [B, C] if asked.
    """
    if tokens.ndim != 2 or tokens.shape != attention_mask.shape:
        raise ValueError(
            f"completion_logprobs expects tokens and attention_mask of equal shape [B, T], "
            f"got {tokens.shape} and {attention_mask.shape}")
    mask = attention_mask.astype(bool)
    hidden = model.suffix_hidden_states(tokens, mask, prompt_len, group_size)
    outputs = _tiled_head(model, hidden[:, :-1], tokens[:, prompt_len:],
                          temperature=temperature, return_entropy=return_entropy,
                          chunk_size=chunk_size, chunk_rows=chunk_rows)
    valid = mask[:, prompt_len:] & mask[:, prompt_len - 1:-1]
    result = {"logp": jnp.where(valid, outputs[0], 0.0)}
    if return_entropy:
        result["entropy"] = jnp.where(valid, outputs[1], 0.0)
    return result
