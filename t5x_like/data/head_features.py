"""Task examples -> the batches of a fine-tuning head (``models.heads``).

Text-to-text tasks keep their text (``inputs_pretokenized``/``targets_pretokenized``)
and the fields a head needs; this converter turns them into ``input_tokens`` and
labels, so one registered task trains a text-to-text model and a head alike:

- ``classification``: the target text's index in ``labels`` (``labels [batch]``);
- ``regression``: the target text as a float (STS-B);
- ``token_classification``: examples with ``words`` and ``tags`` lists; each word's
  first piece carries its tag's index, later pieces weight 0 (BERT's NER recipe);
- ``span_extraction``: examples with ``question``, ``context`` and ``answers`` (SQuAD's
  fields); the context is encoded as text before, inside and after the first answer's
  first occurrence, so the answer is a whole number of pieces.

Encoder bodies read ``[CLS] x [SEP]`` (``[CLS] question [SEP] context [SEP]`` for spans);
decoder bodies read the tokens as they are, pooled at the last real token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from t5x_like.data.feature_converters import pad_or_trim
from t5x_like.data.preprocessors.text import as_text
from t5x_like.errors import DataError, MissingField

KINDS = ("classification", "regression", "token_classification", "span_extraction")


def _strings(value) -> list[str]:
    """A list feature (``words``, ``tags``, ``answers``) or a lone string, as texts."""
    if isinstance(value, (str, bytes)):
        return [as_text(value)]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1).tolist()
    return [as_text(v) for v in value]


class HeadFeatureConverter:
    """Examples -> ``input_tokens``, ``token_type_ids`` and the head's labels.

    ``strict=False`` (evaluation) gives an unknown label id -1 instead of refusing the
    example: predictions are compared with the target text, not with the id.
    """

    pack = False

    def __init__(self, kind: str, vocabulary, labels: Sequence[str] = (), *,
                 wrap_cls_sep: bool = True, strict: bool = True):
        if kind not in KINDS:
            raise ValueError(f"Unknown head kind {kind!r}; choose from {KINDS}.")
        if kind in ("classification", "token_classification") and not labels:
            raise ValueError(f"A {kind} head needs its label names (head.labels).")
        self.kind = kind
        self.vocabulary = vocabulary
        self.labels = list(labels)
        self._index = {label: i for i, label in enumerate(self.labels)}
        self.wrap_cls_sep = wrap_cls_sep
        self.strict = strict
        if wrap_cls_sep:
            for name in ("cls_id", "sep_id"):
                if getattr(vocabulary, name, None) is None:
                    raise ValueError(f"An encoder head reads [CLS] x [SEP], but the vocabulary "
                                     f"has no {name}; use a vocabulary with BERT's special "
                                     "tokens (the embedded SentencePiece model has them).")

    def __repr__(self):
        return f"HeadFeatureConverter(kind={self.kind!r}, labels={len(self.labels)})"

    # -- layout ---------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return [int(t) for t in self.vocabulary.encode(text)]

    def _wrap(self, first: list[int], length: int, second: list[int] | None = None
              ) -> tuple[list[int], list[int], int, int, int]:
        """``(tokens, token_types, offset of first[0], kept of first, kept of second)``:
        the pieces are trimmed, never the special tokens (BERT keeps the closing [SEP])."""
        if self.wrap_cls_sep:
            specials = 2 if second is None else 3
        else:
            specials = 0 if second is None else 1
        room = max(length - specials, 0)
        first = first[:room]
        second = None if second is None else second[:room - len(first)]
        if self.wrap_cls_sep:
            cls, sep = self.vocabulary.cls_id, self.vocabulary.sep_id
            tokens, offset = [cls] + first + [sep], 1
        else:
            tokens, offset = list(first), 0
        types = [0] * len(tokens)
        if second is not None:
            tail = second + [sep] if self.wrap_cls_sep else [self.vocabulary.eos_id] + second
            tokens += tail
            types += [1] * len(tail)
        return tokens, types, offset, len(first), len(second or [])

    def _label_id(self, text: str) -> int:
        if text in self._index:
            return self._index[text]
        if not self.strict:
            return -1
        raise DataError(f"Label {text!r} is not one of the head's {len(self.labels)} labels "
                        f"({self.labels[:8]}{'...' if len(self.labels) > 8 else ''}). Set "
                        "head.labels to every label of the task, or leave it empty to take "
                        "them from the train split.", field="targets", value=text)

    # -- conversion -----------------------------------------------------------------------
    def convert_example(self, example: Mapping, task_feature_lengths: Mapping[str, int]) -> dict:
        if "inputs" not in task_feature_lengths:
            raise ValueError("A head reads task_feature_lengths['inputs'] tokens; got "
                             f"{dict(task_feature_lengths)}.")
        length = int(task_feature_lengths["inputs"])
        convert = {"token_classification": self._tagging,
                   "span_extraction": self._span}.get(self.kind, self._sequence)
        return convert(example, length)

    def __call__(self, examples, task_feature_lengths):
        if isinstance(examples, Mapping):
            return self.convert_example(examples, task_feature_lengths)
        return [self.convert_example(ex, task_feature_lengths) for ex in examples]

    def apply(self, ds, task_feature_lengths):
        """The grain pipeline's hook (``pipeline.build_dataset``)."""
        return ds.map(lambda ex: self.convert_example(ex, task_feature_lengths))

    def _row(self, tokens, types, length) -> dict:
        return {"input_tokens": pad_or_trim(tokens, length),
                "token_type_ids": pad_or_trim(types, length)}

    def _sequence(self, example, length):
        if "inputs_pretokenized" not in example:
            raise KeyError("A classification head encodes 'inputs_pretokenized'; tokenize the "
                           "task with pp.Tokenize(copy_pretokenized=True).")
        tokens, types, *_ = self._wrap(self._encode(as_text(example["inputs_pretokenized"])),
                                       length)
        row = self._row(tokens, types, length)
        target = as_text(example.get("targets_pretokenized", ""))
        if self.kind == "regression":
            try:
                row["labels"] = np.float32(float(target))
            except ValueError:
                raise DataError(f"A regression head needs numeric targets; got {target!r}. "
                                "Use head.kind=classification for label words.",
                                field="targets", value=target) from None
        else:
            row["labels"] = np.int32(self._label_id(target))
        return row

    def _tagging(self, example, length):
        if not self.strict and "words" not in example and "inputs_pretokenized" in example:
            # Predicting for raw text: its whitespace-separated words, no tags.
            example = dict(example, words=as_text(example["inputs_pretokenized"]).split())
        if "words" not in example or ("tags" not in example and self.strict):
            raise MissingField("A token_classification head needs examples with 'words' and "
                               f"'tags' lists (as embedded_ud_pos has); this one has "
                               f"{sorted(example)}.", field="tags", lacks=("words", "tags"))
        words = _strings(example["words"])
        tags = _strings(example["tags"]) if "tags" in example else [""] * len(words)
        pieces, labels, weights = [], [], []
        for word, tag in zip(words, tags, strict=True):
            ids = self._encode(word) or [self.vocabulary.unk_id]
            pieces += ids
            labels += [max(self._label_id(tag), 0)] + [0] * (len(ids) - 1)
            weights += [1.0] + [0.0] * (len(ids) - 1)
        tokens, types, offset, kept, _ = self._wrap(pieces, length)
        row = self._row(tokens, types, length)
        label_row = np.zeros(length, np.int32)
        weight_row = np.zeros(length, np.float32)
        label_row[offset:offset + kept] = labels[:kept]
        weight_row[offset:offset + kept] = weights[:kept]
        row.update(labels=label_row, label_weights=weight_row)
        return row

    def _span(self, example, length):
        for key in ("question", "context"):
            if key not in example:
                raise MissingField(f"A span_extraction head needs examples with 'question', "
                                   f"'context' and 'answers'; this one lacks {key!r}.",
                                   field=key, lacks=(key,))
        question, context = as_text(example["question"]), as_text(example["context"])
        answers = _strings(example.get("answers", []))
        start_char, answer = next(((context.find(a), a) for a in answers if a and a in context),
                                  (-1, ""))
        if start_char >= 0:
            before = self._encode(context[:start_char].rstrip()) if start_char else []
            inside = self._encode(answer)
            after = self._encode(context[start_char + len(answer):])
        else:
            before, inside, after = self._encode(context), [], []
        question_ids = self._encode(question)
        tokens, types, offset, kept_question, kept_context = self._wrap(
            question_ids, length, before + inside + after)
        row = self._row(tokens, types, length)
        context_start = offset + kept_question + 1
        mask = np.zeros(length, np.int32)
        mask[context_start:context_start + kept_context] = 1
        start = context_start + len(before)
        end = start + len(inside) - 1
        if not inside or len(before) + len(inside) > kept_context:
            start = end = 0  # no answer in the window: point at the first token, as BERT does
        row.update(context_mask=mask, start_positions=np.int32(start),
                   end_positions=np.int32(end))
        return row

    # -- shapes -----------------------------------------------------------------------------
    def model_feature_lengths(self, task_feature_lengths) -> dict[str, int]:
        length = int(task_feature_lengths["inputs"])
        return {"input_tokens": length}

    def abstract_features(self, length: int) -> dict[str, tuple[tuple, type]]:
        """Name -> (per-example shape, dtype) of every feature this converter emits."""
        features = {"input_tokens": ((length,), np.int32), "token_type_ids": ((length,), np.int32)}
        if self.kind == "classification":
            features["labels"] = ((), np.int32)
        elif self.kind == "regression":
            features["labels"] = ((), np.float32)
        elif self.kind == "token_classification":
            features.update(labels=((length,), np.int32), label_weights=((length,), np.float32))
        else:
            features.update(context_mask=((length,), np.int32), start_positions=((), np.int32),
                            end_positions=((), np.int32))
        return features


def labels_from_task(task, kind: str, split: str = "train") -> list[str]:
    """The label names a head predicts: the task's ``label_options`` when it has them,
    else every distinct target text (classification) or tag (tagging) of ``split``,
    sorted, so the same task gives the same label ids on every run."""
    if kind == "classification" and task.label_options:
        return list(task.label_options)
    if kind not in ("classification", "token_classification"):
        return []
    if split not in task.splits:
        raise ValueError(f"Task {task.name!r} has no {split!r} split to read its labels from; "
                         "set head.labels.")
    seen = set()
    lengths = {name: 1 << 16 for name in task.output_features}
    for example in task.get_dataset(split, lengths, shuffle=False, num_epochs=1):
        if kind == "classification":
            seen.add(as_text(example["targets_pretokenized"]))
        elif "tags" in example:
            seen.update(_strings(example["tags"]))
    if not seen:
        raise DataError(f"Task {task.name!r} yielded no labels from its {split!r} split; "
                        "set head.labels.")
    return sorted(seen)
