"""Texts in, an ``embed`` folder out: framing, truncation between words, length-sorted
batches through the model, pooling into the arrays of ``embedding_files``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from t5x_like.analysis import alignment, embedding_files

# Padded lengths are multiples of this (fewer shapes to compile).
LENGTH_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class TextInput:
    id: object
    text: str
    words: tuple[str, ...]


@dataclasses.dataclass
class Prepared:
    ids: list[int]                     # framed: prefix + text tokens + suffix
    text_span: tuple[int, int]
    word_spans: list[tuple[int, int]]  # framed positions
    words: list[str]
    truncated: bool
    same_as_text_encoding: bool


def prepare(model, item: TextInput) -> Prepared:
    """The model's input for one text, cut between words to fit its positions."""
    prefix, suffix = model.framing
    tokens = alignment.tokenize_words(model.vocabulary, item.words)
    budget = model.max_length - len(prefix) - len(suffix)
    kept = alignment.words_fitting(tokens.spans, budget)
    end = tokens.spans[kept - 1][1] if kept else 0
    offset = len(prefix)
    return Prepared(ids=prefix + tokens.ids[:end] + suffix, text_span=(offset, offset + end),
                    word_spans=[(a + offset, b + offset) for a, b in tokens.spans[:kept]],
                    words=list(item.words[:kept]), truncated=kept < len(item.words),
                    same_as_text_encoding=tokens.same_as_text_encoding)


def _pieces(model, p: Prepared) -> list[str]:
    """Readable tokens for the index: the added specials by name, the text's decoded."""
    a, b = p.text_span
    names = _special_names(model.vocabulary)
    return ([names.get(t, f"<{t}>") for t in p.ids[:a]]
            + alignment.piece_texts(model.vocabulary, p.ids[a:b])
            + [names.get(t, f"<{t}>") for t in p.ids[b:]])


def _special_names(vocabulary) -> dict[int, str]:
    names = {}
    for attribute, name in (("eos_id", "</s>"), ("sep_id", "[SEP]"), ("cls_id", "[CLS]")):
        try:
            value = getattr(vocabulary, attribute)
        except ValueError:  # a vocabulary without that token
            continue
        if value is not None:
            names[int(value)] = name
    return names


def batches(lengths: Sequence[int], batch_size: int) -> Iterable[list[int]]:
    """Indices grouped longest first, so each batch pads little."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def padded_batch(rows: Sequence[Sequence[int]], batch_size: int, limit: int) -> np.ndarray:
    """``[batch_size, L]`` ids, L rounded up to LENGTH_BUCKET (at most ``limit``); short
    batches repeat their first row, so every batch compiles to the same few shapes."""
    longest = max(len(r) for r in rows)
    length = min(-(-longest // LENGTH_BUCKET) * LENGTH_BUCKET, max(limit, longest))
    out = np.zeros((batch_size, length), np.int32)
    for i in range(batch_size):
        row = rows[i] if i < len(rows) else rows[0]
        out[i, :len(row)] = row
    return out


def embed_to_folder(model, items: Sequence[TextInput], folder, *, layers: Sequence[int],
                    batch_size: int = 32, dtype: str = "float32", tokens: bool = True,
                    progress=None) -> dict:
    """Writes ``folder`` (the format of ``embedding_files``); returns its meta."""
    prepared = [prepare(model, item) for item in items]
    records, token_start, word_start = [], 0, 0
    for item, p in zip(items, prepared, strict=False):
        records.append(embedding_files.index_record(
            item.id, item.text, p.words, p.ids, _pieces(model, p),
            p.text_span, p.word_spans, token_start, word_start, p.truncated,
            p.same_as_text_encoding))
        token_start += len(p.ids)
        word_start += len(p.words)
    writer = embedding_files.Writer(folder, layers=layers, d_model=model.d_model,
                                    n_texts=len(items), n_tokens=token_start, n_words=word_start,
                                    dtype=dtype, tokens=tokens)
    done = 0
    for indices in batches([len(p.ids) for p in prepared], batch_size):
        ids = padded_batch([prepared[i].ids for i in indices], batch_size, model.max_length)
        states = model.hidden_states(ids, layers)
        for row, i in enumerate(indices):
            writer.add(i, records[i], states[:, row, :len(prepared[i].ids)])
        done += len(indices)
        if progress:
            progress(done, len(items))
    prefix, suffix = model.framing
    meta = {"checkpoint": model.checkpoint, "step": model.step, "random_init": model.random_init,
            "family": model.config.model.family, "stack": model.stack,
            "num_layers": model.num_layers, "layers": list(layers), "d_model": model.d_model,
            "framing": {"prefix": prefix, "suffix": suffix}, "dtype": dtype,
            "token_files": tokens, "n_texts": len(items), "n_tokens": token_start,
            "n_words": word_start, "truncated_texts": sum(p.truncated for p in prepared)}
    writer.close(meta, records)
    return meta
