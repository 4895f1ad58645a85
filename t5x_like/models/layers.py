"""Transformer building blocks in Flax linen, every array named with logical axes.

Logical axis names used here: ``batch``, ``length`` (and ``kv_length`` for the
attended sequence), ``embed``, ``mlp``, ``heads``, ``kv_heads`` (grouped-query
key/value heads), ``kv``, ``vocab``, ``relpos_buckets`` (and ``layers`` for
scanned stacks, see ``stacking.py``; ``expert`` and ``expert_batch`` in ``moe.py``).
Only the partitioner maps them onto mesh axes.
Parameters are float32; ``dtype`` is the compute dtype.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.dtypes import promote_dtype

from t5x_like.models import attention, context_parallel, rotary

Initializer = Callable[..., jax.Array]
NEG_INF = attention.NEG_INF

default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Activation sharding hint by logical names (no-op without axis rules)."""
    return nn.with_logical_constraint(x, tuple(names))


_GRADIENT_BOUNDARIES: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "gradient_boundaries", default=None)


@contextlib.contextmanager
def gradient_boundaries(enabled: bool | None) -> Iterator[None]:
    """Turns the CPU backward forms (``gradient_boundary``, ``contract``'s gradient) on or
    off while a model is traced (``None``: on when JAX's default backend is the CPU).
    The trainer sets it from its mesh's platform, so compiling for a TPU topology on
    a CPU machine leaves them out."""
    token = _GRADIENT_BOUNDARIES.set(enabled)
    try:
        yield
    finally:
        _GRADIENT_BOUNDARIES.reset(token)


def _cpu_backward_forms() -> bool:
    """Whether the CPU-friendly backward formulations are on (``gradient_boundaries``)."""
    enabled = _GRADIENT_BOUNDARIES.get()
    return jax.default_backend() == "cpu" if enabled is None else enabled


def _materialized(x):
    """``x`` written out as it is, through a conditional: XLA:CPU does not fuse through
    one (an optimization barrier is removed before fusion), so consumers of the
    result read memory instead of recomputing ``x``'s producer. The predicate must
    not be a constant, or XLA folds the conditional away; both branches return ``x``."""
    predicate = jnp.isfinite(x[(0,) * x.ndim])  # one element: a reshape of a split x gathers it
    return jax.lax.cond(predicate, lambda v: v, lambda v: v + 0, x)


def gradient_boundary(x: jax.Array) -> jax.Array:
    """Identity forward; in the backward pass the gradient arriving here is written out once.

    The residual stream's gradient is a sum over every later sublayer. XLA:CPU
    fuses that sum into each consumer (and their transposes) and recomputes it,
    layer after layer: on GPT-2 small this cost a fifth of the train step. A
    conditional is a fusion boundary XLA:CPU keeps (an optimization barrier is
    removed before fusion), so the gradient passes through one. TPU and GPU fuse
    better, and the conditional's scalar predicate would cost a collective
    under sharding, so there the boundary is off by default.
    """
    return _materialized_gradient(x) if _cpu_backward_forms() else x


@jax.custom_vjp
def _materialized_gradient(x):
    return x


def _materialize_forward(x):
    return x, None


def _materialize_backward(_, gradient):
    return (_materialized(gradient),)


_materialized_gradient.defvjp(_materialize_forward, _materialize_backward)


def contract(x: jax.Array, kernel: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``x`` contracted over ``axes`` with the leading dims of ``kernel`` (a dense layer).

    With the CPU backward forms on, the gradient is written as the two plain
    contractions (over the batch dims for the kernel), not as JAX's transposed
    dot_general: from that, XLA:CPU makes a transposed copy of every output
    gradient, recomputing the activation's derivative into it, for the kernel's
    gradient (a gated-MLP train step went from 168 to 96 ms). Same values.
    """
    if not _cpu_backward_forms():
        return _dot(x, kernel, axes)
    return _contract_plainly(x, kernel, axes)


def _dot(x, kernel, axes):
    return jax.lax.dot_general(x, kernel, ((axes, tuple(range(len(axes)))), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _contract_plainly(x, kernel, axes):
    return _dot(x, kernel, axes)


def _contract_forward(x, kernel, axes):
    # The kernel gradient reads ``x`` transposed; from memory that is a plain transposed
    # copy, recomputed from ``x``'s producer (a GELU) it costs several times as much.
    return _contract_plainly(x, kernel, axes), (_materialized(x), kernel)


def _contract_backward(axes, residuals, gradient):
    x, kernel = residuals
    n_in = len(axes)
    batch = tuple(d for d in range(x.ndim) if d not in axes)
    n_batch, n_out = len(batch), kernel.ndim - n_in
    # dx: gradient (batch..., out...) with kernel (in..., out...) over out -> (batch..., in...).
    dx = jax.lax.dot_general(gradient, kernel, ((tuple(range(n_batch, n_batch + n_out)),
                                                 tuple(range(n_in, kernel.ndim))), ((), ())))
    dx = jnp.transpose(dx, np.argsort(batch + axes))  # back to x's dimension order
    # dkernel: x with gradient over the batch dims -> (x's in dims in ascending order, out...).
    dkernel = jax.lax.dot_general(x, gradient, ((batch, tuple(range(n_batch))), ((), ())))
    in_order = tuple(np.argsort(np.argsort(axes)))  # where each of ``axes`` landed
    dkernel = jnp.transpose(dkernel, in_order + tuple(range(n_in, kernel.ndim)))
    return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


_contract_plainly.defvjp(_contract_forward, _contract_backward)


def _canonical_axes(axes: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    return tuple(a % ndim for a in axes)


class DenseGeneral(nn.Module):
    """``x @ kernel (+ bias)`` over ``axis``, producing ``features``.

    T5 uses no biases; GPT-2 and BERT do (``use_bias``). The bias is named with the
    output part of ``kernel_axes``.
    """

    features: int | Sequence[int]
    kernel_axes: Sequence[str | None]
    axis: int | Sequence[int] = -1
    kernel_init: Initializer = default_kernel_init
    use_bias: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        axes = _canonical_axes(self.axis, x.ndim)
        in_shape = tuple(x.shape[a] for a in axes)
        fan_in = int(np.prod(in_shape))

        def init(key, shape, dtype=jnp.float32):
            # Initialise as a 2-D (fan_in, fan_out) matrix so fan-in scaling is right.
            flat = self.kernel_init(key, (fan_in, int(np.prod(features))), dtype)
            return flat.reshape(shape)

        kernel = self.param("kernel", nn.with_logical_partitioning(init, self.kernel_axes),
                            in_shape + features, jnp.float32)
        # Flax's promote_dtype, not .astype: int8 weights (Qwix's, models/quantization.py)
        # stay int8 through it, to be multiplied as they are.
        x, kernel = promote_dtype(x, kernel, dtype=self.dtype)
        y = contract(x, kernel, axes).astype(self.dtype)  # (int8 kernels' scales are float32)
        if self.use_bias:
            bias_axes = tuple(self.kernel_axes[len(axes):])
            bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, bias_axes),
                              features, jnp.float32)
            y = y + bias.astype(self.dtype)
        return y


class RMSNorm(nn.Module):
    """T5's layer norm: scale only, no mean subtraction, no bias; computed in f32.
    ``axis_name``: the logical name of the normalised axis (``kv`` for the per-head
    query/key norms of Qwen3 and Gemma 3)."""

    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        scale = self.param("scale",
                           nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                           (x.shape[-1],), jnp.float32)
        return (x32 * jax.lax.rsqrt(variance + self.epsilon) * scale).astype(self.dtype)


class LayerNorm(nn.Module):
    """Standard layer norm (mean and variance, scale and bias), computed in f32."""

    epsilon: float = 1e-5
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        features = (x.shape[-1],)
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                           features, jnp.float32)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                          features, jnp.float32)
        y = (x32 - mean) * jax.lax.rsqrt(variance + self.epsilon) * scale + bias
        return y.astype(self.dtype)


# Embedding tables up to this many rows are read by one-hot matmul instead of a gather.
ONE_HOT_MAX_ROWS = 16


class Embed(nn.Module):
    """Token embedding table, also usable as a tied output projection."""

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32
    embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

    def setup(self):
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(self.embedding_init, ("vocab", "embed")),
            (self.num_embeddings, self.features), jnp.float32)

    def __call__(self, ids: jax.Array) -> jax.Array:
        if self.num_embeddings <= ONE_HOT_MAX_ROWS:
            # Tiny tables (BERT's 2 token types): every token's gradient lands on the same
            # few rows, and a scatter-add serialises on them (42 ms of a 65 ms BERT step
            # on an H100 in bfloat16). A one-hot matmul is exact and costs nothing here.
            one_hot = jax.nn.one_hot(ids, self.num_embeddings, dtype=jnp.float32)
            return jnp.einsum("...v,vd->...d", one_hot, self.embedding,
                              precision=jax.lax.Precision.HIGHEST).astype(self.dtype)
        if jax.default_backend() == "gpu":
            # Gather the float32 rows, then cast: the gradient's scatter-add stays in
            # float32, which GPUs add atomically (bfloat16 atomics are compare-and-swap loops).
            return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
        # Elsewhere cast first, as T5X and MaxText do: under a sharded table the gather's
        # collectives then move compute-dtype values.
        return jnp.take(self.embedding.astype(self.dtype), ids, axis=0)

    def attend(self, x: jax.Array) -> jax.Array:
        return jnp.einsum("...d,vd->...v", x.astype(self.dtype), self.embedding.astype(self.dtype))


def relative_position_bucket(relative_position: np.ndarray | jax.Array, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array:
    """T5's bucketing: exact for small distances, logarithmic up to ``max_distance``."""
    bucket = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        bucket = (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps)
    large = max_exact + (log_ratio / np.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    """Per-head scalar bias from bucketed query-key offsets; one per stack (shared by layers)."""

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, query_length: int, key_length: int) -> jax.Array:
        context = np.arange(query_length)[:, None]
        memory = np.arange(key_length)[None, :]
        buckets = relative_position_bucket(memory - context, self.bidirectional,
                                           self.num_buckets, self.max_distance)
        table = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(
                nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                ("heads", "relpos_buckets")),
            (self.num_heads, self.num_buckets), jnp.float32)
        bias = jnp.take(table, buckets, axis=1)  # [heads, q, k]
        return bias[None].astype(self.dtype)    # [1, heads, q, k]


def apply_rotary(x: jax.Array, positions: jax.Array, max_wavelength: float = 10_000.0,
                 scaling=None) -> jax.Array:
    """Rotary position embedding (RoFormer), half-split layout as in GPT-NeoX and Llama.

    ``x``: ``[batch, length, heads, head_dim]``; ``positions``: ``[batch, length]``.
    Dimension ``i`` of the first half rotates with dimension ``i`` of the second
    half at frequency ``max_wavelength ** (-2i / head_dim)``, rescaled by ``scaling``
    (``models.rotary``: Llama 3.1's, YaRN's).
    """
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"Rotary positions need an even head_dim, got {head_dim}.")
    inv_freq, factor = rotary.frequencies(head_dim, max_wavelength, scaling)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [batch, length, head_dim/2]
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    if factor != 1.0:
        sin, cos = sin * np.float32(factor), cos * np.float32(factor)
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)


class MultiHeadAttention(nn.Module):
    """Multi-head dot-product attention, optionally grouped-query and rotary.

    T5 puts 1/sqrt(head_dim) into the query initialisation and none in the compute;
    ``scale_in_compute`` (GPT-2, BERT, Llama) multiplies the logits instead.
    ``use_bias`` adds biases to the four projections. ``num_kv_heads`` below
    ``num_heads`` shares each key/value head among ``num_heads // num_kv_heads``
    query heads (GQA; 1 is multi-query). ``rotary`` rotates queries and keys by
    their positions before the dot product (``rope_scaling`` rescales the frequencies).
    ``qkv_bias`` (Qwen2) adds biases to the query, key and value projections alone;
    ``qk_norm`` (Qwen3, Gemma 3) RMS-normalises each head's queries and keys before
    the rotation. ``query_scale`` replaces 1/sqrt(head_dim) in the compute (Gemma's
    ``query_pre_attn_scalar ** -0.5``); ``logit_softcap`` (Gemma 2) bounds the scaled
    logits to ``cap * tanh(logits / cap)`` before the mask is added, which only the
    plain path computes.
    """

    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32
    use_bias: bool = False
    scale_in_compute: bool = False
    kernel_init: Initializer | None = None
    num_kv_heads: int | None = None
    rotary: bool = False
    rotary_max_wavelength: float = 10_000.0
    rope_scaling: object = None  # a model's rope section (config.model_parts.Rope) or None
    qkv_bias: bool = False
    qk_norm: bool = False
    qk_norm_epsilon: float = 1e-6
    query_scale: float = 0.0
    logit_softcap: float = 0.0
    # How the scores are computed when ``bias`` is an ``attention.AttentionMask``
    # (``attention.IMPLEMENTATIONS``); a dense bias array always takes the plain path.
    attention_impl: str = "auto"
    # Longformer: global tokens' own query/key/value projections for their rows.
    global_projections: bool = False

    @nn.compact
    def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array, bias: jax.Array | None,
                 deterministic: bool = True, decode: bool = False,
                 query_positions: jax.Array | None = None,
                 key_positions: jax.Array | None = None,
                 prefix_kv: tuple[jax.Array, jax.Array] | None = None,
                 cross_cache: str = "") -> jax.Array:
        """``decode=True``: autoregressive self-attention over a key/value cache.

        The first call (at ``init``) sees the full decode length and only creates the
        cache. Later calls take the next position (or several, to prefill a prompt);
        ``bias`` is then the full ``[.., max_length, max_length]`` bias and the rows
        from the current index are used, or already those rows (``[.., step, max_length]``).
        With ``rotary``, ``query_positions``/``key_positions`` (``[batch, length]``)
        say where each token sits (default: 0, 1, 2, ...).
        ``prefix_kv``: learned keys and values ``[prefix, kv_heads, head_dim]`` that every
        query attends to before the sequence (prefix tuning, ``models.peft_modules``); they sit
        outside the cache and carry no position.
        ``bias``: an ``attention.AttentionMask`` (computed by ``attention_impl``), a
        dense additive ``[batch, 1 or heads, q, k]`` array or ``attention.SplitBias``,
        or None.
        ``cross_cache`` (cross-attention while decoding): the encoder output's keys and
        values do not change from step to step, so ``"fill"`` projects ``inputs_kv`` and
        keeps the result in the cache (``cross_key``, ``cross_value``) and ``"read"``
        uses the kept ones without projecting again; ``""`` projects on every call.
        """
        embed = inputs_q.shape[-1]
        kv_heads = self.num_kv_heads or self.num_heads
        if self.num_heads % kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={kv_heads}; pick a divisor of num_heads.")
        base_init = self.kernel_init or nn.initializers.variance_scaling(1.0, "fan_in", "normal")

        def query_init(key, shape, dtype=jnp.float32):
            scale = 1.0 if self.scale_in_compute else np.sqrt(self.head_dim)
            return base_init(key, shape, dtype) / scale

        grouped = kv_heads != self.num_heads
        kv_axes = ("embed", "kv_heads" if grouped else "heads", "kv")
        projection_bias = self.use_bias or self.qkv_bias
        query = DenseGeneral((self.num_heads, self.head_dim), ("embed", "heads", "kv"),
                             kernel_init=query_init, use_bias=projection_bias, dtype=self.dtype,
                             name="query")(inputs_q)
        # Kept in the layouts the attention's two dot products read them in (keys
        # [batch, heads, length, kv], values [batch, heads, kv, length]): stored as
        # [batch, length, heads, kv], XLA would transpose the whole cache at every step.
        key, value = self._keys_and_values(inputs_kv, cross_cache, kv_heads, kv_axes, base_init,
                                           projection_bias)
        if self.qk_norm:
            query = RMSNorm(self.qk_norm_epsilon, self.dtype, "kv", name="query_norm")(query)
        if cross_cache == "fill":
            self.put_variable("cache", "cross_key", jnp.transpose(key, (0, 2, 1, 3)))
            self.put_variable("cache", "cross_value", jnp.transpose(value, (0, 2, 3, 1)))
        elif cross_cache not in ("", "read"):
            raise ValueError(f"cross_cache={cross_cache!r}; use '', 'fill' or 'read'.")
        if self.rotary:
            query = apply_rotary(query, _default_positions(query_positions, inputs_q),
                                 self.rotary_max_wavelength, self.rope_scaling)
            key = apply_rotary(key, _default_positions(key_positions, inputs_kv),
                               self.rotary_max_wavelength, self.rope_scaling)
        query = constrain(query, ("batch", "length", "heads", "kv"))
        key = constrain(key, ("batch", "kv_length", kv_axes[1], "kv"))
        value = constrain(value, ("batch", "kv_length", kv_axes[1], "kv"))
        mask = bias if isinstance(bias, attention.AttentionMask) else None
        if decode or prefix_kv is not None or self.logit_softcap:
            # The cache and the prefix work on rows and columns of a dense bias.
            if mask is not None:
                bias, mask = attention.dense_bias(mask), None
            elif isinstance(bias, attention.SplitBias):
                bias = bias.dense()
        scale = ((self.query_scale or 1.0 / np.sqrt(self.head_dim)) if self.scale_in_compute
                 else 1.0)
        if decode and prefix_kv is None and self._reads_pages_in_place(query, bias):
            out = self._paged_kernel_step(query, key, value, bias, scale)
        else:
            out = self._attend(query, key, value, bias, mask, decode, prefix_kv, deterministic,
                               scale, inputs_q, base_init, query_init, kv_axes, kv_heads)
        out = constrain(out, ("batch", "length", "heads", "kv"))
        return DenseGeneral(features=embed, axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
                            kernel_init=base_init, use_bias=self.use_bias, dtype=self.dtype,
                            name="out")(out)

    def _reads_pages_in_place(self, query, bias) -> bool:
        """A decoding step over a paged cache that the TPU kernel serves
        (``attention.paged_kernel_fits``)."""
        return (isinstance(bias, attention.PagedBias) and self.has_variable("cache", "cached_key")
                and attention.paged_kernel_fits(bias, query.shape[1], self.head_dim,
                                                self.get_variable("cache", "cached_key").shape[2]))

    def _paged_kernel_step(self, query, key, value, paged, scale):
        """Writes the fed token's key and value into its row's pages and attends with the
        paged-attention kernel, which reads each row's pages where they are."""
        cached_key = self.variable("cache", "cached_key", jnp.zeros, ())
        cached_value = self.variable("cache", "cached_value", jnp.zeros, ())
        _write_into_pages(cached_key, cached_value, key, value, paged)
        return attention.paged_attention(query, cached_key.value, cached_value.value, paged,
                                         scale=scale, logit_softcap=self.logit_softcap)

    def _attend(self, query, key, value, bias, mask, decode, prefix_kv, deterministic, scale,
                inputs_q, base_init, query_init, kv_axes, kv_heads):
        """Attention over the cache (written first while decoding), the prefix and the
        keys, by the mask's kernel or the reference."""
        if decode:
            key, value, bias = self._update_cache(key, value, bias)
        if prefix_kv is not None:
            key, value, bias = _prepend(prefix_kv, key, value, bias)
        dropout = None
        if self.dropout_rate > 0 and not deterministic:
            dropout = lambda w: nn.Dropout(self.dropout_rate)(w, deterministic=False)  # noqa: E731
        if mask is None:
            out = attention.reference_attention(query, key, value, None, scale=scale,
                                                dtype=self.dtype, bias=bias, dropout=dropout,
                                                logit_softcap=self.logit_softcap)
        elif context_parallel.splits(query.shape[1]) and query.shape[1] == key.shape[1]:
            if dropout is not None:
                raise ValueError("Attention dropout is not built across a context axis; set "
                                 "model.dropout_rate=0 with mesh.context > 1.")
            out = context_parallel.attend(query, key, value, mask, scale=scale, dtype=self.dtype,
                                          implementation=self.attention_impl)
        else:
            out = attention.attend(query, key, value, mask, implementation=self.attention_impl,
                                   scale=scale, dtype=self.dtype, dropout=dropout)
            if self.global_projections and mask.global_tokens is not None:
                out = self._global_rows(inputs_q, mask, out, base_init, query_init, kv_axes,
                                        kv_heads, scale)
        return out

    def _keys_and_values(self, inputs_kv, cross_cache, kv_heads, kv_axes, base_init,
                         projection_bias):
        """Keys and values projected from ``inputs_kv`` (keys normed with ``qk_norm``), or
        read back from the cache (cross-attention's ``cross_cache="read"``)."""
        if cross_cache == "read":
            key = jnp.transpose(self.get_variable("cache", "cross_key"), (0, 2, 1, 3))
            value = jnp.transpose(self.get_variable("cache", "cross_value"), (0, 3, 1, 2))
            return key, value
        key, value = (DenseGeneral((kv_heads, self.head_dim), kv_axes, kernel_init=base_init,
                                   use_bias=projection_bias, dtype=self.dtype, name=name)(inputs_kv)
                      for name in ("key", "value"))
        if self.qk_norm:
            key = RMSNorm(self.qk_norm_epsilon, self.dtype, "kv", name="key_norm")(key)
        return key, value

    def _global_rows(self, inputs, mask, out, base_init, query_init, kv_axes, kv_heads, scale):
        """Longformer: a global token's row is its query through ``query_global`` over
        every key of its segment through ``key_global``/``value_global``; the other
        rows keep the local result (which already sees the global keys)."""
        project = lambda heads, axes, init, name: DenseGeneral(  # noqa: E731
            (heads, self.head_dim), axes, kernel_init=init, use_bias=self.use_bias,
            dtype=self.dtype, name=name)(inputs)
        query = project(self.num_heads, ("embed", "heads", "kv"), query_init, "query_global")
        key = project(kv_heads, kv_axes, base_init, "key_global")
        value = project(kv_heads, kv_axes, base_init, "value_global")
        rows = attention.global_query_attention(query, key, value, mask, scale=scale,
                                                dtype=self.dtype,
                                                chunked=mask.max_global_tokens > 0)
        return jnp.where(mask.global_tokens[:, :, None, None], rows, out)

    def _update_cache(self, key, value, bias):
        """Keys are kept as ``[batch, heads, length, kv]`` and values as ``[batch, heads,
        kv, length]``, the layouts the two dot products read: a ``[batch, length, ...]``
        cache made XLA transpose all of it at every step."""
        initialized = self.has_variable("cache", "cached_key")
        key_layout, value_layout = (0, 2, 1, 3), (0, 2, 3, 1)
        cached_key = self.variable("cache", "cached_key", jnp.zeros,
                                   _permuted(key.shape, key_layout), key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros,
                                     _permuted(value.shape, value_layout), value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            return key, value, bias
        if isinstance(bias, attention.PagedBias):
            return _paged_update(cached_key, cached_value, key, value, bias)
        # One position per step, or several at once (a prompt's prefill): they are written
        # at the cache index and see the cache through their rows of the full bias.
        step_length = key.shape[1]
        index = cache_index.value
        cached_key.value = jax.lax.dynamic_update_slice(
            cached_key.value, jnp.transpose(key, key_layout), (0, 0, index, 0))
        cached_value.value = jax.lax.dynamic_update_slice(
            cached_value.value, jnp.transpose(value, value_layout), (0, 0, 0, index))
        cache_index.value = index + step_length
        if bias is not None and bias.shape[-2] != step_length:
            # The full bias: these tokens' rows (a bias of step_length rows already is).
            bias = jax.lax.dynamic_slice_in_dim(bias, index, step_length, axis=-2)
        return (jnp.transpose(cached_key.value, (0, 2, 1, 3)),
                jnp.transpose(cached_value.value, (0, 3, 1, 2)), bias)


def _paged_update(cached_key, cached_value, key, value, paged):
    """Writes the fed tokens' keys and values into their rows' pages and returns each
    row's keys and values in page-table order, with ``paged``'s bias. The cache
    variables are the pools (``decoding.init_page_pool``): ``[kv_heads, pages,
    page_size, kv]`` for keys and values alike, a head's pages together (the layout a
    paged-attention kernel reads, ``attention.paged_attention``)."""
    page_size = cached_key.value.shape[2]
    table = paged.page_table
    if table.shape[1] * page_size != paged.bias.shape[-1]:
        raise ValueError(f"The page table's {table.shape[1]} pages of {page_size} hold "
                         f"{table.shape[1] * page_size} positions; the bias covers "
                         f"{paged.bias.shape[-1]}.")
    _write_into_pages(cached_key, cached_value, key, value, paged)
    keys = _gather_page_rows(cached_key.value, table)
    values = _gather_page_rows(cached_value.value, table)
    return jnp.transpose(keys, (0, 2, 1, 3)), jnp.transpose(values, (0, 2, 1, 3)), paged.bias


def _write_into_pages(cached_key, cached_value, key, value, paged) -> None:
    """The fed tokens' keys and values into the pools, at their rows' positions."""
    cached_key.value = _write_pages(cached_key.value, key, paged.page_table, paged.positions)
    cached_value.value = _write_pages(cached_value.value, value, paged.page_table,
                                      paged.positions)


def _gather_page_rows(pool, table):
    """``[rows, kv_heads, pages per row * page_size, kv]``: each row's pages of ``pool``
    (``[kv_heads, pages, page_size, kv]``) in ``table [rows, pages per row]`` order. One
    ``[page_size, kv]`` block is gathered per row, head and page, in that order, so the
    result is already the layout both dot products read and the keys and values are
    copied once (a gather of whole pages in table order, transposed after, copied them
    twice)."""
    heads, pages, page_size, kv = pool.shape
    rows, per_row = table.shape
    index = jnp.arange(heads, dtype=table.dtype)[None, :, None] * pages + table[:, None, :]
    flat = pool.reshape(heads * pages, page_size, kv)
    return flat[index].reshape(rows, heads, per_row * page_size, kv)


def _write_pages(pool, new, table, positions):
    """``pool`` (``[kv_heads, pages, page_size, kv]``) with ``new [rows, length,
    kv_heads, kv]`` written at each row's ``positions [rows, length]`` (its page in
    ``table``, the offset in it); a position past the table goes to the scratch page 0."""
    page_size, per_row = pool.shape[2], table.shape[1]
    inside = (positions >= 0) & (positions < per_row * page_size)
    slot = jnp.clip(positions // page_size, 0, per_row - 1)
    page = jnp.where(inside, jnp.take_along_axis(table, slot, axis=1), 0)  # 0: scratch
    return pool.at[:, page, positions % page_size, :].set(
        jnp.transpose(new, (2, 0, 1, 3)).astype(pool.dtype))


def _permuted(shape, axes) -> tuple[int, ...]:
    return tuple(shape[axis] for axis in axes)


def _prepend(prefix_kv, key, value, bias):
    """Keys and values with the prefix's in front; the bias lets every query see them."""
    prefix_key, prefix_value = prefix_kv
    batch = key.shape[0]
    expand = lambda p, like: jnp.broadcast_to(p.astype(like.dtype)[None],  # noqa: E731
                                              (batch,) + p.shape)
    key = jnp.concatenate([expand(prefix_key, key), key], axis=1)
    value = jnp.concatenate([expand(prefix_value, value), value], axis=1)
    if bias is not None:
        bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(prefix_key.shape[0], 0)])
    return key, value, bias


def _default_positions(positions: jax.Array | None, x: jax.Array) -> jax.Array:
    if positions is not None:
        return positions
    return jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])


def compute_dtype(spec) -> jnp.dtype:
    """The dtype a model spec computes its activations in (``model.numerics.dtype``)."""
    return jnp.dtype(spec.numerics.dtype)


ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": functools.partial(nn.gelu, approximate=True),  # T5 v1.1's "gelu_new"
    "gelu_exact": functools.partial(nn.gelu, approximate=False),
    "silu": nn.silu,
    "linear": lambda x: x,
}


class Mlp(nn.Module):
    """Feed-forward block; several activations multiply (gated-GELU = ("gelu", "linear"))."""

    hidden_dim: int
    activations: Sequence[str] = ("gelu", "linear")
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32
    use_bias: bool = False
    kernel_init: Initializer = default_kernel_init

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        embed = x.shape[-1]
        hidden = None
        for index, name in enumerate(self.activations):
            if name not in ACTIVATIONS:
                raise ValueError(f"Unknown MLP activation {name!r}; choose from {sorted(ACTIVATIONS)}.")
            layer_name = "wi" if len(self.activations) == 1 else f"wi_{index}"
            h = DenseGeneral(self.hidden_dim, kernel_axes=("embed", "mlp"), dtype=self.dtype,
                             use_bias=self.use_bias, kernel_init=self.kernel_init,
                             name=layer_name)(x)
            h = ACTIVATIONS[name](h)
            hidden = h if hidden is None else hidden * h
        hidden = constrain(hidden, ("batch", "length", "mlp"))
        if self.dropout_rate > 0 and not deterministic:
            hidden = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(hidden, deterministic=False)
        return DenseGeneral(embed, kernel_axes=("mlp", "embed"), dtype=self.dtype,
                            use_bias=self.use_bias, kernel_init=self.kernel_init, name="wo")(hidden)


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def make_norm(kind: str, epsilon: float, dtype, name: str) -> nn.Module:
    if kind not in NORMS:
        raise ValueError(f"Unknown norm {kind!r}; choose from {sorted(NORMS)}.")
    return NORMS[kind](epsilon, dtype=dtype, name=name)
