"""Feature plumbing: rekey, tokenize, append EOS, truncate."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from t5x_like.data.preprocessors.base import Context, ExampleStep
from t5x_like.errors import DataError, MissingField


@dataclasses.dataclass(frozen=True)
class Rekey(ExampleStep):
    """``{new_key: old_key}``; an old key of ``None`` makes an empty string (T5's convention)."""

    uses_rng = False
    may_drop = False

    key_map: Mapping[str, str | None]

    def map(self, example, rng, ctx):
        out = {}
        for new, old in self.key_map.items():
            if old is not None and old not in example:
                raise MissingField(f"Task {ctx.task_name!r}: Rekey wants {old!r} but the example "
                                   f"has {sorted(example)}; fix the key map "
                                   f"{dict(self.key_map)} or the record.", field=old,
                                   lacks=(old,))
            out[new] = "" if old is None else example[old]
        return out


def as_text(value) -> str:
    """Bytes are decoded as UTF-8; invalid bytes become U+FFFD (documented, never a crash)."""
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return as_text(value.item())
    return str(value)


def _check_text(value, key: str, ctx: Context) -> None:
    """Refuses a value that has no text to tokenize: a JSON null, object or list of
    non-integers (a number is read as its digits: a label such as 1 or 3.5 stays text)."""
    if value is None or isinstance(value, Mapping) or isinstance(value, (list, tuple)):
        kind = "null" if value is None else type(value).__name__
        raise DataError(f"Task {ctx.task_name!r}: feature {key!r} is {kind} "
                        f"({str(value)[:60]}), not text; Tokenize reads text or a list of token "
                        "ids. Fix the record, or map the field to text in a step before "
                        "Tokenize.", field=key, value=value)


@dataclasses.dataclass(frozen=True)
class Tokenize(ExampleStep):
    """Text features -> int32 ids with each output feature's vocabulary.

    Examples whose tokenized ``drop_if_empty`` features are empty are skipped
    (empty documents are a documented skip, not an error). ``copy_pretokenized``
    keeps each text as ``<key>_pretokenized`` (seqio's name): evaluation reads the
    target text and the prompt from it.
    """

    uses_rng = False
    may_drop = True

    keys: Sequence[str] | None = None
    drop_if_empty: Sequence[str] | None = None
    copy_pretokenized: bool = False

    def map(self, example, rng, ctx):
        keys = self.keys if self.keys is not None else [
            k for k in ctx.output_features if k in example]
        out = dict(example)
        for key in keys:
            value = example[key]
            if isinstance(value, (list, np.ndarray)) and (
                    np.asarray(value).dtype.kind in "iu" or (isinstance(value, list) and not value)):
                out[key] = np.asarray(value, np.int32)  # already token ids: leave them
                continue
            _check_text(value, key, ctx)
            if self.copy_pretokenized:
                out[f"{key}_pretokenized"] = as_text(value)
            out[key] = np.asarray(ctx.vocabulary(key).encode(as_text(value)), dtype=np.int32)
        must_be_full = keys if self.drop_if_empty is None else self.drop_if_empty
        if any(out[k].size == 0 for k in must_be_full if k in out):
            return None
        return out


@dataclasses.dataclass(frozen=True)
class AppendEos(ExampleStep):
    """Appends EOS to the features whose ``Feature.add_eos`` is true (or to ``keys``)."""

    uses_rng = False
    may_drop = False

    keys: Sequence[str] | None = None

    def map(self, example, rng, ctx):
        keys = self.keys if self.keys is not None else [
            k for k, f in ctx.output_features.items() if f.add_eos and k in example]
        out = dict(example)
        for key in keys:
            eos = ctx.vocabulary(key).eos_id
            out[key] = np.concatenate([np.asarray(example[key], np.int32), [eos]]).astype(np.int32)
        return out


@dataclasses.dataclass(frozen=True)
class Truncate(ExampleStep):
    """Cuts features to their task length (over-long documents are cut, not an error).

    With ``keep_eos`` the last kept token is EOS when the feature was cut, as seqio's
    ``append_eos_after_trim`` does.
    """

    uses_rng = False
    may_drop = False

    keys: Sequence[str] | None = None
    keep_eos: bool = True

    def map(self, example, rng, ctx):
        keys = self.keys if self.keys is not None else [
            k for k in ctx.task_feature_lengths if k in example]
        out = dict(example)
        for key in keys:
            length = ctx.length(key)
            tokens = np.asarray(example[key], np.int32)
            if tokens.size > length:
                tokens = tokens[:length].copy()
                feature = ctx.output_features.get(key)
                if self.keep_eos and feature is not None and feature.add_eos:
                    tokens[-1] = feature.vocabulary.eos_id
            out[key] = tokens
        return out


@dataclasses.dataclass(frozen=True)
class Filter(ExampleStep):
    """Keeps examples for which ``predicate(example)`` is true."""

    uses_rng = False
    may_drop = True

    predicate: object

    def map(self, example, rng, ctx):
        return example if self.predicate(example) else None


def apply_eos(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    return np.concatenate([np.asarray(tokens, np.int32), [eos_id]]).astype(np.int32)


def check_minimum_length(ctx: Context, key: str, minimum: int, objective: str) -> int:
    """The task length of ``key``, or a clear error when the objective cannot fit in it."""
    length = ctx.length(key)
    if length < minimum:
        raise ValueError(
            f"Task {ctx.task_name!r}: {objective} needs task_feature_lengths[{key!r}] >= "
            f"{minimum}, got {length}; raise task_feature_lengths[{key!r}] to {minimum} or more.")
    return length
