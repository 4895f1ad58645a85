"""Decoder-only language models: causal or prefix LM batches, generation from a prompt."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.data import feature_converters
from t5x_like.errors import ConfigError, UserError
from t5x_like.models import decoding
from t5x_like.structures.base import (
    DECODE_DEFAULTS,
    Structure,
    _stack_matmuls,
    _token_loss_fn,
    dropout_rngs,
)


def start_id(model) -> int:
    """The id a decoder's rows start with (``model.bos_id``). A spec no run resolved
    (``-1``: a model built outside ``train``, e.g. in a unit test) reads 0."""
    return max(int(getattr(model, "bos_id", 0)), 0)


def vocabulary_start_id(vocabulary) -> int:
    """A new decoder run's start id: the vocabulary's BOS, else its EOS; never its pad."""
    pad = getattr(vocabulary, "pad_id", None)
    for candidate in (getattr(vocabulary, "bos_id", None), getattr(vocabulary, "eos_id", None)):
        if candidate is not None and candidate >= 0 and candidate != pad:
            return int(candidate)
    raise ConfigError(f"The vocabulary {type(vocabulary).__name__} has no BOS or EOS apart from "
                      "its pad id to start a decoder's rows with; set --config.model.bos_id.")


class DecoderStructure(Structure):
    """GPT-style decoders: one sequence, causal LM; with ``inputs`` a prefix LM whose
    loss covers the targets only (``prefix_attention``: ``bidirectional`` as seqio's
    prefix LM, or ``causal`` as GPT fine-tuning and lm-evaluation-harness condition)."""

    name = "decoder"
    scores_choices_as_lm_eval = True
    generates_after_prompt = True
    decodes_with_engine = True
    chunks_logits = True
    depth_keys = ("num_layers",)

    @classmethod
    def pretrained_lengths(cls, spec):
        """The default lengths do not fit a small decoder's learned positions: a prompt of
        3/4 of them and a continuation of the rest (--inputs_length and --targets_length
        change it; k-shot scoring reads their sum)."""
        width = cls.learned_positions(spec.model)
        if width and sum(spec.task_feature_lengths.values()) > width:
            return {"inputs": width - width // 4, "targets": width // 4}
        return None

    @classmethod
    def text_framing(cls, vocabulary):
        """``EOS text``: EOS ends every document of the LM stream, so a text after it reads
        as a document's start."""
        return ([int(vocabulary.eos_id)] if vocabulary.eos_id is not None else []), []

    @classmethod
    def prompt_framing(cls, spec, vocabulary):
        """``START text EOS`` where the run trained on inputs (a prefix LM, an SFT recipe:
        its tasks end the inputs with EOS, and the targets follow); ``START text`` for a
        language model, whose prompt is a text to continue."""
        suffix = ([int(vocabulary.eos_id)] if "inputs" in spec.task_feature_lengths
                  and vocabulary.eos_id is not None else [])
        return [start_id(spec.model)], suffix

    @classmethod
    def tokenizer_framing(cls, spec, vocabulary):
        """``START text``: a causal LM's tokenizer adds no EOS after a text, as lm-eval
        and TRL split a context from its continuation by encoding both (an EOS after
        every text would land inside the row). A prompt that ends with EOS travels as
        the chat template (``chat_framing``)."""
        return [start_id(spec.model)], []

    def text_prefix(self):
        return (start_id(self.model.config),)

    @classmethod
    def chat_framing(cls, spec, vocabulary):
        """For a run trained on inputs, the prompt its tasks built (``START text EOS``)
        around a user's message, so ``apply_chat_template(..., add_generation_prompt=True)``
        and the text-generation pipeline on messages give the model's prompt."""
        prefix, suffix = cls.prompt_framing(spec, vocabulary)
        return (prefix, suffix) if suffix else None

    @classmethod
    def with_start_id(cls, spec, vocabulary, saved_start: int | None = None):
        """``model.bos_id=-1`` decided: ``saved_start`` when the run resumes or starts from
        a checkpoint (the id that model read first), else the vocabulary's BOS, its EOS
        where it has no BOS of its own (GPT-2's ``<|endoftext|>`` is both). Never the pad
        id: transformers' ``generate`` without an attention mask, and TRL, mask every pad
        id, a prompt's first token included. (Runs before this convention started with
        0, the pad id; their checkpoints keep it.)"""
        if getattr(spec.model, "bos_id", 0) >= 0:  # decided (ELMo's bilm has no start id)
            return spec
        start = saved_start if saved_start is not None else vocabulary_start_id(vocabulary)
        return spec.replace(model=spec.model.replace(bos_id=int(start)))

    @classmethod
    def positions_needed(cls, config, lengths):
        if not cls.learned_positions(config.model):
            return 0  # rotary positions have no learned limit
        return sum(lengths.values())

    @classmethod
    def check_eval_lengths(cls, config, lengths, tasks, few_shot=False):
        """A decoder trained without inputs cannot read a task's inputs (few-shot scoring
        reads them as text in its own window); all tokens share its positions."""
        with_inputs = [t.name for t in tasks if "inputs" in t.output_features]
        if with_inputs and "inputs" not in lengths and not few_shot:
            limit = cls.learned_positions(config.model)
            within = (f" (their sum at most model.positions.max_length={limit})"
                      if limit else "")
            raise UserError(
                f"Task {with_inputs[0]!r} has inputs, and this decoder's lengths "
                f"{lengths} have none; give both, e.g. --inputs_length=128 --targets_length=32"
                f"{within}.")
        super().check_eval_lengths(config, lengths, tasks, few_shot)

    @classmethod
    def check_decoding(cls, config, num_beams: int) -> None:
        attention = getattr(config.model, "attention", None)
        if num_beams > 1 and len(set(getattr(attention, "layer_types", ()))) > 1:
            raise UserError(f"--num_beams={num_beams}: beam search lays out its cache with one "
                            "attention window for every layer, and this model alternates "
                            "sliding and full layers (model.layer_types); decode greedily "
                            "with --num_beams=1, or sample with --temperature.")

    @classmethod
    def evaluate_as_trained(cls, spec, saved, imported):
        """Scores are log-likelihoods under the attention the checkpoint was trained with:
        causal for an imported causal LM and for a run trained without inputs (or with
        a causal prefix), bidirectional only where the run trained a bidirectional
        prefix. (``saved``: the checkpoint's config, in the sectioned layout.)"""
        trained = saved.get("data", {}).get("prefix_attention", "bidirectional")
        trained_prefix = (not imported and "inputs" in saved.get("task_feature_lengths", {})
                          and trained == "bidirectional")
        attention = "bidirectional" if trained_prefix else "causal"
        return spec.replace(data=spec.data.replace(prefix_attention=attention))

    @classmethod
    def evaluation_line(cls, config):
        start = start_id(config.model)
        return (f"decoder: prompts read with {config.data.prefix_attention} attention, rows start "
                f"with id {start}")

    @classmethod
    def for_model(cls, model, prefix_attention="bidirectional"):
        return cls(model, prefix_attention)

    def __init__(self, model, prefix_attention: str = "bidirectional"):
        super().__init__(model)
        if prefix_attention not in ("bidirectional", "causal"):
            raise ValueError(f"prefix_attention={prefix_attention!r}; use 'bidirectional' "
                             "or 'causal'.")
        self.prefix_attention = prefix_attention

    def feature_converter(self, task_feature_lengths, pack=False):
        return feature_converters.DecoderFeatureConverter(
            pack=pack, prefix_lm="inputs" in task_feature_lengths,
            bidirectional_prefix=self.prefix_attention == "bidirectional",
            start_id=start_id(self.model.config))

    def model_feature_lengths(self, task_feature_lengths):
        lengths = dict(task_feature_lengths)
        length = lengths.get("inputs", 0) + lengths["targets"]
        return {"decoder_input_tokens": length, "decoder_target_tokens": length}

    def apply_model(self, model, params, batch, rng=None, deterministic=True, **options):
        """Next-token logits ``[batch, length, vocab]`` (prefix LM: the same, with
        ``decoder_causal_attention`` marking the prefix; ``options`` go to
        ``model.apply``, e.g. ``mutable``)."""
        return model.apply({"params": params}, batch["decoder_input_tokens"],
                           decoder_segment_ids=batch.get("decoder_segment_ids"),
                           decoder_positions=batch.get("decoder_positions"),
                           decoder_causal_attention=batch.get("decoder_causal_attention"),
                           deterministic=deterministic, rngs=dropout_rngs(rng, deterministic),
                           **options)

    def loss_fn(self, loss_config):
        return _token_loss_fn(self, loss_config)

    def project_logits(self, model, params, hidden):
        return model.apply({"params": params}, None, project_hidden=hidden)

    def predict_batch(self, params, batch, *, rng=None, **decode):
        """Continues each row's prompt: the tokens before its first target position
        (``decoder_loss_weights``), left-aligned rows of any prompt length."""
        options = {**DECODE_DEFAULTS, **decode}
        prompts, prompt_lengths = prompts_from_batch(batch)
        return decoding.generate_padded(
            self.model, params, prompts, prompt_lengths,
            max_new_tokens=options["max_decode_length"], rng=rng,
            temperature=options["temperature"], top_k=options["top_k"], top_p=options["top_p"],
            num_beams=options["num_beams"], alpha=options["alpha"],
            eos_id=getattr(self.model.config, "eos_id", decoding.EOS_ID))

    def engine_decoder(self, params):
        """The decoder itself, its params and EOS; a plug-in module that reads no paged
        cache is refused in one line."""
        try:
            decoding.check_paged(self.model)
        except decoding.UnpagedModel as e:
            raise UserError(f"--sampler=engine: {e} Use --sampler=static.") from None
        return self.model, params, getattr(self.model.config, "eos_id", decoding.EOS_ID)

    def engine_prompts(self, batch):
        """``predict_batch``'s prompts (``prompts_from_batch``), each cut to its length."""
        tokens, lengths = (np.asarray(x) for x in prompts_from_batch(batch))
        return [row[:n] for row, n in zip(tokens, lengths, strict=True)]

    def decode_step(self, batch_size, lengths):
        """A step of ``decoding.generate_padded``: one token per row, its position, and
        the mask of the cache's real positions."""
        model, total = self.model, sum(lengths.values())
        cache = jax.eval_shape(lambda: decoding.init_decoder_cache(model, batch_size, total))
        token = jax.ShapeDtypeStruct((batch_size, 1), jnp.int32)
        valid = jax.ShapeDtypeStruct((batch_size, total), jnp.int32)

        def step(params, cache, token, position, valid):
            logits, variables = model.apply(
                {"params": params, "cache": cache}, token, decode=True, max_decode_length=total,
                decoder_positions=position, decoder_segment_ids=valid, mutable=["cache"])
            return logits, variables["cache"]
        return step, cache, (token, token, valid)

    def paged_decode_step(self, slots, max_length, page_size, pages):
        """The engine's decode step: each slot's token and position, and its page table
        (``ceil(max_length / page_size)`` pages), over the pool (a cache of ``pages``
        of ``page_size`` positions: ``decoding.init_page_pool``, as the engine makes it);
        the greedy token out (the engine's sampling adds a pass over the logits)."""
        model, per_row = self.model, -(-max_length // page_size)
        try:
            decoding.check_paged(model)
        except decoding.UnpagedModel as e:
            raise UserError(f"{e} Leave out --page_size.") from None
        cache = jax.eval_shape(lambda: decoding.init_page_pool(model, pages, page_size))
        row = jax.ShapeDtypeStruct((slots,), jnp.int32)
        table = jax.ShapeDtypeStruct((slots, per_row), jnp.int32)

        def step(params, cache, tokens, positions, table):
            logits, cache = decoding.paged_forward(model, params, cache, tokens[:, None],
                                                   positions[:, None], table, page_size)
            return jnp.argmax(logits[:, 0], axis=-1), cache
        return step, cache, (row, row, table)

    def forward_flops_per_sequence(self, model, lengths):
        d, h, dh, v = model["d_model"], model["num_heads"], model["head_dim"], model["vocab_size"]
        s = lengths.get("inputs", 0) + lengths["targets"]
        layers = model["num_layers"]
        matmuls = _stack_matmuls(model, layers, kv_heads=model.attention.num_kv_heads or h)
        return 2 * s * matmuls + 4 * layers * s * s * h * dh + 2 * s * d * v


def prompts_from_batch(batch) -> tuple[jax.Array, jax.Array]:
    """``(tokens, lengths)``: each row's prompt is its decoder input tokens up to the first
    position whose output is a target (``decoder_loss_weights`` > 0): the start token and
    the inputs for a prefix LM, the start token alone for a causal LM."""
    weights = batch["decoder_loss_weights"]
    first_target = jnp.argmax(weights > 0, axis=-1)
    has_target = weights.sum(axis=-1) > 0
    nonpad = (batch["decoder_target_tokens"] != 0).sum(axis=-1)
    return batch["decoder_input_tokens"], jnp.where(has_target, first_target, nonpad) + 1
