"""Autoregressive decoding over a key/value cache: greedy and temperature / top-k / top-p
sampling, for the encoder-decoder. Everything runs inside one ``jax.lax.while_loop``,
so a whole decode is one jitted call and works with sharded parameters.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

EOS_ID = 1
PAD_ID = 0


def _encode_then_decode(module, encoder_input_tokens, decoder_input_tokens, max_decode_length):
    encoded = module.encode(encoder_input_tokens)
    return module.decode(encoded, encoder_input_tokens, decoder_input_tokens, max_decode_length)


def init_cache(model: nn.Module, batch_size: int, encoder_length: int, max_decode_length: int):
    """Zeroed cache variables for ``max_decode_length`` positions (shapes only, then zeros)."""
    encoder_tokens = jnp.ones((batch_size, encoder_length), jnp.int32)
    decoder_tokens = jnp.ones((batch_size, max_decode_length), jnp.int32)
    shapes = jax.eval_shape(
        functools.partial(model.init, method=_encode_then_decode, max_decode_length=max_decode_length),
        jax.random.key(0), encoder_tokens, decoder_tokens)["cache"]
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), nn.unbox(shapes))


def filter_logits(logits: jax.Array, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """Masks all but the ``top_k`` largest logits and the smallest set with mass >= ``top_p``."""
    neg = jnp.finfo(logits.dtype).min
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep a token while the mass of the tokens ranked above it is below top_p.
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < top_p
        threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, neg, logits)
    return logits


def decode(model: nn.Module, params, encoder_input_tokens: jax.Array, *, max_decode_length: int,
           rng: jax.Array | None = None, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, eos_id: int = EOS_ID) -> jax.Array:
    """Generated ids ``[batch, max_decode_length]``; after EOS a row is padded with 0.

    ``temperature == 0`` is greedy; otherwise tokens are sampled from
    ``softmax(logits / temperature)`` restricted by ``top_k`` / ``top_p``, with the
    randomness of step ``i`` derived from ``fold_in(rng, i)``.
    """
    if temperature > 0 and rng is None:
        raise ValueError("Sampling (temperature > 0) needs an rng key.")
    batch, encoder_length = encoder_input_tokens.shape
    encoded = model.apply({"params": params}, encoder_input_tokens, method=model.encode)
    cache = init_cache(model, batch, encoder_length, max_decode_length)
    rng = jax.random.key(0) if rng is None else rng

    def choose(logits, step):
        if temperature <= 0:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logits = filter_logits(logits / temperature, top_k, top_p)
        return jax.random.categorical(jax.random.fold_in(rng, step), logits).astype(jnp.int32)

    def cond(carry):
        step, _, _, _, done = carry
        return (step < max_decode_length) & ~jnp.all(done)

    def body(carry):
        step, token, cache, output, done = carry
        logits, variables = model.apply(
            {"params": params, "cache": cache}, encoded, encoder_input_tokens, token[:, None],
            max_decode_length, method=model.decode, mutable=["cache"])
        next_token = jnp.where(done, PAD_ID, choose(logits[:, 0], step))
        output = jax.lax.dynamic_update_slice(output, next_token[:, None], (0, step))
        return step + 1, next_token, variables["cache"], output, done | (next_token == eos_id)

    start = jnp.zeros((batch,), jnp.int32)  # T5 starts decoding from id 0
    output = jnp.zeros((batch, max_decode_length), jnp.int32)
    done = jnp.zeros((batch,), bool)
    return jax.lax.while_loop(cond, body, (jnp.array(0), start, cache, output, done))[3]
