"""SentencePiece vocabulary with T5's id conventions, shared by all three families.

pad=0, eos=1, unk=2 (T5), then bos, and the BERT pieces [MASK], [CLS], [SEP].
``extra_ids`` sentinels sit above the SentencePiece range, and
``<extra_id_0>`` is the highest id, exactly as in T5.
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

PAD_ID, EOS_ID, UNK_ID, BOS_ID = 0, 1, 2, 3
MASK_PIECE, CLS_PIECE, SEP_PIECE = "[MASK]", "[CLS]", "[SEP]"
SPECIAL_PIECES = (MASK_PIECE, CLS_PIECE, SEP_PIECE)


class SentencePieceVocabulary:
    """Encodes text to ids and back; knows the special and sentinel ids."""

    def __init__(self, model_path: str, extra_ids: int = 100):
        self.model_path = model_path
        self.extra_ids = extra_ids
        try:
            self._sp = spm.SentencePieceProcessor(model_file=model_path)
        except (OSError, RuntimeError) as e:
            raise FileNotFoundError(
                f"Cannot load SentencePiece model {model_path!r} ({e}). Rebuild it with "
                "`python -m t5x_like.data.train_vocab` or point the config's "
                "`vocab_path` at an existing .model file.") from e
        expected = {"pad": (self._sp.pad_id(), PAD_ID), "eos": (self._sp.eos_id(), EOS_ID),
                    "unk": (self._sp.unk_id(), UNK_ID)}
        for name, (got, want) in expected.items():
            if got != want:
                raise ValueError(
                    f"SentencePiece model {model_path!r} has {name}_id={got}, but t5x_like "
                    f"needs {name}_id={want} (T5 convention). Retrain it with "
                    "`python -m t5x_like.data.train_vocab`.")

    # -- sizes and special ids ------------------------------------------------
    @property
    def base_vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + self.extra_ids

    pad_id = PAD_ID
    eos_id = EOS_ID
    unk_id = UNK_ID

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    @functools.cached_property
    def mask_id(self) -> int:
        return self._special(MASK_PIECE)

    @functools.cached_property
    def cls_id(self) -> int:
        return self._special(CLS_PIECE)

    @functools.cached_property
    def sep_id(self) -> int:
        return self._special(SEP_PIECE)

    def _special(self, piece: str) -> int:
        piece_id = self._sp.piece_to_id(piece)
        if piece_id == self.unk_id:
            raise ValueError(f"{self.model_path!r} has no {piece} piece; retrain it with "
                             "`python -m t5x_like.data.train_vocab`.")
        return piece_id

    def sentinel_id(self, index: int) -> int:
        """``<extra_id_{index}>``: counts down from the top of the id range."""
        if not 0 <= index < self.extra_ids:
            raise ValueError(f"Sentinel index {index} out of range [0, {self.extra_ids}).")
        return self.vocab_size - 1 - index

    # -- encode / decode -----------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        """Text for ids; sentinels print as ``<extra_id_N>``, decoding stops at EOS."""
        pieces: list[str] = []
        run: list[int] = []
        for token in np.asarray(list(ids), dtype=np.int64).tolist():
            if token == self.eos_id:
                break
            if token >= self.base_vocab_size:
                pieces.append(self._sp.decode(run))
                run = []
                pieces.append(f"<extra_id_{self.vocab_size - 1 - token}>")
            elif token != self.pad_id:
                run.append(token)
        pieces.append(self._sp.decode(run))
        return "".join(pieces)
