"""Autoregressive decoding over a key/value cache: greedy, temperature / top-k / top-p
sampling, and beam search with a length penalty, for the encoder-decoder (``decode``,
``beam_decode``) and the decoder-only model (``generate``, ``beam_generate``). Each runs
inside one ``jax.lax.while_loop``, so a whole decode is one jitted call and works
with sharded parameters.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.system import traced_platform

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


CROSS_CACHE = ("cross_key", "cross_value")


def fill_cross_cache(model: nn.Module, params, cache, encoded: jax.Array,
                     encoder_input_tokens: jax.Array, max_decode_length: int):
    """``cache`` with every layer's cross-attention keys and values of ``encoded``, so the
    steps read them (``cached_cross=True``) instead of projecting the whole encoder
    output again at every step. One step on the start token computes them; everything
    else of the cache stays as it was (the self-attention cache is still empty)."""
    start = jnp.full((encoded.shape[0], 1), special_ids(model)[0], jnp.int32)
    _, variables = model.apply({"params": params, "cache": cache}, encoded,
                               encoder_input_tokens, start, max_decode_length,
                               method=model.decode, mutable=["cache"])

    def keep(path, old, new):
        return new if getattr(path[-1], "key", None) in CROSS_CACHE else old
    # The barrier makes the cache exist in the layout the steps read. Without it XLA
    # carries the projection's output [batch, length, heads, kv] through the decoding
    # loop (the cache passes through a step unchanged) and transposes it into that
    # layout again at every step: two copies of the encoder's keys and values per
    # layer and step, 45% of a T5-small greedy step on CPU.
    return jax.lax.optimization_barrier(
        jax.tree_util.tree_map_with_path(keep, cache, variables["cache"]))


# From this many rows per step (batch x beams) decoding loops on CPU read the dense
# kernels transposed (``_loop_params``).
TRANSPOSED_KERNELS_MIN_ROWS = 4


def transposes_kernels(rows: int) -> bool:
    """Whether decoding loops of ``rows`` rows read the dense kernels transposed
    (``_loop_params``): on CPU, from ``TRANSPOSED_KERNELS_MIN_ROWS`` rows."""
    return rows >= TRANSPOSED_KERNELS_MIN_ROWS and traced_platform.current_platform() == "cpu"


def _loop_params(params, rows: int):
    """``(carried, restore)``: on CPU, the dense layers' 2-D kernels transposed once before
    a decoding loop whose steps compute ``rows`` rows, and ``restore(carried)``, the
    parameters as the model reads them.

    At a few rows XLA:CPU's matmul reads a ``[in, out]`` kernel at about half the speed
    of the same kernel laid out ``[out, in]`` (T5-small's ``[512, 32128]`` output layer
    at 8 rows: 5.9 ms against 3.8; GPT-2's ``[768, 3072]`` MLP at 32 rows: 1.5 against
    0.8; PyTorch's ``Linear`` keeps ``[out, in]``). Inside the loop the transpose back
    folds into each matmul; the barrier keeps XLA from folding the two transposes away.
    Below ``TRANSPOSED_KERNELS_MIN_ROWS`` rows XLA:CPU takes a matrix-vector path that
    wants ``[in, out]`` and copied every kernel back at every step (GPT-2 small at batch
    1: four times slower), and other platforms choose their own layouts: parameters
    unchanged there."""
    if not transposes_kernels(rows):
        return params, lambda carried: carried

    def flip(path, x):
        names = [getattr(p, "key", None) for p in path]
        matrix_axes = 3 if "layers" in names else 2  # a scanned stack's leading layers axis
        return jnp.swapaxes(x, -1, -2) if names[-1] == "kernel" and x.ndim == matrix_axes else x
    carried = jax.lax.optimization_barrier(jax.tree_util.tree_map_with_path(flip, params))
    return carried, lambda carried: jax.tree_util.tree_map_with_path(flip, carried)


def greedy(logits: jax.Array) -> jax.Array:
    """``argmax(logits, axis=-1)`` as int32, the first of equal maxima as ``jnp.argmax``
    picks: a max, then the smallest index holding it. XLA:CPU runs ``argmax``'s
    (value, index) reduction 3-4x slower than these two plain ones, and a decoding step
    of a few rows over a 50k vocabulary spent a seventh of its time there."""
    best = jnp.max(logits, axis=-1, keepdims=True)
    vocab = logits.shape[-1]
    index = jnp.min(jnp.where(logits == best, jnp.arange(vocab, dtype=jnp.int32), vocab),
                    axis=-1)
    return jnp.minimum(index, vocab - 1)  # a row of NaNs matches nowhere


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


def special_ids(model: nn.Module) -> tuple[int, int, int]:
    """``(start, eos, pad)`` ids of an encoder-decoder: T5's (0, 1, 0) unless its config
    says otherwise (BART: start 2, eos 2, pad 1)."""
    cfg = model.config
    return (getattr(cfg, "decoder_start_id", PAD_ID), getattr(cfg, "eos_id", EOS_ID),
            getattr(cfg, "pad_id", PAD_ID))


def decode(model: nn.Module, params, encoder_input_tokens: jax.Array, *, max_decode_length: int,
           rng: jax.Array | None = None, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, eos_id: int | None = None, copies: int = 1,
           combine: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """Generated ids ``[batch, max_decode_length]``; after EOS a row is padded.

    ``temperature == 0`` is greedy; otherwise tokens are sampled from
    ``softmax(logits / temperature)`` restricted by ``top_k`` / ``top_p``, with the
    randomness of step ``i`` derived from ``fold_in(rng, i)``.

    ``copies``: each output row reads ``copies`` consecutive input rows (RAG-token: one
    per retrieved passage), all fed the row's tokens; ``combine`` turns their next-token
    logits ``[batch, copies, vocab]`` into the row's scores ``[batch, vocab]`` (default:
    the first copy's logits).
    """
    if temperature > 0 and rng is None:
        raise ValueError("Sampling (temperature > 0) needs an rng key.")
    start_id, default_eos, pad_id = special_ids(model)
    eos_id = default_eos if eos_id is None else eos_id
    rows, encoder_length = encoder_input_tokens.shape
    batch = rows // copies
    encoded = model.apply({"params": params}, encoder_input_tokens, method=model.encode)
    cache = fill_cross_cache(model, params, init_cache(model, rows, encoder_length,
                                                       max_decode_length),
                             encoded, encoder_input_tokens, max_decode_length)
    rng = jax.random.key(0) if rng is None else rng
    carried_params, restore = _loop_params(params, rows)

    def choose(logits, step):
        if temperature <= 0:
            return greedy(logits)
        logits = filter_logits(logits / temperature, top_k, top_p)
        return jax.random.categorical(jax.random.fold_in(rng, step), logits).astype(jnp.int32)

    def cond(carry):
        step, _, _, _, done = carry
        return (step < max_decode_length) & ~jnp.all(done)

    def body(carry):
        step, token, cache, output, done = carry
        logits, variables = model.apply(
            {"params": restore(carried_params), "cache": cache}, encoded, encoder_input_tokens,
            jnp.repeat(token, copies)[:, None], max_decode_length, cached_cross=True,
            method=model.decode, mutable=["cache"])
        per_copy = logits[:, 0].reshape(batch, copies, -1)
        scores = combine(per_copy) if combine is not None else per_copy[:, 0]
        next_token = jnp.where(done, pad_id, choose(scores, step))
        output = jax.lax.dynamic_update_slice(output, next_token[:, None], (0, step))
        return step + 1, next_token, variables["cache"], output, done | (next_token == eos_id)

    start = jnp.full((batch,), start_id, jnp.int32)
    output = jnp.full((batch, max_decode_length), pad_id, jnp.int32)
    done = jnp.zeros((batch,), bool)
    return jax.lax.while_loop(cond, body, (jnp.array(0), start, cache, output, done))[3]


# -- beam search ---------------------------------------------------------------

NEG_INF = -1.0e7


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT's ``((5 + length) / 6) ** alpha`` (alpha 0 ranks by total log-probability)."""
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def _gather_beams(tree, beam_indices: jax.Array, batch: int, old_beams: int):
    """Picks beams ``beam_indices [batch, new_beams]`` from arrays shaped ``[batch*old_beams, ...]``
    (``[layers, batch*old_beams, ...]`` under a scanned stack's ``layers``).

    One row gather per array, its indices promised in bounds: ``take_along_axis``
    over a ``[batch, beams, ...]`` view also masked every element of the cache for
    out-of-range indices, a second pass over the whole cache at every step. The
    cross-attention cache is the same for every beam of an example: not gathered."""
    rows = (jnp.arange(batch)[:, None] * old_beams + beam_indices).reshape(-1)

    def gather(path, x):
        names = [getattr(p, "key", None) for p in path]
        axis = 1 if "layers" in names else 0
        if (names and names[-1] in CROSS_CACHE) or x.ndim <= axis or (
                x.shape[axis] != batch * old_beams):
            return x  # e.g. the cache index, shared by every beam
        return jnp.moveaxis(jnp.moveaxis(x, axis, 0).at[rows].get(mode="promise_in_bounds"),
                            0, axis)
    return jax.tree_util.tree_map_with_path(gather, tree)


def beam_search(step_fn, cache, *, batch_size: int, num_beams: int, max_decode_length: int,
                alpha: float = 0.6, eos_id: int = EOS_ID, start_id: int | jax.Array = PAD_ID,
                reorder=None):
    """Generic beam search.

    ``step_fn(tokens [batch*num_beams], cache) -> (logits [batch*num_beams, vocab], cache)``
    scores the next token after ``tokens``; the cache rows follow their beams:
    ``reorder(cache, source_beam [batch, num_beams])`` makes new beam ``j`` of each
    example the old beam ``source_beam[:, j]`` (default: every ``[batch*num_beams, ...]``
    array's rows are gathered, :func:`_gather_beams`). Returns
    ``(sequences [batch, num_beams, max_decode_length], scores [batch, num_beams])``,
    best first, scores being log-probability divided by ``length_penalty``. Beams cut
    at ``max_decode_length`` without EOS count as ended there. ``start_id`` is the first
    token fed, one for all rows or one per row (``[batch]``, e.g. each prompt's last).
    """
    if alpha < 0:
        raise ValueError(f"alpha={alpha}: the length penalty exponent must be >= 0.")
    b, k, length = batch_size, num_beams, max_decode_length
    if reorder is None:
        reorder = lambda cache, source: _gather_beams(cache, source, b, k)  # noqa: E731
    # Only beam 0 is live at the start, so the first step does not pick k copies of one token.
    alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (b, 1))
    alive_seqs = jnp.zeros((b, k, length), jnp.int32)
    finished_seqs = jnp.zeros((b, k, length), jnp.int32)
    finished_scores = jnp.full((b, k), NEG_INF)
    last_tokens = jnp.repeat(jnp.broadcast_to(jnp.asarray(start_id, jnp.int32), (b,)), k)
    best_possible_penalty = length_penalty(jnp.array(length), alpha)

    def cond(carry):
        step, _, alive_logp, _, finished_scores, _ = carry
        # Stop once no live beam can still beat the worst finished one.
        # With alpha >= 0 the penalty only grows, so dividing by its maximum bounds the
        # best normalised score a live beam can still reach.
        best_alive = alive_logp[:, 0] / best_possible_penalty
        worst_finished = jnp.min(finished_scores, axis=1)
        return (step < length) & ~jnp.all(worst_finished > best_alive)

    def body(carry):
        step, alive_seqs, alive_logp, finished_seqs, finished_scores, state = carry
        tokens, cache = state
        logits, cache = step_fn(tokens, cache)
        vocab = logits.shape[-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(b, k, vocab)
        candidate_logp = (alive_logp[:, :, None] + logp).reshape(b, k * vocab)
        top_logp, top_index = jax.lax.top_k(candidate_logp, 2 * k)
        top_beam, top_token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
        top_seqs = jnp.take_along_axis(alive_seqs, top_beam[:, :, None], axis=1)
        top_seqs = jax.lax.dynamic_update_slice(top_seqs, top_token[:, :, None], (0, 0, step))
        ends = top_token == eos_id

        # The k best candidates that did not end become the new live beams.
        live_logp, live_pick = jax.lax.top_k(jnp.where(ends, NEG_INF, top_logp), k)
        new_alive_seqs = jnp.take_along_axis(top_seqs, live_pick[:, :, None], axis=1)
        source_beam = jnp.take_along_axis(top_beam, live_pick, axis=1)
        cache = reorder(cache, source_beam)
        new_tokens = jnp.take_along_axis(top_token, live_pick, axis=1).reshape(-1)

        # Candidates that ended join the finished pool; keep its k best.
        ended_scores = jnp.where(ends, top_logp / length_penalty(step + 1, alpha), NEG_INF)
        pool_scores = jnp.concatenate([finished_scores, ended_scores], axis=1)
        pool_seqs = jnp.concatenate([finished_seqs, top_seqs], axis=1)
        finished_scores, keep = jax.lax.top_k(pool_scores, k)
        finished_seqs = jnp.take_along_axis(pool_seqs, keep[:, :, None], axis=1)
        return (step + 1, new_alive_seqs, live_logp, finished_seqs, finished_scores,
                (new_tokens, cache))

    carry = (jnp.array(0), alive_seqs, alive_logp, finished_seqs, finished_scores,
             (last_tokens, cache))
    _, alive_seqs, alive_logp, finished_seqs, finished_scores, _ = jax.lax.while_loop(
        cond, body, carry)
    # Beams still alive at the end (cut at max_decode_length) compete with the finished
    # ones; if the loop stopped early, none of them can beat a finished beam anyway.
    alive_scores = alive_logp / length_penalty(jnp.array(length), alpha)
    pool_scores = jnp.concatenate([finished_scores, alive_scores], axis=1)
    pool_seqs = jnp.concatenate([finished_seqs, alive_seqs], axis=1)
    scores, keep = jax.lax.top_k(pool_scores, k)
    return jnp.take_along_axis(pool_seqs, keep[:, :, None], axis=1), scores


def beam_decode(model: nn.Module, params, encoder_input_tokens: jax.Array, *,
                max_decode_length: int, num_beams: int = 4, alpha: float = 0.6,
                eos_id: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Beam search for the encoder-decoder; see :func:`beam_search` for the outputs."""
    start_id, default_eos, _ = special_ids(model)
    eos_id = default_eos if eos_id is None else eos_id
    batch, encoder_length = encoder_input_tokens.shape
    encoded = model.apply({"params": params}, encoder_input_tokens, method=model.encode)
    # Every beam carries its own copy of the encoder outputs and cache rows.
    encoded = jnp.repeat(encoded, num_beams, axis=0)
    encoder_tokens = jnp.repeat(encoder_input_tokens, num_beams, axis=0)
    cache = fill_cross_cache(model, params, init_cache(model, batch * num_beams, encoder_length,
                                                       max_decode_length),
                             encoded, encoder_tokens, max_decode_length)
    carried_params, restore = _loop_params(params, batch * num_beams)

    def step_fn(tokens, cache):
        logits, variables = model.apply(
            {"params": restore(carried_params), "cache": cache}, encoded, encoder_tokens,
            tokens[:, None], max_decode_length, cached_cross=True, method=model.decode,
            mutable=["cache"])
        return logits[:, 0], variables["cache"]

    return beam_search(step_fn, cache, batch_size=batch, num_beams=num_beams,
                       max_decode_length=max_decode_length, alpha=alpha, eos_id=eos_id,
                       start_id=start_id)


# -- decoder-only generation ---------------------------------------------------

def generation_length(model: nn.Module, prompt_length: int, max_new_tokens: int) -> int:
    """Prompt plus new tokens, checked against the positions the model has."""
    total = prompt_length + max_new_tokens
    max_length = getattr(getattr(model.config, "positions", None), "max_length", total)
    if total > max_length:
        raise ValueError(f"prompt ({prompt_length}) + max_new_tokens ({max_new_tokens}) = {total} "
                         f"exceeds the model's max_length {max_length}.")
    return total


class UnpagedModel(ValueError):
    """The model's ``__call__`` takes no ``page_table``: the engine cannot decode it."""


def takes(model: nn.Module, argument: str) -> bool:
    """Whether ``model``'s ``__call__`` takes ``argument`` (a plug-in family's module may
    leave out what the built-in decoder takes: ``page_table``, ``project_hidden``)."""
    return argument in inspect.signature(type(model).__call__).parameters


def check_paged(model: nn.Module) -> None:
    """Raises ``UnpagedModel`` unless ``model`` reads a paged cache."""
    if not takes(model, "page_table"):
        raise UnpagedModel(f"{type(model).__name__}.__call__ takes no page_table: the engine "
                           "decodes models that read a paged cache (models.decoder.DecoderOnly).")


def paged_forward(model: nn.Module, params, cache, tokens, positions, table, page_size: int):
    """``(logits, cache)``: ``tokens`` at ``positions`` (``[rows, length]``) through the
    pool ``cache``, each row's pages named by its row of ``table``. The table is as wide as
    the longest row needs, so a step attends over what rows hold, not over max_length.
    The continuous-batching engine's steps (``generation/engine.py``) and
    ``plan --decode --page_size`` both run this."""
    logits, variables = model.apply(
        {"params": params, "cache": cache}, tokens, decode=True,
        max_decode_length=table.shape[1] * page_size, decoder_positions=positions,
        page_table=table, mutable=["cache"])
    return logits, variables["cache"]


def paged_prefill(model: nn.Module, params, cache, tokens, positions, table, page_size: int,
                  last: jax.Array):
    """``(logits [rows, vocab], cache)``: ``paged_forward`` over prompt rows, keeping the
    logits of each row's ``last`` position only (the one that chooses its first new
    token). A model that projects given hidden states (``project_hidden``) runs its
    output layer on those positions alone: projecting every padded prompt position onto
    the vocabulary was most of a prefill's work (128 positions x 50k ids a row)."""
    if not takes(model, "project_hidden"):
        logits, cache = paged_forward(model, params, cache, tokens, positions, table, page_size)
        return jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0], cache
    hidden, variables = model.apply(
        {"params": params, "cache": cache}, tokens, decode=True,
        max_decode_length=table.shape[1] * page_size, decoder_positions=positions,
        page_table=table, return_hidden=True, mutable=["cache"])
    hidden = jnp.take_along_axis(hidden, last[:, None, None], axis=1)
    logits = model.apply({"params": params}, None, project_hidden=hidden)
    return logits[:, 0], variables["cache"]


def paged_window(model: nn.Module, params, cache, tokens, positions, table, page_size: int,
                 steps: int, choose: Callable, last_position: int,
                 restore: Callable = lambda params: params):
    """``(outputs, cache)``: ``steps`` decoding steps of one token a row over the pool
    ``cache`` in one program (``paged_forward`` each), ``tokens [rows]`` fed at
    ``positions [rows]`` first and each step's choice (``choose(logits [rows, vocab], k)
    -> (tokens [rows], output)``) fed to the next on the device; ``outputs`` are the
    steps' ``output``s stacked along a leading axis. A position past ``last_position``
    (a row whose window runs past its end) is written at it again, in the row's own page
    or the scratch page. ``restore(params)`` runs inside each step (``_loop_params``'
    transposed kernels turned back where the transpose folds into the dot)."""
    def one(carry, k):
        cache, tokens = carry
        at = jnp.minimum(positions + k, last_position)
        logits, cache = paged_forward(model, restore(params), cache, tokens[:, None],
                                      at[:, None], table, page_size)
        chosen, output = choose(logits[:, 0], k)
        return (cache, chosen), output

    (cache, _), outputs = jax.lax.scan(one, (cache, tokens), jnp.arange(steps))
    return outputs, cache


POOLS = ("cached_key", "cached_value")  # a paged cache's pool variables


def init_page_pool(model: nn.Module, pages: int, page_size: int):
    """The zeroed key/value pools of ``pages`` pages of ``page_size`` positions that
    ``paged_forward`` reads: each attention layer's keys and values as ``[kv_heads,
    pages, page_size, kv]`` (behind a scanned stack's layer axis), a head's pages
    together as a paged-attention kernel reads them (``layers._paged_update``)."""
    def pool(path, leaf):
        shape = leaf.shape
        if getattr(path[-1], "key", None) in POOLS:
            lead, (count, heads, size, kv) = shape[:-4], shape[-4:]
            if path[-1].key == "cached_value":  # the dense cache keeps values [.., kv, length]
                size, kv = kv, size
            shape = (*lead, heads, count, size, kv)
        return jnp.zeros(shape, leaf.dtype)
    return jax.tree_util.tree_map_with_path(pool, _cache_shapes(model, pages, page_size))


def init_decoder_cache(model: nn.Module, batch_size: int, max_decode_length: int):
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                        _cache_shapes(model, batch_size, max_decode_length))


def _cache_shapes(model: nn.Module, batch_size: int, max_decode_length: int):
    """The shapes and dtypes of ``model``'s decoding cache for ``batch_size`` rows of
    ``max_decode_length`` (nothing allocated)."""
    tokens = jnp.ones((batch_size, max_decode_length), jnp.int32)
    shapes = jax.eval_shape(functools.partial(model.init, decode=True,
                                              max_decode_length=max_decode_length),
                            jax.random.key(0), tokens)["cache"]
    return nn.unbox(shapes)


def generate(model: nn.Module, params, prompt_tokens: jax.Array, *, max_new_tokens: int,
             rng: jax.Array | None = None, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, eos_id: int | None = None, pad_id: int = PAD_ID) -> jax.Array:
    """Continues equal-length prompts with a decoder-only model: ``[batch, max_new_tokens]``.

    :func:`generate_padded` with every prompt full length: the prompt is prefilled into
    the cache, then each new token is chosen as in :func:`decode`. After ``eos_id`` (if
    given) a row is padded.
    """
    batch, prompt_length = prompt_tokens.shape
    return generate_padded(model, params, prompt_tokens,
                           jnp.full((batch,), prompt_length, jnp.int32),
                           max_new_tokens=max_new_tokens, rng=rng, temperature=temperature,
                           top_k=top_k, top_p=top_p, eos_id=-1 if eos_id is None else eos_id,
                           pad_id=pad_id)


def beam_generate(model: nn.Module, params, prompt_tokens: jax.Array, *, max_new_tokens: int,
                  num_beams: int = 4, alpha: float = 0.6,
                  eos_id: int = EOS_ID) -> tuple[jax.Array, jax.Array]:
    """Beam search continuing equal-length prompts with a decoder-only model.

    Returns ``(sequences [batch, num_beams, max_new_tokens], scores [batch, num_beams])``
    as :func:`beam_search` does. The prompt (all but its last token) is prefilled once
    per example; the last prompt token starts the search (:func:`_prompt_beam_search`).
    """
    prompts = prompt_tokens.astype(jnp.int32)
    return _prompt_beam_search(model, params, prompts, jnp.zeros((prompts.shape[0],), jnp.int32),
                               num_beams=num_beams, max_new_tokens=max_new_tokens, alpha=alpha,
                               eos_id=eos_id)


def _prefill(model: nn.Module, params, rows: jax.Array, pad: jax.Array, cache_length: int):
    """A new cache of ``cache_length`` holding all of the left-padded ``rows [batch, width]``
    but the last position, in one pass (the last one's logits choose the first new token
    in the loop); only the cache is kept, so no vocabulary logits."""
    batch, width = rows.shape
    cache = init_decoder_cache(model, batch, cache_length)
    if width < 2:
        return cache
    valid = (jnp.arange(cache_length)[None, :] >= pad[:, None]).astype(jnp.int32)
    positions = jnp.maximum(jnp.arange(width - 1)[None, :] - pad[:, None], 0)
    _, variables = model.apply(
        {"params": params, "cache": cache}, rows[:, :width - 1], decode=True,
        max_decode_length=cache_length, decoder_positions=positions, decoder_segment_ids=valid,
        return_hidden=True, mutable=["cache"])
    return variables["cache"]


def _prompt_beam_search(model: nn.Module, params, prompts: jax.Array, pad: jax.Array, *,
                        num_beams: int, max_new_tokens: int, alpha: float, eos_id: int):
    """Beam search continuing left-padded ``prompts [batch, width]`` (``pad [batch]``
    positions of padding each) with every prompt held once in the cache, not once per beam.

    The cache is one row per example: the prompt's first ``width - 1`` positions
    (prefilled in one call), then step ``t`` writes its ``num_beams`` tokens side by side
    at ``width - 1 + t * num_beams``, one slot per beam. Which slot of each step lies on
    a beam's path is its row of ``ancestry [batch, beams, max_new_tokens]``, and when
    the beams are reordered only that table moves. A cache row per beam had to be
    gathered after its beam at every step: a quarter of GPT-2 small's beam step, most of
    it copying a prompt that is the same for every beam. A beam's query sees its
    prompt's real tokens and the slots on its path (within a sliding window if the
    model has one); scores are those of a cache per beam up to float rounding.
    """
    batch, width = prompts.shape
    generation_length(model, width, max_new_tokens)  # the positions exist
    k, start = num_beams, width - 1
    cache_length = start + k * max_new_tokens
    window = getattr(getattr(model.config, "attention", None), "sliding_window", 0) or 0
    slot_step = jnp.repeat(jnp.arange(max_new_tokens), k)  # the step and beam of each slot
    slot_beam = jnp.tile(jnp.arange(k), max_new_tokens)
    key_index = jnp.concatenate([jnp.arange(start), start + slot_step])
    prompt_visible = jnp.broadcast_to((jnp.arange(start)[None, :] >= pad[:, None])[:, None],
                                      (batch, k, start))
    own_slot = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32)[None, :, None], (batch, k, 1))

    carried_params, restore = _loop_params(params, batch * k)

    def step_fn(tokens, state):
        cache, ancestry, t = state
        ancestry = jax.lax.dynamic_update_slice(ancestry, own_slot, (0, 0, t))
        on_path = (slot_step <= t) & (ancestry[:, :, slot_step] == slot_beam)
        visible = jnp.concatenate([prompt_visible, on_path], axis=-1)
        if window:
            visible &= start + t - key_index < window
        positions = jnp.broadcast_to((start + t - pad)[:, None], (batch, k))
        logits, variables = model.apply(
            {"params": restore(carried_params), "cache": cache}, tokens.reshape(batch, k),
            decode=True,
            max_decode_length=cache_length, decoder_positions=positions, decode_visible=visible,
            mutable=["cache"])
        return logits.reshape(batch * k, -1), (variables["cache"], ancestry, t + 1)

    def reorder(state, source_beam):
        cache, ancestry, t = state
        return cache, jnp.take_along_axis(ancestry, source_beam[:, :, None], axis=1), t

    state = (_prefill(model, params, prompts, pad, cache_length),
             jnp.zeros((batch, k, max_new_tokens), jnp.int32), jnp.array(0, jnp.int32))
    return beam_search(step_fn, state, batch_size=batch, num_beams=k,
                       max_decode_length=max_new_tokens, alpha=alpha, eos_id=eos_id,
                       start_id=prompts[:, -1], reorder=reorder)


def generate_padded(model: nn.Module, params, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
                    *, max_new_tokens: int, rng: jax.Array | None = None,
                    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                    num_beams: int = 1, alpha: float = 0.6, eos_id: int = EOS_ID,
                    pad_id: int = PAD_ID) -> jax.Array:
    """Continues prompts of different lengths in one batch: ``[batch, max_new_tokens]``.

    ``prompt_tokens [batch, P]`` holds each prompt left-aligned in its first
    ``prompt_lengths`` positions. Rows are right-aligned (left padding), the padding is
    masked out of every attention and positions restart at each prompt's first token,
    so a row decodes exactly as it would alone. Greedy or sampling as :func:`generate`,
    beam search (best beam) with ``num_beams > 1``.
    """
    if temperature > 0 and rng is None:
        raise ValueError("Sampling (temperature > 0) needs an rng key.")
    batch, width = prompt_tokens.shape
    total = generation_length(model, width, max_new_tokens)
    pad = (width - prompt_lengths).astype(jnp.int32)
    source = jnp.arange(width)[None, :] - pad[:, None]
    prompts = jnp.where(source >= 0, jnp.take_along_axis(
        prompt_tokens.astype(jnp.int32), jnp.maximum(source, 0), axis=1), pad_id)
    rng = jax.random.key(0) if rng is None else rng

    def feed(tokens, cache, t):
        valid = (jnp.arange(total)[None, :] >= pad[:, None]).astype(jnp.int32)
        logits, variables = model.apply(
            {"params": restore(carried_params), "cache": cache}, tokens[:, None], decode=True,
            max_decode_length=total, decoder_positions=jnp.maximum(t - pad, 0)[:, None],
            decoder_segment_ids=valid, mutable=["cache"])
        return logits[:, 0], variables["cache"]

    if num_beams > 1:
        sequences, _ = _prompt_beam_search(model, params, prompts, pad, num_beams=num_beams,
                                           max_new_tokens=max_new_tokens, alpha=alpha,
                                           eos_id=eos_id)
        return sequences[:, 0]

    cache = _prefill(model, params, prompts, pad, total)
    carried_params, restore = _loop_params(params, batch)
    output = jnp.full((batch, max_new_tokens), pad_id, jnp.int32)

    def body(t, carry):
        cache, output, done = carry
        from_output = jax.lax.dynamic_index_in_dim(output, jnp.maximum(t - width, 0), 1,
                                                   keepdims=False)
        from_prompt = jax.lax.dynamic_index_in_dim(prompts, jnp.minimum(t, width - 1), 1,
                                                   keepdims=False)
        token = jnp.where(t < width, from_prompt, from_output).astype(jnp.int32)
        logits, cache = feed(token, cache, t)
        if temperature <= 0:
            chosen = greedy(logits)
        else:
            filtered = filter_logits(logits / temperature, top_k, top_p)
            chosen = jax.random.categorical(jax.random.fold_in(rng, t), filtered).astype(jnp.int32)
        index = t - width + 1
        writes = index >= 0
        chosen = jnp.where(done, pad_id, chosen)
        updated = jax.lax.dynamic_update_slice(output, chosen[:, None], (0, jnp.maximum(index, 0)))
        output = jnp.where(writes, updated, output)
        done = done | (writes & (chosen == eos_id))
        return cache, output, done

    done = jnp.zeros((batch,), bool)
    _, output, _ = jax.lax.fori_loop(max(width - 1, 0), total - 1, body, (cache, output, done))
    return output
