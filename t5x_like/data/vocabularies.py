"""SentencePiece vocabulary with T5's id conventions, shared by all three families.

pad=0, eos=1, unk=2 (T5), then bos, and the BERT pieces [MASK], [CLS], [SEP].
``extra_ids`` sentinels sit above the SentencePiece range, and
``<extra_id_0>`` is the highest id, exactly as in T5.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from t5x_like.errors import MissingFile, UserError
from t5x_like.system import storage

# Imports inside functions: sentencepiece's model protobuf and the WordPiece trainer load only
# where they are used.

PAD_ID, EOS_ID, UNK_ID, BOS_ID = 0, 1, 2, 3
MASK_PIECE, CLS_PIECE, SEP_PIECE = "[MASK]", "[CLS]", "[SEP]"
SPECIAL_PIECES = (MASK_PIECE, CLS_PIECE, SEP_PIECE)


def kind(vocabulary) -> str:
    """The class name of a vocabulary, also behind the registry's lazy wrapper (which
    loads the model on first use and hides its type)."""
    real = vocabulary._factory() if hasattr(vocabulary, "_factory") else vocabulary
    return type(real).__name__


def model_file(vocabulary) -> str | None:
    """The file a vocabulary was loaded from (SentencePiece model or WordPiece list)."""
    return getattr(vocabulary, "model_path", None) or getattr(vocabulary, "vocab_path", None)


def identity(vocabulary) -> dict:
    """What makes two vocabularies give the same ids: kind, size, model file name and
    content hash, a Hugging Face tokenizer's content hash, and the constructor's plain
    settings (``extra_ids``, ``lowercase``). The one identity: the preprocessing cache's
    fingerprint, a run's resume fingerprint and the messages that name a vocabulary
    (:func:`describe`) all read it."""
    real = vocabulary._factory() if hasattr(vocabulary, "_factory") else vocabulary
    found = {"kind": type(real).__name__, "size": int(real.vocab_size)}
    model_path = model_file(real)
    if model_path:
        found["file"] = storage.path(model_path).name
        found["file_sha256"] = hashlib.sha256(storage.path(model_path).read_bytes()).hexdigest()[:16]
    digest = getattr(real, "content_sha256", None)
    if digest:
        found["content_sha256"] = str(digest)[:16]
    try:  # settings given to the constructor (not values it caches later, like mask_id)
        settings = inspect.signature(type(real)).parameters
    except (TypeError, ValueError):
        settings = {}
    state = vars(real) if hasattr(real, "__dict__") else {}
    for key in sorted(settings):
        value = state.get(key)
        if isinstance(value, (bool, int, float, str)) and not key.endswith("path"):
            found[key] = value
    return found


def describe(vocabulary) -> str:
    """A vocabulary as messages name it: ``SentencePieceVocabulary(8192 embedded_en_8k.model)``,
    with the first digits of a Hugging Face tokenizer's content hash."""
    model_path = model_file(vocabulary)
    where = f" {storage.path(model_path).name}" if model_path else ""
    digest = getattr(vocabulary, "content_sha256", None)
    if digest:
        where += f" sha256:{digest[:12]}"
    return f"{kind(vocabulary)}({vocabulary.vocab_size}{where})"


def check_fits(vocabulary, rows: int, what: str, fix: str, error: type = UserError) -> None:
    """Refuses a vocabulary with more ids than an embedding table of ``rows`` rows: the one
    check behind training (``model.vocab_size``), evaluation and inference
    (``--vocabulary``) and ``convert import`` (a tokenizer beside the weights)."""
    size = vocabulary.vocab_size
    if size > rows:
        raise error(f"{what} has {size} tokens ({describe(vocabulary)}) but the model's "
                    f"embedding table has {rows} rows; {fix}")


def _with_sentinel_pieces(sp: spm.SentencePieceProcessor,
                          extra_ids: int) -> spm.SentencePieceProcessor:
    """``sp`` with ``▁<extra_id_N>`` user-defined pieces appended, N descending, as seqio.

    So the text ``<extra_id_N>`` (at a word start, as in seqio) encodes to sentinel N
    and sentinels decode to ``<extra_id_N>`` with SentencePiece's own spacing:
    ``decode(encode(text))`` gives the text back, exactly as seqio's vocabulary does.
    """
    from sentencepiece import sentencepiece_model_pb2  # needs protobuf (a tfds dependency)

    model = sentencepiece_model_pb2.ModelProto.FromString(sp.serialized_model_proto())
    for index in reversed(range(extra_ids)):
        model.pieces.add(piece=f"\u2581<extra_id_{index}>", score=0.0,
                         type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED)
    return spm.SentencePieceProcessor(model_proto=model.SerializeToString())


class SentencePieceVocabulary:
    """Encodes text to ids and back; knows the special and sentinel ids.

    Sentinels are SentencePiece pieces here, as in seqio: ``<extra_id_N>`` in text
    encodes to ``vocab_size - 1 - N`` and decodes back to it.
    """

    def __init__(self, model_path: str, extra_ids: int = 100):
        self.model_path = model_path
        self.extra_ids = extra_ids
        try:
            self._sp = spm.SentencePieceProcessor(model_file=model_path)
        except (OSError, RuntimeError) as e:
            raise MissingFile(
                f"Cannot load SentencePiece model {model_path!r} ({e}). Rebuild it with "
                "`python -m t5x_like.train_vocab` or point the config's "
                "`vocab_path` at an existing .model file.") from e
        expected = {"pad": (self._sp.pad_id(), PAD_ID), "eos": (self._sp.eos_id(), EOS_ID),
                    "unk": (self._sp.unk_id(), UNK_ID)}
        for name, (got, want) in expected.items():
            if got != want:
                raise ValueError(
                    f"SentencePiece model {model_path!r} has {name}_id={got}, but t5x_like "
                    f"needs {name}_id={want} (T5 convention). Retrain it with "
                    "`python -m t5x_like.train_vocab`.")
        self._base_vocab_size = self._sp.get_piece_size()
        if extra_ids:
            self._sp = _with_sentinel_pieces(self._sp, extra_ids)

    def pieces(self) -> tuple[str, ...]:
        """Every id's piece text, in id order (ELMo's char CNN reads their characters)."""
        return tuple(self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size()))

    # -- sizes and special ids ------------------------------------------------
    @property
    def base_vocab_size(self) -> int:
        return self._base_vocab_size

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
                             "`python -m t5x_like.train_vocab`.")
        return piece_id

    def sentinel_id(self, index: int) -> int:
        """``<extra_id_{index}>``: counts down from the top of the id range."""
        if not 0 <= index < self.extra_ids:
            raise ValueError(f"Sentinel index {index} out of range [0, {self.extra_ids}).")
        return self.vocab_size - 1 - index

    @functools.cached_property
    def special_ids(self) -> np.ndarray:
        """Ids an objective must never mask or sample: control pieces, [MASK]/[CLS]/[SEP]."""
        ids = [i for i in range(self.base_vocab_size)
               if self._sp.is_control(i) or self._sp.is_unknown(i)]
        ids += [self._sp.piece_to_id(p) for p in SPECIAL_PIECES
                if self._sp.piece_to_id(p) != self.unk_id]
        return np.unique(np.asarray(ids, np.int32))

    @functools.cached_property
    def random_token_range(self) -> tuple[int, int]:
        """[low, high): ordinary pieces, past the specials and byte pieces, below the sentinels."""
        low = 0
        while low < self.base_vocab_size and (
                self._sp.is_control(low) or self._sp.is_unknown(low) or self._sp.is_byte(low)
                or self._sp.id_to_piece(low) in SPECIAL_PIECES):
            low += 1
        return low, self.base_vocab_size

    @functools.cached_property
    def _word_start_table(self) -> np.ndarray:
        table = np.ones(self.vocab_size, bool)
        for i in range(self.base_vocab_size):
            piece = self._sp.id_to_piece(i)
            table[i] = piece.startswith("\u2581") or self._sp.is_control(i) or piece in SPECIAL_PIECES
        return table

    def word_start_mask(self, ids: np.ndarray) -> np.ndarray:
        """True where a token starts a word (its piece begins with "\u2581")."""
        return self._word_start_table[np.asarray(ids)]

    @functools.cached_property
    def sentence_end_table(self) -> np.ndarray:
        """True for pieces that end a sentence ('.', '!', '?'), for BART's sentence permutation."""
        table = np.zeros(self.vocab_size, bool)
        for i in range(self.base_vocab_size):
            table[i] = self._sp.id_to_piece(i).rstrip("\"'\u201d\u2019)").endswith((".", "!", "?"))
        return table

    # -- encode / decode -----------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        """Text for ids, as seqio: sentinels print as ``<extra_id_N>`` (after a space, as
        the piece is ``▁<extra_id_N>``), decoding stops at EOS, padding is dropped and
        ids past the vocabulary decode as unknown."""
        out: list[int] = []
        for token in np.asarray(list(ids), dtype=np.int64).tolist():
            if token == self.eos_id:
                break
            if token != self.pad_id:
                out.append(token if 0 <= token < self.vocab_size else self.unk_id)
        return self._sp.decode(out)


class ByteVocabulary:
    """UTF-8 bytes, ByT5's convention: pad 0, eos 1, unk 2, byte b is id b + 3, then
    ``extra_ids`` sentinels at the top (``<extra_id_0>`` highest). Works for any language."""

    OFFSET = 3
    pad_id, eos_id, unk_id = PAD_ID, EOS_ID, UNK_ID

    def __init__(self, extra_ids: int = 125):
        self.extra_ids = extra_ids

    base_vocab_size = 256 + OFFSET

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + self.extra_ids

    def _missing(self, piece):
        raise ValueError(f"ByteVocabulary has no {piece} token; masked-LM objectives need a "
                         "SentencePiece or WordPiece vocabulary with [MASK]/[CLS]/[SEP].")

    mask_id = property(lambda self: self._missing(MASK_PIECE))
    cls_id = property(lambda self: self._missing(CLS_PIECE))
    sep_id = property(lambda self: self._missing(SEP_PIECE))
    special_ids = np.array([PAD_ID, EOS_ID, UNK_ID], np.int32)
    random_token_range = (OFFSET, 256 + OFFSET)

    def sentinel_id(self, index: int) -> int:
        if not 0 <= index < self.extra_ids:
            raise ValueError(f"Sentinel index {index} out of range [0, {self.extra_ids}).")
        return self.vocab_size - 1 - index

    def word_start_mask(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        after_space = np.concatenate([[True], ids[:-1] == ord(" ") + self.OFFSET])
        return after_space & (ids != ord(" ") + self.OFFSET)

    @functools.cached_property
    def sentence_end_table(self) -> np.ndarray:
        table = np.zeros(self.vocab_size, bool)
        table[[ord(c) + self.OFFSET for c in ".!?"]] = True
        return table

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes -> text (invalid UTF-8 shows as U+FFFD); sentinels as ``<extra_id_N>``."""
        out, run = [], bytearray()
        for token in np.asarray(list(ids), dtype=np.int64).tolist():
            if token == self.eos_id:
                break
            if token >= self.base_vocab_size:
                out.append(run.decode("utf-8", errors="replace"))
                run = bytearray()
                out.append(f"<extra_id_{self.vocab_size - 1 - token}>")
            elif token >= self.OFFSET:
                run.append(token - self.OFFSET)
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


class WordPieceVocabulary:
    """A BERT ``vocab.txt`` through Hugging Face ``tokenizers`` (for converted checkpoints).

    BERT has no EOS: ``eos_id`` is [SEP], so ``AppendEos`` ends segments BERT's way.
    There are no sentinels (``extra_ids = 0``).
    """

    extra_ids = 0

    def __init__(self, vocab_path: str, lowercase: bool = True):
        from tokenizers import BertWordPieceTokenizer  # optional until a WordPiece task is used
        self.vocab_path = vocab_path
        try:
            self._tokenizer = BertWordPieceTokenizer(vocab_path, lowercase=lowercase)
        except Exception as e:
            raise MissingFile(f"Cannot load WordPiece vocab {vocab_path!r} ({e}); point at "
                                    "a BERT vocab.txt (one token per line).") from e
        self._vocab = self._tokenizer.get_vocab()
        self._id_to_token = {i: t for t, i in self._vocab.items()}
        for piece in ("[PAD]", "[UNK]", MASK_PIECE, CLS_PIECE, SEP_PIECE):
            if piece not in self._vocab:
                raise ValueError(f"WordPiece vocab {vocab_path!r} has no {piece}; BERT vocabularies "
                                 "need [PAD], [UNK], [CLS], [SEP] and [MASK].")
        self.pad_id = self._vocab["[PAD]"]
        self.unk_id = self._vocab["[UNK]"]
        self.mask_id, self.cls_id, self.sep_id = (self._vocab[p] for p in SPECIAL_PIECES)
        self.eos_id = self.sep_id
        if self.pad_id != PAD_ID:
            raise ValueError(f"WordPiece vocab {vocab_path!r} has [PAD] at id {self.pad_id}; the "
                             "feature converters pad with 0, so [PAD] must be the first line.")

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    base_vocab_size = vocab_size

    @functools.cached_property
    def special_ids(self) -> np.ndarray:
        return np.array(sorted(i for t, i in self._vocab.items()
                               if t.startswith("[") and t.endswith("]")), np.int32)

    @functools.cached_property
    def random_token_range(self) -> tuple[int, int]:
        return int(self.special_ids.max()) + 1, self.vocab_size

    @functools.cached_property
    def _word_start_table(self) -> np.ndarray:
        return np.array([not self._id_to_token.get(i, "").startswith("##")
                         for i in range(self.vocab_size)])

    def word_start_mask(self, ids: np.ndarray) -> np.ndarray:
        return self._word_start_table[np.asarray(ids)]

    @functools.cached_property
    def sentence_end_table(self) -> np.ndarray:
        return np.array([self._id_to_token.get(i, "") in (".", "!", "?")
                         for i in range(self.vocab_size)])

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids if int(i) != self.pad_id]
        return self._tokenizer.decode(ids, skip_special_tokens=False)
