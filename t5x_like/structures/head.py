"""The structure of a fine-tuning head on an encoder or decoder body (``config.head``).

BERT-style fine-tuning: the body's pretraining objective is set aside and a small
head (``models.heads.WithHead``) is trained on the task's labels. Train, eval and
infer use it as they use the other structures: its converter turns task examples
into ``input_tokens`` and labels (``data/head_features.py``), ``loss_fn`` is the
head's cross entropy (or squared error), and ``predict_batch`` returns label ids,
values, per-token tag ids or answer spans, which ``label_texts`` turns into the text
the task's metrics compare with its targets.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t5x_like import objectives
from t5x_like.data import dataset_providers as dp
from t5x_like.data import get_task_or_mixture, head_features
from t5x_like.data.head_features import HeadFeatureConverter
from t5x_like.errors import ConfigError, DataError, UserError
from t5x_like.models import heads, peft_modules
from t5x_like.structures import families
from t5x_like.structures.base import Structure, dropout_rngs
from t5x_like.structures.mode_structures import ModeStructure, register

LOSSES = {"classification": objectives.classification_loss,
          "regression": objectives.regression_loss,
          "token_classification": objectives.token_classification_loss,
          "span_extraction": objectives.span_extraction_loss}


class HeadStructure(Structure):
    name = "head"
    evaluation_mode = "head"
    writes_text = False
    splits_into_microbatches = False

    def __init__(self, body: Structure, head_config, labels: Sequence[str],
                 vocabulary):
        kind = head_config["kind"]
        self.kind = kind
        self.body = body
        self.labels = list(labels)
        self.vocabulary = vocabulary
        self.max_answer_length = int(head_config.get("max_answer_length", 30))
        num_labels = {"classification": len(self.labels), "regression": 1,
                      "token_classification": len(self.labels), "span_extraction": 2}[kind]
        model_kind = "classification" if kind == "regression" else kind
        super().__init__(heads.WithHead(body.model, heads.HeadConfig(
            kind=model_kind, num_labels=max(num_labels, 1), pooling=head_config["pooling"],
            dropout_rate=float(head_config["dropout_rate"]))))

    @property
    def wraps_cls_sep(self) -> bool:
        return self.body.name == "encoder"

    def params_from_pretrained(self, flat_params: dict) -> dict:
        """The body's share of a pretrained checkpoint (its family's choice,
        ``body_params_for_head``); the head starts fresh."""
        return type(self.body).body_params_for_head(flat_params)

    # -- what eval and infer ask of a checkpoint -----------------------------------------------
    def check_evaluated_tasks(self, name, tasks) -> None:
        if len(tasks) > 1:
            raise UserError(f"A fine-tuned head predicts one task's labels; {name!r} has "
                            f"{len(tasks)} tasks. Evaluate the task it was trained on "
                            "(--task=NAME).")

    def infer_rows(self, examples, task_feature_lengths, eos_id: int) -> list[dict]:
        """Rows of whatever fields the examples hold (no labels needed to predict them)."""
        converter = self.feature_converter(task_feature_lengths, strict=False)
        try:
            return [converter.convert_example(ex, task_feature_lengths) for ex in examples]
        except KeyError as e:
            raise UserError(f"{e.args[0]} Pass --task=NAME for a task with those fields.") from None

    def output_texts(self, outputs, rows, decode) -> list[str]:
        """The label, value, tag or span text of each row."""
        return self.label_texts(outputs, rows)

    # -- data -------------------------------------------------------------------------------
    def feature_converter(self, task_feature_lengths, pack=False, strict=True):
        if pack:
            raise ConfigError("A fine-tuning head reads one example per row; set pack=False.")
        return HeadFeatureConverter(self.kind, self.vocabulary, self.labels,
                                    wrap_cls_sep=self.wraps_cls_sep, strict=strict)

    def model_feature_lengths(self, task_feature_lengths):
        return {"input_tokens": int(dict(task_feature_lengths)["inputs"])}

    def abstract_batch(self, task_feature_lengths, batch_size, sharding=None):
        converter = self.feature_converter(task_feature_lengths)
        length = int(dict(task_feature_lengths)["inputs"])
        return {name: jax.ShapeDtypeStruct((batch_size, *shape), dtype, sharding=sharding)
                for name, (shape, dtype) in converter.abstract_features(length).items()}

    # -- objectives -------------------------------------------------------------------------
    def loss_fn(self, loss_config):
        head_loss = LOSSES[self.kind]

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
            # The head losses are means over the examples (or their tagged tokens); gradient
            # accumulation is refused for heads in config validation. A row of padding
            # only (evaluation's last batch) is no example.
            row_weights = (batch["input_tokens"] != 0).any(axis=-1).astype(jnp.float32)
            loss, metrics = head_loss(self.apply_model(model, params, batch, rng,
                                                       deterministic=rng is None), batch,
                                      row_weights)
            if "label_weights" in batch:
                count = batch["label_weights"].sum()
            else:
                count = row_weights.sum()
            metrics = dict(metrics, num_target_tokens=count)
            metrics.setdefault("accuracy", jnp.zeros((), jnp.float32))
            return loss, metrics
        return loss_fn

    def apply_model(self, model, params, batch, rng=None, deterministic=True):
        """The head's outputs: logits per label, per token, or span start and end."""
        return model.apply({"params": params}, batch["input_tokens"], batch.get("token_type_ids"),
                           deterministic=deterministic, rngs=dropout_rngs(rng, deterministic))

    def logits(self, params, batch):
        return self.apply_model(self.model, params, batch)

    def score_batch(self, params, batch):
        raise ValueError("A head model predicts labels; it has no target log-likelihood to "
                         "score. Evaluate it in predict mode (the default).")

    def predict_batch(self, params, batch, *, rng=None, **decode):
        """Label ids ``[batch]``, values ``[batch]`` (regression), tag ids ``[batch, length]``
        or answer spans ``[batch, 2]`` (start, end; the best-scoring pair inside the context
        with end >= start and at most ``max_answer_length`` tokens)."""
        out = self.logits(params, batch)
        if self.kind == "regression":
            return out[:, 0]
        if self.kind != "span_extraction":
            return jnp.argmax(out, axis=-1).astype(jnp.int32)
        inside = batch["context_mask"] > 0
        start = jnp.where(inside, out["start_logits"], -jnp.inf)
        end = jnp.where(inside, out["end_logits"], -jnp.inf)
        length = start.shape[1]
        offsets = jnp.arange(length)[None, :] - jnp.arange(length)[:, None]  # end - start
        allowed = (offsets >= 0) & (offsets < self.max_answer_length)
        pair = jnp.where(allowed[None], start[:, :, None] + end[:, None, :], -jnp.inf)
        best = jnp.argmax(pair.reshape(pair.shape[0], -1), axis=-1)
        return jnp.stack([best // length, best % length], axis=-1).astype(jnp.int32)

    def label_texts(self, predictions: np.ndarray, rows: Sequence[dict]) -> list[str]:
        """Model outputs -> the text a text-to-text model would have written."""
        if self.kind == "regression":
            return [f"{float(value):g}" for value in predictions]
        if self.kind == "classification":
            return [self.labels[int(i)] for i in predictions]
        if self.kind == "token_classification":
            return [" ".join(self.labels[int(t)] for t, w in zip(tags, row["label_weights"], strict=False)
                             if w > 0) for tags, row in zip(predictions, rows, strict=False)]
        texts = []
        for (start, end), row in zip(predictions, rows, strict=False):
            tokens = np.asarray(row["input_tokens"])[int(start):int(end) + 1]
            texts.append(self.vocabulary.decode([int(t) for t in tokens]))
        return texts

    def forward_flops_per_sequence(self, model, lengths):
        # The body without its vocabulary projection (the head's outputs are tiny).
        length = int(lengths["inputs"])
        body_lengths = {"inputs": length} if self.body.name == "encoder" else {"targets": length}
        return self.body.forward_flops_per_sequence(model.replace(vocab_size=0), body_lengths)


def check_head_features(spec, reads: str) -> None:
    """A fine-tuning head or a reward model reads its body's ``head_features`` (the final
    hidden states, and a pooled vector where the body has one): a family's module without
    that method is refused when the run resolves, naming what to add, rather than failing
    inside the model. ``reads``: the setting that asks for it."""
    module = families.get(spec.model.family).module
    if not hasattr(module, "head_features"):
        raise ConfigError(
            f"{reads} reads the body's final hidden states, and "
            f"model.family={spec.model.family!r}'s module {module.__module__}."
            f"{module.__qualname__} has no head_features method; add "
            "`head_features(self, input_tokens, token_type_ids=None, deterministic=True) -> "
            "(hidden [batch, length, d_model], pooled or None)` to it (models/decoder.py has "
            "one), or train without a head.")


@functools.lru_cache(maxsize=32)
def _head_on(body: Structure, head, task_name: str, peft_settings) -> Structure:
    """A head on ``body`` (no PEFT inside), with ``peft_settings``' modules on the whole."""
    vocabulary = get_task_or_mixture(task_name).vocabulary
    structure = HeadStructure(body, head, head.labels, vocabulary)
    structure.model = peft_modules.with_peft(structure.model, peft_settings)
    return structure


def _in_head_mode(spec) -> bool:
    return bool(spec.head.kind)


def _wrap(spec, peft_settings) -> Structure:
    body = families.structure_for(spec.model, spec.data.prefix_attention,
                                  peft_modules.PeftSettings())
    return _head_on(body, spec.head, spec.task, peft_settings)


def _check(spec, family_structure) -> None:
    check_head_features(spec, f"head.kind={spec.head.kind!r}")


def with_head_labels(spec):
    """``head.labels`` from the task when the spec leaves them empty, so the saved run
    config names the labels the head's outputs mean (eval and infer read them there)."""
    head = spec.head
    if not head.kind:
        return spec
    provider = dp.get_task_or_mixture(spec.task)
    if isinstance(provider, dp.Mixture):
        raise ConfigError(
            f"head.kind={head.kind!r} trains one head on one task's labels; task "
            f"{spec.task!r} is a mixture. Fine-tune a head per task (--config.task=NAME).")
    if head.kind in ("classification", "token_classification") and not head.labels:
        try:
            labels = tuple(head_features.labels_from_task(provider, head.kind))
        except DataError:
            raise  # a bad row, named as itself
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return spec.replace(head=head.replace(labels=labels))
    return spec


MODE = register(ModeStructure("head", _in_head_mode, wrap=_wrap, check=_check,
                              completed=with_head_labels))
