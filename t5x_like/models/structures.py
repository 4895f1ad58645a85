"""One object per model structure: what train, eval, infer, flops and plan ask of a family.

T5X's ``EncoderDecoderModel`` / ``DecoderOnlyModel`` idea. A structure owns:

- ``feature_converter(lengths, pack)`` and ``model_feature_lengths(lengths)``: how
  task features become the model's batch;
- ``loss_fn(loss_config)``: the training objective ``(model, params, batch, rng,
  normalizer=None, num_sequences=None) -> (objective, metrics)``;
- ``score_batch(params, batch)``: per-example summed log-likelihood of the targets
  given the inputs, over the positions the loss weights mark (``[batch]``);
- ``predict_batch(params, batch, ...)``: generated token ids through
  ``decoding.py`` (greedy, sampling or beam search);
- ``forward_flops_per_sequence(lengths)``: model FLOPs for MFU (``flops.py``).

Adding a family means adding it to ``models.FAMILIES`` and naming its structure
in ``STRUCTURES``; nothing else branches on family strings.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t5x_like import objectives
from t5x_like.objectives import bilm as bilm_objective

# Keys of ``predict_batch`` beyond the batch: the decoding flags of ``infer`` and ``eval``.
DECODE_DEFAULTS = {"max_decode_length": 64, "num_beams": 1, "alpha": 0.6, "temperature": 0.0,
                   "top_k": 0, "top_p": 1.0}


def _target_log_likelihood(logits, targets, weights) -> jax.Array:
    """Sum over positions of ``log p(target)`` where ``weights`` > 0: ``[batch]``."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token = jnp.take_along_axis(log_probs, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return (token * weights).sum(axis=-1)


def _final_hidden(state) -> jax.Array:
    """The states a family ``sow``s as ``final_hidden`` before its vocabulary projection."""
    found = [value for key, value in traverse_util.flatten_dict(state["intermediates"]).items()
             if key[-1] == "final_hidden"]
    return found[0][0]


def _token_loss_fn(objective, loss_config):
    """The train/eval loss of a token-level objective (``seq2seq_loss``, ``causal_lm_loss``)
    with the config's label smoothing and z-loss; dropout runs exactly when given an rng."""
    options = {"label_smoothing": float(loss_config.label_smoothing),
               "z_loss": float(loss_config.z_loss)}

    def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
        return objective(model, params, batch, rng, deterministic=rng is None,
                         normalizer=normalizer, **options)
    return loss_fn


def _layer_matmuls(d: int, heads: int, head_dim: int, d_ff: int, activations, attention_mats=4,
                   kv_heads: int | None = None):
    """Multiply-adds per token of one layer's projections (attention and MLP). With
    grouped-query attention the key and value projections have ``kv_heads`` heads."""
    kv_heads = kv_heads or heads
    attention = (attention_mats - 2) * d * heads * head_dim + 2 * d * kv_heads * head_dim
    return attention + (len(tuple(activations)) + 1) * d * d_ff


class Structure:
    """Base: shared plumbing; subclasses say what differs."""

    name = ""
    #: the batch feature holding the loss weights, and the one holding the targets.
    weights_feature = "decoder_loss_weights"
    targets_feature = "decoder_target_tokens"

    def __init__(self, model):
        self.model = model

    # -- data -------------------------------------------------------------------------------
    def feature_converter(self, task_feature_lengths: Mapping[str, int], pack: bool = False):
        raise NotImplementedError

    def model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        raise NotImplementedError

    def abstract_batch(self, task_feature_lengths, batch_size: int, sharding=None) -> dict:
        """Shapes and dtypes of one global batch, for ahead-of-time compilation."""
        lengths = self.model_feature_lengths(task_feature_lengths)
        batch = {name: jax.ShapeDtypeStruct((batch_size, n), jnp.int32, sharding=sharding)
                 for name, n in lengths.items()}
        batch[self.weights_feature] = jax.ShapeDtypeStruct(
            (batch_size, lengths[self.targets_feature]), jnp.float32, sharding=sharding)
        return batch

    # -- objectives -------------------------------------------------------------------------
    def loss_fn(self, loss_config):
        raise NotImplementedError

    def logits(self, params, batch) -> jax.Array:
        return self.forward(self.model, params, batch)["logits"]

    def forward(self, model, params, batch, rng=None, deterministic: bool = True) -> dict:
        """What distillation compares (``distill.py``): ``logits``, the final ``hidden``
        states, the objective's ``targets`` and ``weights``, and the ``positions``
        ``[batch, length]`` whose distributions and states the student matches."""
        raise NotImplementedError

    def score_batch(self, params, batch) -> jax.Array:
        """Per-example summed log-likelihood of the targets (``[batch]``, float32)."""
        return _target_log_likelihood(self.logits(params, batch), batch[self.targets_feature],
                                      batch[self.weights_feature])

    def predict_batch(self, params, batch, *, rng=None, **decode) -> jax.Array:
        raise NotImplementedError

    def forward_flops_per_sequence(self, model_config: Mapping, lengths: Mapping[str, int]
                                   ) -> float:
        raise NotImplementedError


class EncoderDecoderStructure(Structure):
    """T5 and BART: inputs -> encoder, targets -> decoder (teacher-forced)."""

    name = "encoder_decoder"

    def feature_converter(self, task_feature_lengths, pack=False):
        from t5x_like.data import feature_converters
        return feature_converters.EncDecFeatureConverter(pack=pack)

    def model_feature_lengths(self, task_feature_lengths):
        lengths = dict(task_feature_lengths)
        return {"encoder_input_tokens": lengths["inputs"],
                "decoder_input_tokens": lengths["targets"],
                "decoder_target_tokens": lengths["targets"]}

    def loss_fn(self, loss_config):
        return _token_loss_fn(objectives.seq2seq_loss, loss_config)

    def forward(self, model, params, batch, rng=None, deterministic=True):
        logits, state = model.apply(
            {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
            batch["decoder_target_tokens"], encoder_segment_ids=batch.get("encoder_segment_ids"),
            decoder_segment_ids=batch.get("decoder_segment_ids"),
            encoder_positions=batch.get("encoder_positions"),
            decoder_positions=batch.get("decoder_positions"), deterministic=deterministic,
            rngs=objectives.dropout_rngs(rng, deterministic), mutable=["intermediates"])
        weights = batch["decoder_loss_weights"]
        return {"logits": logits, "hidden": _final_hidden(state),
                "targets": batch["decoder_target_tokens"], "weights": weights,
                "positions": (weights > 0).astype(jnp.float32)}

    def predict_batch(self, params, batch, *, rng=None, **decode):
        from t5x_like import decoding
        options = {**DECODE_DEFAULTS, **decode}
        tokens = batch["encoder_input_tokens"]
        if options["num_beams"] > 1:
            sequences, _ = decoding.beam_decode(
                self.model, params, tokens, max_decode_length=options["max_decode_length"],
                num_beams=options["num_beams"], alpha=options["alpha"])
            return sequences[:, 0]
        return decoding.decode(self.model, params, tokens,
                               max_decode_length=options["max_decode_length"], rng=rng,
                               temperature=options["temperature"], top_k=options["top_k"],
                               top_p=options["top_p"])

    def forward_flops_per_sequence(self, model, lengths):
        d, h, dh, f, v = (model["d_model"], model["num_heads"], model["head_dim"],
                          model["d_ff"], model["vocab_size"])
        act, attn = model["mlp_activations"], h * dh
        si, st = lengths["inputs"], lengths["targets"]
        le, ld = model["num_encoder_layers"], model["num_decoder_layers"]
        encoder = 2 * si * le * _layer_matmuls(d, h, dh, f, act) + 4 * le * si * si * attn
        decoder = (2 * st * ld * _layer_matmuls(d, h, dh, f, act, attention_mats=6)
                   + 2 * si * ld * 2 * d * attn
                   + 4 * ld * (st * st + st * si) * attn + 2 * st * d * v)
        return encoder + decoder


class DecoderStructure(Structure):
    """GPT-style decoders: one sequence, causal LM; with ``inputs`` a prefix LM whose
    loss covers the targets only (``prefix_attention``: ``bidirectional`` as seqio's
    prefix LM, or ``causal`` as GPT fine-tuning and lm-evaluation-harness condition)."""

    name = "decoder"

    def __init__(self, model, prefix_attention: str = "bidirectional"):
        super().__init__(model)
        if prefix_attention not in ("bidirectional", "causal"):
            raise ValueError(f"prefix_attention={prefix_attention!r}; use 'bidirectional' "
                             "or 'causal'.")
        self.prefix_attention = prefix_attention

    def feature_converter(self, task_feature_lengths, pack=False):
        from t5x_like.data import feature_converters
        return feature_converters.DecoderFeatureConverter(
            pack=pack, prefix_lm="inputs" in task_feature_lengths,
            bidirectional_prefix=self.prefix_attention == "bidirectional")

    def model_feature_lengths(self, task_feature_lengths):
        lengths = dict(task_feature_lengths)
        length = lengths.get("inputs", 0) + lengths["targets"]
        return {"decoder_input_tokens": length, "decoder_target_tokens": length}

    def loss_fn(self, loss_config):
        return _token_loss_fn(objectives.causal_lm_loss, loss_config)

    def forward(self, model, params, batch, rng=None, deterministic=True):
        logits, state = model.apply(
            {"params": params}, batch["decoder_input_tokens"],
            decoder_segment_ids=batch.get("decoder_segment_ids"),
            decoder_positions=batch.get("decoder_positions"),
            decoder_causal_attention=batch.get("decoder_causal_attention"),
            deterministic=deterministic, rngs=objectives.dropout_rngs(rng, deterministic),
            mutable=["intermediates"])
        weights = batch["decoder_loss_weights"]
        return {"logits": logits, "hidden": _final_hidden(state),
                "targets": batch["decoder_target_tokens"], "weights": weights,
                "positions": (weights > 0).astype(jnp.float32)}

    def predict_batch(self, params, batch, *, rng=None, **decode):
        """Continues each row's prompt: the tokens before its first target position
        (``decoder_loss_weights``), left-aligned rows of any prompt length."""
        from t5x_like import decoding
        options = {**DECODE_DEFAULTS, **decode}
        prompts, prompt_lengths = prompts_from_batch(batch)
        return decoding.generate_padded(
            self.model, params, prompts, prompt_lengths,
            max_new_tokens=options["max_decode_length"], rng=rng,
            temperature=options["temperature"], top_k=options["top_k"], top_p=options["top_p"],
            num_beams=options["num_beams"], alpha=options["alpha"],
            eos_id=getattr(self.model.config, "eos_id", decoding.EOS_ID))

    def forward_flops_per_sequence(self, model, lengths):
        d, h, dh, f, v = (model["d_model"], model["num_heads"], model["head_dim"],
                          model["d_ff"], model["vocab_size"])
        s = lengths.get("inputs", 0) + lengths["targets"]
        layers = model["num_layers"]
        matmuls = _layer_matmuls(d, h, dh, f, model["mlp_activations"],
                                 kv_heads=model.get("num_kv_heads") or h)
        return 2 * s * layers * matmuls + 4 * layers * s * s * h * dh + 2 * s * d * v


def prompts_from_batch(batch) -> tuple[jax.Array, jax.Array]:
    """``(tokens, lengths)``: each row's prompt is its decoder input tokens up to the first
    position whose output is a target (``decoder_loss_weights`` > 0): the start token and
    the inputs for a prefix LM, the start token alone for a causal LM."""
    weights = batch["decoder_loss_weights"]
    first_target = jnp.argmax(weights > 0, axis=-1)
    has_target = weights.sum(axis=-1) > 0
    nonpad = (batch["decoder_target_tokens"] != 0).sum(axis=-1)
    return batch["decoder_input_tokens"], jnp.where(has_target, first_target, nonpad) + 1


class EncoderStructure(Structure):
    """BERT-style encoders: masked LM; scoring sums the log-likelihood of the original
    tokens at the masked positions. They do not generate: fine-tune a head to predict."""

    name = "encoder"
    weights_feature = "encoder_loss_weights"
    targets_feature = "encoder_target_tokens"

    def feature_converter(self, task_feature_lengths, pack=False):
        from t5x_like.data import feature_converters
        config = getattr(self.model, "config", None)  # Longformer's global tokens
        return feature_converters.EncoderFeatureConverter(
            pack=pack, global_attention=bool(getattr(config, "global_attention", False)))

    def model_feature_lengths(self, task_feature_lengths):
        length = dict(task_feature_lengths)["inputs"]
        return {"encoder_input_tokens": length, "encoder_target_tokens": length}

    def loss_fn(self, loss_config):
        label_smoothing = float(loss_config.label_smoothing)  # BERT's objective has no z-loss

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
            return objectives.masked_lm_loss(model, params, batch, rng, deterministic=rng is None,
                                             label_smoothing=label_smoothing,
                                             normalizer=normalizer, num_sequences=num_sequences)
        return loss_fn

    def forward(self, model, params, batch, rng=None, deterministic=True):
        out = model.apply(
            {"params": params}, batch["encoder_input_tokens"],
            token_type_ids=batch.get("encoder_token_type_ids"),
            segment_ids=batch.get("encoder_segment_ids"),
            positions=batch.get("encoder_positions"),
            span_mask=batch["encoder_loss_weights"] > 0,
            global_attention_mask=batch.get("encoder_global_attention_mask"),
            deterministic=deterministic,
            rngs=objectives.dropout_rngs(rng, deterministic))
        real = batch["encoder_input_tokens"] != model.config.pad_id
        return {"logits": out["mlm_logits"], "hidden": out["hidden"],
                "targets": batch["encoder_target_tokens"],
                "weights": batch["encoder_loss_weights"], "positions": real.astype(jnp.float32)}

    def predict_batch(self, params, batch, *, rng=None, **decode):
        raise ValueError("A masked-LM encoder does not generate text; evaluate it with "
                         "--mode=score, or fine-tune a head (models.heads) for labels.")

    def forward_flops_per_sequence(self, model, lengths):
        return _encoder_flops(model, lengths["inputs"], model.get("embedding_dim") or 0)


def _encoder_flops(model, s: int, embedding_dim: int, head: str = "mlm") -> float:
    """A BERT encoder over ``s`` tokens: its layers, the projection from factorized
    embeddings (``embedding_dim`` > 0, ALBERT and ELECTRA), and its output head: the
    masked-LM transform and tied vocabulary projection, or ELECTRA's replaced-token
    head (a ``d x d`` layer and one logit)."""
    d, h, dh, f, v = (model["d_model"], model["num_heads"], model["head_dim"], model["d_ff"],
                      model["vocab_size"])
    layers = model["num_layers"]
    e = embedding_dim or d
    projection = 2 * s * e * d if embedding_dim else 0
    # Local attention (Longformer) scores each token against 2 w - 1 keys, not s.
    window = model.get("attention_window") or 0
    keys = min(s, 2 * window - 1) if window else s
    body = (2 * s * layers * _layer_matmuls(d, h, dh, f, model["mlp_activations"])
            + 4 * layers * s * keys * h * dh + projection)
    if head == "replaced_token":
        return body + 2 * s * d * d + 2 * s * d
    return body + 2 * s * d * e + 2 * s * e * v


class ElectraStructure(EncoderStructure):
    """ELECTRA: masked-LM batches (as BERT's); the objective adds replaced-token
    detection (``objectives.electra_loss``). Scoring uses the generator's masked-LM
    head; fine-tuning heads read the discriminator."""

    def loss_fn(self, loss_config):
        label_smoothing = float(loss_config.label_smoothing)

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
            return objectives.electra_loss(model, params, batch, rng, deterministic=rng is None,
                                           label_smoothing=label_smoothing,
                                           normalizer=normalizer, num_sequences=num_sequences)
        return loss_fn

    def logits(self, params, batch):
        return self.model.apply(
            {"params": params}, batch["encoder_input_tokens"],
            token_type_ids=batch.get("encoder_token_type_ids"),
            segment_ids=batch.get("encoder_segment_ids"),
            positions=batch.get("encoder_positions"))["mlm_logits"]

    def forward_flops_per_sequence(self, model, lengths):
        """Both towers over every token: the generator with its vocabulary projection,
        the discriminator with its one-logit head."""
        s = lengths["inputs"]
        e = model.get("embedding_dim") or model["d_model"]
        generator = dict(model, **{k: model[f"generator_{k}"] for k in (
            "d_model", "num_heads", "head_dim", "d_ff", "num_layers")})
        flops = _encoder_flops(model, s, 0 if e == model["d_model"] else e, "replaced_token")
        if generator["d_model"]:
            flops += _encoder_flops(generator, s, 0 if e == generator["d_model"] else e)
        return flops


class BilmStructure(DecoderStructure):
    """ELMo's biLM: causal-LM batches (``DecoderFeatureConverter``, unpacked), read as one
    token sequence (``decoder_target_tokens``); the objective is the mean of the forward
    and backward LM cross-entropies (``objectives.bilm_loss``). Scoring sums the forward
    LM's log-likelihood. A biLM does not generate."""

    name = "bilm"

    def loss_fn(self, loss_config):
        return _token_loss_fn(objectives.bilm_loss, loss_config)

    def forward(self, model, params, batch, rng=None, deterministic=True):
        tokens = batch["decoder_target_tokens"]
        out = model.apply({"params": params}, tokens, deterministic=deterministic,
                          rngs=objectives.dropout_rngs(rng, deterministic), return_layers=True)
        fwd_t, fwd_w, _, _ = bilm_objective.lm_targets(tokens, model.config.pad_id)
        return {"logits": out["forward_logits"], "hidden": out["layers"][-1],
                "targets": fwd_t, "weights": fwd_w,
                "positions": (tokens != model.config.pad_id).astype(jnp.float32)}

    def score_batch(self, params, batch):
        out = self.forward(self.model, params, batch)
        return _target_log_likelihood(out["logits"], out["targets"], out["weights"])

    def predict_batch(self, params, batch, *, rng=None, **decode):
        raise ValueError("A bidirectional LM (model.family='bilm') does not generate text; "
                         "evaluate it with --mode=score, or use its features (ELMo).")

    def forward_flops_per_sequence(self, model, lengths):
        """Matmul FLOPs per sequence: char CNN, both directions' LSTMPs, the softmax
        for both directions."""
        s = lengths.get("inputs", 0) + lengths["targets"]
        e, c, p = model["char_embed_dim"], model["max_chars"], model["projection_dim"]
        widths, counts = tuple(model["filter_widths"]), tuple(model["filter_counts"])
        n = sum(counts)
        cnn = sum(2 * (c - w + 1) * w * e * k for w, k in zip(widths, counts, strict=False))
        cnn += model["num_highway"] * 2 * n * 2 * n + 2 * n * p
        lstm = 2 * model["num_layers"] * (2 * (2 * p) * 4 * model["lstm_dim"]
                                          + 2 * model["lstm_dim"] * p)
        return s * (cnn + lstm + 2 * 2 * p * model["vocab_size"])


STRUCTURE_CLASSES = {"encoder_decoder": EncoderDecoderStructure, "decoder": DecoderStructure,
                     "encoder": EncoderStructure}


# Families whose objective differs from their structure's (their batches do not).
FAMILY_STRUCTURE_CLASSES = {"electra": ElectraStructure, "bilm": BilmStructure}


def structure_class(family: str) -> type[Structure]:
    from t5x_like import models
    return FAMILY_STRUCTURE_CLASSES.get(family) or STRUCTURE_CLASSES[models.structure(family)]


@functools.lru_cache(maxsize=32)
def _cached(family_items: tuple, prefix_attention: str, peft_settings) -> Structure:
    from t5x_like import models
    from t5x_like.models import peft
    model_config = dict(family_items)
    cls = structure_class(model_config["family"])
    model = peft.with_peft(models.build_model(model_config), peft_settings)
    if cls is DecoderStructure:
        return cls(model, prefix_attention)
    return cls(model)


def for_config(config) -> Structure:
    """The structure (with its model) a run config describes (``config.model``, and
    ``config.prefix_attention`` for decoders); with ``config.head.kind`` set, a
    fine-tuning head on that body (``models.head_structure``). ``config.peft``'s added
    modules (LoRA, adapters, prefixes, prompts) join the outermost model (``models.peft``)."""
    from t5x_like.models import peft
    model_config = dict(config.model)
    if model_config.get("mlp_activations") is not None:
        model_config["mlp_activations"] = tuple(model_config["mlp_activations"])
    prefix_attention = config.get("prefix_attention", "bidirectional")
    settings = peft.PeftSettings.from_config(config.get("peft"))
    head = dict(config.get("head") or {})
    model_items = tuple(sorted((k, _hashable(v)) for k, v in model_config.items()))
    if not head.get("kind"):
        return _cached(model_items, prefix_attention, settings)
    body = _cached(model_items, prefix_attention, peft.PeftSettings())
    return _cached_head(body, tuple(sorted((k, _hashable(v)) for k, v in head.items())),
                        config.task, settings)


@functools.lru_cache(maxsize=32)
def _cached_head(body: Structure, head_items: tuple, task_name: str,
                 peft_settings) -> Structure:
    from t5x_like.data import get_task_or_mixture
    from t5x_like.models import peft
    from t5x_like.models.head_structure import HeadStructure
    head = dict(head_items)  # config_lib.validate has refused encoder-decoder bodies
    vocabulary = get_task_or_mixture(task_name).vocabulary
    structure = HeadStructure(body, head, head.get("labels", ()), vocabulary)
    structure.model = peft.with_peft(structure.model, peft_settings)
    return structure


def _hashable(value):
    return tuple(value) if isinstance(value, (list, tuple, np.ndarray)) else value
