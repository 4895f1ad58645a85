"""Texts to padded token arrays, framed as each model family pretrained.

The retriever's towers read ``[CLS] text [SEP]`` (``analysis.hidden_states``'s
framing for encoders); the T5 generator reads ``text EOS``. Id 0 pads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from t5x_like.structures import EncoderStructure


def tokenize(vocabulary, texts: Sequence[str], length: int, prefix: Sequence[int] = (),
             suffix: Sequence[int] = ()) -> np.ndarray:
    """``[len(texts), length]`` int32: ``prefix + ids + suffix``, the ids cut so the
    suffix always fits, then zero-padded."""
    room = length - len(prefix) - len(suffix)
    if room < 1:
        raise ValueError(f"length={length} leaves no room for text after the framing.")
    out = np.zeros((len(texts), length), np.int32)
    for row, text in enumerate(texts):
        ids = list(prefix) + list(vocabulary.encode(text))[:room] + list(suffix)
        out[row, :len(ids)] = ids
    return out


def encoder_framing(vocabulary) -> tuple[list[int], list[int]]:
    return EncoderStructure.text_framing(vocabulary)


def tower_tokens(vocabulary, texts: Sequence[str], length: int) -> np.ndarray:
    prefix, suffix = encoder_framing(vocabulary)
    return tokenize(vocabulary, texts, length, prefix, suffix)


def generator_tokens(vocabulary, texts: Sequence[str], length: int, eos: bool = True) -> np.ndarray:
    return tokenize(vocabulary, texts, length, (), [int(vocabulary.eos_id)] if eos else [])


def detokenize(vocabulary, rows: np.ndarray, eos_id: int = 1) -> list[str]:
    """Generated rows to text: ids up to the first EOS (padding dropped)."""
    out = []
    for row in np.asarray(rows):
        ids = []
        for token in row.tolist():
            if token == eos_id:
                break
            if token > 0:
                ids.append(token)
        out.append(vocabulary.decode(ids))
    return out
