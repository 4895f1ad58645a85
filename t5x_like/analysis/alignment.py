"""Which tokens make up which word: the map word-level pooling and the POS probes need.

Every vocabulary here splits text on whitespace before it splits words into subwords
(SentencePiece with ``split_by_whitespace``, WordPiece's pre-tokenizer, GPT-2's
byte-level regex), so tokenizing a text word by word gives the same ids as tokenizing
it whole, and each word's tokens are known exactly instead of guessed back from
"▁"/"##"/"Ġ" markers. :func:`tokenize_words` checks that equality per text and says
when it does not hold (the ids fed are then the word-by-word ones, so the spans stay exact).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class WordTokens:
    ids: list[int]                        # the text's tokens (no special tokens)
    spans: list[tuple[int, int]]          # per word, [start, end) into ids
    same_as_text_encoding: bool           # ids == vocabulary.encode(" ".join(words))


def tokenize_words(vocabulary, words: Sequence[str]) -> WordTokens:
    """Ids of ``words`` joined by single spaces, with each word's token span.

    A word after the first is encoded with its leading space (byte-level BPE keeps the
    space in the token, "Ġword"; SentencePiece and WordPiece drop it), which is how it
    is tokenized inside the text.
    """
    whole = list(vocabulary.encode(" ".join(words)))
    spaced = [list(vocabulary.encode(word if i == 0 else " " + word))
              for i, word in enumerate(words)]
    candidates = [spaced]
    if _concat(spaced) != whole:
        candidates.append([list(vocabulary.encode(word)) for word in words])
    chosen = next((c for c in candidates if _concat(c) == whole), spaced)
    ids, spans = [], []
    for pieces in chosen:
        spans.append((len(ids), len(ids) + len(pieces)))
        ids.extend(pieces)
    return WordTokens(ids, spans, _concat(chosen) == whole)


def _concat(lists: list[list[int]]) -> list[int]:
    return [token for pieces in lists for token in pieces]


def piece_texts(vocabulary, ids: Sequence[int]) -> list[str]:
    """Each token decoded alone (for reading the index; byte pieces of one character
    decode to U+FFFD on their own)."""
    return [vocabulary.decode([int(token)]) for token in ids]


def words_fitting(spans: Sequence[tuple[int, int]], budget: int) -> int:
    """How many leading words fit in ``budget`` tokens: a text is cut between words,
    never inside one, so every kept word has all its subwords."""
    kept = 0
    for _start, end in spans:
        if end > budget:
            break
        kept += 1
    return kept
