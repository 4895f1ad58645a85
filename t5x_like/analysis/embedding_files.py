"""The folder ``embed`` writes, and reading it back: one format for the command, the
analyses and anyone's numpy.

    meta.json                 checkpoint, step, family, stack, layers, d_model, framing, counts
    index.jsonl               one line per input text (see ``index_record``)
    layer_<k>.tokens.npy      [N_tokens, d] every position of every input, inputs concatenated
                              in input order, added special tokens included
    pooled_mean.npy           [N_texts, n_layers, d] mean over the text's own tokens
    pooled_first.npy          [N_texts, n_layers, d] position 0 of the input ([CLS] in BERT)
    pooled_last.npy           [N_texts, n_layers, d] the text's last token (before [SEP]/EOS)
    words_first.npy           [N_words, n_layers, d] each word's first subword
    words_mean.npy            [N_words, n_layers, d] mean of each word's subwords

``n_layers`` follows ``meta["layers"]`` (layer 0 = the embedding output). A word with no
tokens (the tokenizer dropped every character) has NaN vectors. Arrays are written as
memory maps, so outputs larger than memory are fine.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import numpy as np

from t5x_like.errors import MissingFile

POOLINGS = ("mean", "first", "last")
WORD_POOLINGS = ("first", "mean")


def tokens_file(layer: int) -> str:
    return f"layer_{layer}.tokens.npy"


def index_record(text_id, text: str, words: Sequence[str], ids: Sequence[int],
                 pieces: Sequence[str], text_span: tuple[int, int],
                 word_spans: Sequence[tuple[int, int]], token_start: int, word_start: int,
                 truncated: bool, same_as_text_encoding: bool) -> dict:
    """One ``index.jsonl`` line. Positions (``text_span``, ``word_spans``) count from the
    input's first token, specials included, ``[start, end)``; the input's rows in
    ``layer_<k>.tokens.npy`` are ``token_start .. token_start + len(token_ids)``, its
    words' rows in ``words_*.npy`` are ``word_start .. word_start + len(words)``.
    ``words`` are those kept (a text longer than the model's positions is cut between
    words: ``truncated``)."""
    return {"id": text_id, "text": text, "words": list(words), "token_ids": [int(i) for i in ids],
            "pieces": list(pieces), "text_span": list(text_span),
            "word_spans": [list(span) for span in word_spans], "token_start": int(token_start),
            "word_start": int(word_start), "truncated": bool(truncated),
            "same_as_text_encoding": bool(same_as_text_encoding)}


class Writer:
    """Opens every array at its final size, so batches land in place in any order."""

    def __init__(self, folder, *, layers: Sequence[int], d_model: int, n_texts: int,
                 n_tokens: int, n_words: int, dtype: str = "float32", tokens: bool = True):
        self.folder = pathlib.Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.layers = list(layers)
        n_layers = len(self.layers)
        open_array = lambda name, shape: np.lib.format.open_memmap(  # noqa: E731
            self.folder / name, mode="w+", dtype=dtype, shape=shape)
        self.token_arrays = ({k: open_array(tokens_file(k), (n_tokens, d_model)) for k in self.layers}
                             if tokens else {})
        self.pooled = {p: open_array(f"pooled_{p}.npy", (n_texts, n_layers, d_model))
                       for p in POOLINGS}
        self.words = {p: open_array(f"words_{p}.npy", (n_words, n_layers, d_model))
                      for p in WORD_POOLINGS}

    def add(self, text_index: int, record: dict, states: np.ndarray) -> None:
        """``states``: ``[n_layers, length, d]`` of this input (padding already cut)."""
        start = record["token_start"]
        for row, layer in enumerate(self.layers):
            if layer in self.token_arrays:
                self.token_arrays[layer][start:start + states.shape[1]] = states[row]
        a, b = record["text_span"]
        with np.errstate(invalid="ignore"):
            self.pooled["mean"][text_index] = (states[:, a:b].mean(axis=1) if b > a
                                               else np.nan)
            self.pooled["first"][text_index] = states[:, 0]
            self.pooled["last"][text_index] = states[:, b - 1] if b > a else np.nan
            for offset, (ws, we) in enumerate(record["word_spans"]):
                row = record["word_start"] + offset
                self.words["first"][row] = states[:, ws] if we > ws else np.nan
                self.words["mean"][row] = states[:, ws:we].mean(axis=1) if we > ws else np.nan

    def close(self, meta: dict, records: Sequence[dict]) -> None:
        for array in [*self.token_arrays.values(), *self.pooled.values(), *self.words.values()]:
            array.flush()
        lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in records]
        (self.folder / "index.jsonl").write_text("".join(lines), encoding="utf-8")
        # meta.json last: a folder with it is complete.
        (self.folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


class Embeddings:
    """A folder written by ``embed``, arrays memory-mapped."""

    def __init__(self, folder):
        self.folder = pathlib.Path(folder)
        meta = self.folder / "meta.json"
        if not meta.is_file():
            raise MissingFile(f"{folder} has no meta.json: not (or not completely) "
                                    "written by `python -m t5x_like.embed`.")
        self.meta = json.loads(meta.read_text())
        self.index = [json.loads(line) for line in
                      (self.folder / "index.jsonl").read_text(encoding="utf-8").splitlines()]
        self.layers = list(self.meta["layers"])

    def _load(self, name: str) -> np.ndarray:
        return np.load(self.folder / name, mmap_mode="r")

    def tokens(self, layer: int) -> np.ndarray:
        return self._load(tokens_file(layer))

    def pooled(self, kind: str) -> np.ndarray:
        return self._load(f"pooled_{kind}.npy")

    def words(self, kind: str) -> np.ndarray:
        return self._load(f"words_{kind}.npy")

    def word_texts(self) -> list[str]:
        return [word for record in self.index for word in record["words"]]

    def word_text_index(self) -> np.ndarray:
        """For each row of ``words_*.npy``: which input it came from."""
        return np.asarray([i for i, record in enumerate(self.index) for _ in record["words"]],
                          np.int64)

    def text_token_mask(self) -> np.ndarray:
        """For each row of ``layer_<k>.tokens.npy``: True on the texts' own tokens (False
        on added [CLS]/[SEP]/EOS)."""
        mask = np.zeros(int(self.meta["n_tokens"]), bool)
        for record in self.index:
            a, b = record["text_span"]
            mask[record["token_start"] + a:record["token_start"] + b] = True
        return mask
