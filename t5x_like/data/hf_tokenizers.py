"""Hugging Face tokenizer folders as t5x_like vocabularies, and our vocabularies as
tokenizer folders ``AutoTokenizer`` loads.

Imported checkpoints keep the tokenizer they were trained with (GPT-2's byte-level
BPE, Llama's, T5's Unigram, BERT's WordPiece), so text tasks can be tokenized in the
model's own vocabulary; exported checkpoints carry ours, so transformers,
lm-evaluation-harness or vLLM read the same ids we trained on.

Special ids come from the tokenizer's declared special tokens
(``tokenizer_config.json``, ``special_tokens_map.json``) and then from the model's
``config.json`` (``eos_token_id``, ...): never assumed. A piece the tokenizer does
not declare (a mask token, sentinels) is refused where an objective needs it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib
import re
import shutil
from collections.abc import Iterable, Sequence

import numpy as np
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from t5x_like.data import vocabularies
from t5x_like.errors import MissingFile
from t5x_like.system import storage

# Imports inside functions: the `tokenizers` and sentencepiece libraries load only for the
# tokenizer kind a folder holds.

# Everything a Hugging Face folder may hold for its tokenizer (transformers' names).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "spiece.model", "tokenizer.model",
                   "sentencepiece.bpe.model", "vocab.txt", "vocab.json", "merges.txt")
SPECIAL_NAMES = ("pad", "eos", "bos", "unk", "mask", "cls", "sep")
SENTINEL = re.compile(r"<extra_id_(\d+)>")
# Beside the copied files: the special ids resolved at import (config.json included).
SPECIAL_IDS_FILE = "t5x_like_special_ids.json"
# Written with our own vocabularies: which class (and file) reads the folder back, so a
# checkpoint trained on the embedded tasks still matches their vocabulary.
NATIVE_FILE = "t5x_like_vocabulary.json"


def tokenizer_files(folder) -> list[str]:
    """The tokenizer files in ``folder`` (ours included: the native marker and the
    SentencePiece model it names)."""
    folder = pathlib.Path(folder)
    names = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    native = read_json(folder / NATIVE_FILE)
    if native:
        names.append(NATIVE_FILE)
        if native.get("file") and native["file"] not in names:
            names.append(native["file"])
    return names


def copy_tokenizer(hf_dir, out_dir, hf_config: dict | None = None) -> list[str]:
    """Copies the tokenizer files of ``hf_dir`` into ``out_dir`` with the special ids
    resolved from them and ``config.json``; returns the names copied ([] when none)."""
    names = tokenizer_files(hf_dir)
    if not names:
        return []
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(pathlib.Path(hf_dir) / name, out_dir / name)
    vocabulary = load(out_dir, hf_config)
    if isinstance(vocabulary, HfTokenizerVocabulary):
        (out_dir / SPECIAL_IDS_FILE).write_text(json.dumps(vocabulary.declared_ids, indent=2))
        names.append(SPECIAL_IDS_FILE)
    return names


def load(folder, hf_config: dict | None = None):
    """The vocabulary of a tokenizer folder (or a ``tokenizer.json`` file); one in a
    bucket is read from a local copy."""
    path = pathlib.Path(storage.local_copy(folder))
    if path.is_file() and path.name.endswith(".json"):
        return HfTokenizerVocabulary(path, hf_config)
    if path.is_file() and path.suffix == ".model":
        return vocabularies.SentencePieceVocabulary(str(path))
    if not path.is_dir():
        raise MissingFile(f"{folder}: no such tokenizer folder or file; give a folder "
                                "with tokenizer.json (or vocab.txt, vocab.json + merges.txt, "
                                "spiece.model).")
    native = read_json(path / NATIVE_FILE)
    if native:
        return _native(path, native)
    if hf_config is None and (path / "config.json").is_file():
        hf_config = json.loads((path / "config.json").read_text())
    if (path / "tokenizer.json").is_file() or (path / "vocab.json").is_file():
        return HfTokenizerVocabulary(path, hf_config)
    if (path / "vocab.txt").is_file():
        settings = read_json(path / "tokenizer_config.json")
        return vocabularies.WordPieceVocabulary(str(path / "vocab.txt"),
                                                lowercase=settings.get("do_lower_case", True))
    if (path / "spiece.model").is_file():
        extra_ids = int(read_json(path / "tokenizer_config.json").get("extra_ids", 100))
        return vocabularies.SentencePieceVocabulary(str(path / "spiece.model"), extra_ids)
    present = sorted(p.name for p in path.iterdir())
    raise MissingFile(
        f"{folder} holds no tokenizer t5x_like can read (it has {present[:12]}); it needs "
        "tokenizer.json, vocab.json + merges.txt, vocab.txt or a T5 spiece.model. Re-save "
        "the tokenizer with transformers' save_pretrained, which writes tokenizer.json.")


def _native(folder: pathlib.Path, native: dict):
    """One of our vocabularies, from the marker ``write_tokenizer`` left."""
    kind = native.get("class")
    if kind == "SentencePieceVocabulary":
        return vocabularies.SentencePieceVocabulary(str(folder / native["file"]),
                                                    int(native["extra_ids"]))
    if kind == "ByteVocabulary":
        return vocabularies.ByteVocabulary(int(native["extra_ids"]))
    if kind == "WordPieceVocabulary":
        return vocabularies.WordPieceVocabulary(str(folder / native["file"]),
                                                lowercase=bool(native.get("lowercase", True)))
    raise ValueError(f"{folder / NATIVE_FILE} names vocabulary class {kind!r}, which t5x_like "
                     "does not know; delete the file to read the folder as a Hugging Face "
                     "tokenizer.")


def read_json(path: pathlib.Path) -> dict:
    """A tokenizer folder's JSON file, or {} when it is absent."""
    return json.loads(path.read_text()) if path.is_file() else {}


def token_text(value) -> str | None:
    """A special token as tokenizer_config writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class HfTokenizerVocabulary:
    """A ``tokenizers`` tokenizer (``tokenizer.json``, or GPT-2's ``vocab.json`` +
    ``merges.txt``) with our vocabulary interface. Text is encoded without the
    tokenizer's template (no BOS/EOS added): tasks append EOS themselves, and
    lm-evaluation-harness encodes decoder requests the same way."""

    def __init__(self, path, hf_config: dict | None = None):
        path = pathlib.Path(path)
        self.folder = path if path.is_dir() else path.parent
        json_file = path if path.is_file() else path / "tokenizer.json"
        try:
            if json_file.is_file():
                self._tokenizer = Tokenizer.from_file(str(json_file))
                self.model_path = str(json_file)
            else:
                from tokenizers import ByteLevelBPETokenizer
                bpe = ByteLevelBPETokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
                self._tokenizer = bpe._tokenizer
                self.model_path = str(path / "vocab.json")
        except Exception as e:  # noqa: BLE001 - the library's message says what is wrong
            raise ValueError(f"Cannot load the tokenizer in {path} ({e}); re-save it with "
                             "transformers' save_pretrained.") from None
        self._settings = {**read_json(self.folder / "special_tokens_map.json"),
                          **read_json(self.folder / "tokenizer_config.json")}
        self._saved_ids = read_json(self.folder / SPECIAL_IDS_FILE)
        self._hf_config = hf_config or {}
        self.declared_ids = {name: self._declared(name) for name in SPECIAL_NAMES}

    def __repr__(self):
        return f"HfTokenizerVocabulary({self.model_path!r}, {self.vocab_size} tokens)"

    @functools.cached_property
    def template_prefix(self) -> tuple[int, ...]:
        """The ids the tokenizer's template adds before a text (Llama's BOS; none for
        GPT-2's): what transformers' ``tokenizer(text)``, and lm-eval's ``hf`` model with
        its defaults, put first. (``encode`` leaves the template out.)"""
        plain = self._tokenizer.encode("a", add_special_tokens=False).ids
        framed = self._tokenizer.encode("a", add_special_tokens=True).ids
        start = next((i for i in range(len(framed)) if framed[i:i + len(plain)] == plain), 0)
        return tuple(framed[:start])

    # -- special ids ------------------------------------------------------------------------
    def _declared(self, name: str) -> int | None:
        """The id of special token ``name``: the tokenizer's own declaration, then what
        the import saved, then the model's config.json; None when nobody declares it."""
        text = token_text(self._settings.get(f"{name}_token"))
        if text is not None and self._tokenizer.token_to_id(text) is not None:
            return self._tokenizer.token_to_id(text)
        if self._saved_ids.get(name) is not None:
            return int(self._saved_ids[name])
        value = self._hf_config.get(f"{name}_token_id")
        if isinstance(value, list):  # Llama 3 lists several end tokens: the first is EOS
            value = value[0] if value else None
        return int(value) if value is not None else None

    def _required(self, name: str, purpose: str) -> int:
        value = self.declared_ids[name]
        if value is None:
            raise ValueError(
                f"The tokenizer {self.model_path} declares no {name} token, which {purpose} "
                f"needs. Declare one (\"{name}_token\" in tokenizer_config.json) or use a task "
                "that does not need it.")
        return value

    @property
    def eos_id(self) -> int:
        """EOS, or BERT's [SEP] for a tokenizer without one (as ``WordPieceVocabulary``)."""
        if self.declared_ids["eos"] is None and self.declared_ids["sep"] is not None:
            return self.declared_ids["sep"]
        return self._required("eos", "ending a sequence (AppendEos, decoding)")

    @property
    def pad_id(self) -> int | None:
        return self.declared_ids["pad"]

    @property
    def unk_id(self) -> int | None:
        return self.declared_ids["unk"]

    @property
    def bos_id(self) -> int | None:
        return self.declared_ids["bos"]

    mask_id = property(lambda self: self._required("mask", "masked-LM corruption"))
    cls_id = property(lambda self: self._required("cls", "a [CLS]-first encoder input"))
    sep_id = property(lambda self: self._required("sep", "separating sentence pairs"))

    # -- sizes and sentinels -----------------------------------------------------------------
    @functools.cached_property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def base_vocab_size(self) -> int:
        return self.vocab_size - self.extra_ids

    @functools.cached_property
    def _sentinels(self) -> dict[int, int]:
        found = {}
        for token, token_id in self._tokenizer.get_vocab(with_added_tokens=True).items():
            match = SENTINEL.fullmatch(token)
            if match:
                found[int(match.group(1))] = token_id
        return found

    @property
    def extra_ids(self) -> int:
        """Sentinels ``<extra_id_N>``, counted when they sit at the top of the id range in
        T5's order (span corruption numbers them from ``vocab_size - 1`` down)."""
        found = self._sentinels
        if found and all(found.get(i) == self.vocab_size - 1 - i for i in range(len(found))):
            return len(found)
        return 0

    def sentinel_id(self, index: int) -> int:
        if not 0 <= index < self.extra_ids:
            raise ValueError(f"Sentinel index {index} out of range [0, {self.extra_ids}) for "
                             f"the tokenizer {self.model_path}.")
        return self.vocab_size - 1 - index

    @functools.cached_property
    def special_ids(self) -> np.ndarray:
        """Ids an objective must never mask or sample: the tokenizer's special tokens."""
        ids = [i for i, token in self._tokenizer.get_added_tokens_decoder().items()
               if token.special]
        ids += [v for v in self.declared_ids.values() if v is not None]
        return np.unique(np.asarray(ids, np.int32))

    @functools.cached_property
    def random_token_range(self) -> tuple[int, int]:
        """[low, high): the longest run of ids with no special token in it."""
        edges = [-1] + sorted(int(i) for i in self.special_ids) + [self.base_vocab_size]
        low, high = max(zip(edges[:-1], edges[1:], strict=False), key=lambda pair: pair[1] - pair[0])
        return low + 1, high

    @functools.cached_property
    def _tokens(self) -> list[str]:
        return [self._tokenizer.id_to_token(i) or "" for i in range(self.vocab_size)]

    @functools.cached_property
    def _word_start_table(self) -> np.ndarray:
        """WordPiece: not a "##" continuation. BPE/Unigram: the token carries the space
        ("Ġ" byte-level, "▁" SentencePiece), or is special."""
        model = json.loads(self._tokenizer.to_str())["model"]
        special = set(int(i) for i in self.special_ids)
        if model.get("type") == "WordPiece":
            prefix = model.get("continuing_subword_prefix") or "##"
            table = [not t.startswith(prefix) for t in self._tokens]
        else:
            table = [t.startswith(("\u0120", "\u2581", " ")) or i in special
                     for i, t in enumerate(self._tokens)]
        return np.asarray(table, bool)

    def word_start_mask(self, ids: np.ndarray) -> np.ndarray:
        return self._word_start_table[np.asarray(ids)]

    @functools.cached_property
    def sentence_end_table(self) -> np.ndarray:
        return np.asarray([self._tokenizer.decode([i]).rstrip("\"'\u201d\u2019)").endswith(
            (".", "!", "?")) for i in range(self.vocab_size)], bool)

    @functools.cached_property
    def content_sha256(self) -> str:
        """What identifies this tokenizer: its files and resolved special ids."""
        digest = hashlib.sha256(self._tokenizer.to_str().encode())
        digest.update(json.dumps(self.declared_ids, sort_keys=True).encode())
        return digest.hexdigest()

    # -- encode / decode -----------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's character span in ``text`` (chat loss masks)."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, [tuple(o) for o in encoding.offsets]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tokenizer.encode_batch(list(texts),
                                                             add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text up to EOS, padding dropped (a tokenizer without a pad token drops none)."""
        eos, pad = self.declared_ids["eos"], self.pad_id
        out = []
        for token in np.asarray(list(ids), dtype=np.int64).tolist():
            if eos is not None and token == eos:
                break
            if pad is not None and token == pad:
                continue
            out.append(token)
        return self._tokenizer.decode(out, skip_special_tokens=False)


# -- our vocabularies as Hugging Face tokenizer folders ----------------------------------------

def write_tokenizer(vocabulary, out_dir, framing: tuple[list[int], list[int]] | None = None,
                    padding_side: str = "",
                    chat_framing: tuple[list[int], list[int]] | None = None) -> list[str]:
    """Writes ``vocabulary`` into ``out_dir`` as files ``AutoTokenizer`` loads, with the
    same ids ours give; returns the names written. ``framing``: ``(prefix, suffix)`` ids
    the tokenizer adds around every text (its template: ``tokenizer(text)`` then gives a
    model's prompt as its run built one); ``padding_side``: where a batch pads ("left" for
    a decoder, whose generation continues each row's last token); ``chat_framing``:
    ``(prefix, suffix)`` ids around a user's message in a chat template (an assistant's
    message is its text). An imported tokenizer is written back as it came, its own
    templates included."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    real = vocabulary._factory() if hasattr(vocabulary, "_factory") else vocabulary
    if isinstance(real, HfTokenizerVocabulary):  # an imported tokenizer goes back as it came
        names = tokenizer_files(real.folder)
        for name in names:
            shutil.copyfile(real.folder / name, out_dir / name)
        return names
    if isinstance(real, vocabularies.SentencePieceVocabulary):
        tokenizer, settings = sentencepiece_tokenizer(real)
        name = pathlib.Path(real.model_path).name  # the name is part of its fingerprint
        shutil.copyfile(real.model_path, out_dir / name)
        native = {"class": "SentencePieceVocabulary", "file": name, "extra_ids": real.extra_ids}
        written = [name]
    elif isinstance(real, vocabularies.WordPieceVocabulary):
        tokenizer = real._tokenizer._tokenizer
        settings = {"pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]",
                    "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "do_lower_case": real._tokenizer._parameters.get("lowercase", True)}
        shutil.copyfile(real.vocab_path, out_dir / "vocab.txt")
        native = {"class": "WordPieceVocabulary", "file": "vocab.txt",
                  "lowercase": settings["do_lower_case"]}
        written = ["vocab.txt"]
    elif isinstance(real, vocabularies.ByteVocabulary):
        tokenizer = byte_tokenizer(real)
        settings = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                    "extra_special_tokens": [f"<extra_id_{i}>" for i in range(real.extra_ids)]}
        native = {"class": "ByteVocabulary", "extra_ids": real.extra_ids}
        written = []
    else:
        raise ValueError(f"Cannot write a Hugging Face tokenizer for {type(real).__name__}.")
    if framing is not None and any(framing):
        tokenizer.post_processor = template_processing(tokenizer, *framing)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1_000_000_000,
                **settings, **({"padding_side": padding_side} if padding_side else {})}
    if chat_framing is not None:
        settings["chat_template"] = user_message_template(tokenizer, *chat_framing)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    (out_dir / NATIVE_FILE).write_text(json.dumps(native, indent=2))
    return written + ["tokenizer.json", "tokenizer_config.json", NATIVE_FILE]


def user_message_template(tokenizer, prefix: list[int], suffix: list[int]) -> str:
    """A chat template (Jinja, as ``apply_chat_template`` renders it) that frames each
    message not the assistant's with ``prefix`` and ``suffix``'s tokens (the prefix once,
    at the start) and writes the assistant's as it is."""
    def text(ids):
        return "".join(tokenizer.id_to_token(int(i)) for i in ids).replace("'", "\\'")
    return ("{{ '" + text(prefix) + "' }}{% for message in messages %}"
            "{{ message['content'] }}{% if message['role'] != 'assistant' %}{{ '"
            + text(suffix) + "' }}{% endif %}{% endfor %}")


def template_processing(tokenizer, prefix: list[int], suffix: list[int]):
    """A ``tokenizers`` template adding ``prefix`` and ``suffix`` ids around a text (and
    around each of a pair, as BERT's ``[CLS] a [SEP] b [SEP]`` when both are given)."""

    def names(ids):
        return [tokenizer.id_to_token(int(i)) for i in ids]

    before, after = names(prefix), names(suffix)
    single = [*before, "$A", *after]
    pair = [*single, "$B:1", *[f"{name}:1" for name in after]]
    special = sorted({(name, int(i)) for name, i in zip(before + after, prefix + suffix,
                                                        strict=True)})
    return processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                         special_tokens=special)


def sentencepiece_tokenizer(vocabulary):
    """Our SentencePiece model (and its sentinels) as a ``tokenizers`` Unigram tokenizer
    giving the same ids, and the tokenizer_config settings naming its special tokens.

    SentencePiece normalizes the whole text (NFKC, outer spaces stripped, runs of
    spaces collapsed), prefixes "▁" and splits before every "▁" and digit; its
    control pieces are never produced from text, and user-defined pieces ([MASK],
    [CLS], [SEP]) match anywhere. Sentinels are added tokens that take the space
    before them, as the piece "▁<extra_id_N>" does. Not reproduced: text that starts
    with a user-defined piece or a sentinel directly followed by a letter.
    """
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(
        pathlib.Path(vocabulary.model_path).read_bytes())
    if proto.trainer_spec.model_type != 1:
        raise ValueError(f"{vocabulary.model_path} is not a Unigram SentencePiece model; only "
                         "Unigram models are written as tokenizer.json.")
    kind = sentencepiece_model_pb2.ModelProto.SentencePiece
    tokenizer = Tokenizer(models.Unigram([(p.piece, p.score) for p in proto.pieces],
                                         proto.trainer_spec.unk_id,
                                         proto.trainer_spec.byte_fallback))
    steps = []
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    if proto.normalizer_spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    tokenizer.normalizer = normalizers.Sequence(steps)
    prepend = "always" if proto.normalizer_spec.add_dummy_prefix else "never"
    splits = [pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)]
    if proto.trainer_spec.split_digits:
        splits.append(pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tokenizer.decoder = decoders.Sequence([
        decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)])
    # normalized=True: added tokens are found after normalization, so whole-text steps
    # (strip, collapse) see the text as SentencePiece does.
    tokenizer.add_special_tokens([AddedToken(p.piece, special=True, normalized=True)
                                  for p in proto.pieces if p.type == kind.CONTROL])
    tokenizer.add_tokens([AddedToken(p.piece, special=False, normalized=True)
                          for p in proto.pieces if p.type == kind.USER_DEFINED])
    tokenizer.add_special_tokens([
        AddedToken(f"<extra_id_{i}>", special=True, lstrip=True, normalized=True)
        for i in reversed(range(vocabulary.extra_ids))])

    def piece(piece_id):
        return proto.pieces[piece_id].piece if 0 <= piece_id < len(proto.pieces) else None

    settings = {"eos_token": piece(vocabulary.eos_id), "pad_token": piece(vocabulary.pad_id),
                "unk_token": piece(vocabulary.unk_id), "bos_token": piece(vocabulary.bos_id)}
    for name, text in (("mask", "[MASK]"), ("cls", "[CLS]"), ("sep", "[SEP]")):
        if tokenizer.token_to_id(text) is not None:
            settings[f"{name}_token"] = text
    if vocabulary.extra_ids:
        settings["extra_special_tokens"] = [f"<extra_id_{i}>"
                                            for i in range(vocabulary.extra_ids)]
    return tokenizer, {k: v for k, v in settings.items() if v is not None}


def byte_tokenizer(vocabulary):
    """ByT5's ids (pad 0, eos 1, unk 2, byte b at b + 3, ``<extra_id_0>`` highest) as a
    ``tokenizers`` tokenizer: a BPE without merges over GPT-2's byte alphabet.
    transformers' own ByT5Tokenizer numbers its sentinels upwards from 259, so the
    tokenizer is written out rather than named. Not reproduced: our byte vocabulary
    never reads ``<extra_id_N>`` in text as a sentinel; this tokenizer does."""

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    by_byte = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({ch: _byte_of(ch) + vocabulary.OFFSET for ch in by_byte})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in ("<pad>", "</s>", "<unk>")])
    tokenizer.add_special_tokens([AddedToken(f"<extra_id_{i}>", special=True)
                                  for i in reversed(range(vocabulary.extra_ids))])
    return tokenizer


@functools.lru_cache(maxsize=1)
def _byte_alphabet_inverse() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, inverted: character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    codes, extra = {}, 0
    for b in range(256):
        if b in printable:
            codes[chr(b)] = b
        else:
            codes[chr(256 + extra)] = b
            extra += 1
    return codes


def _byte_of(ch: str) -> int:
    return _byte_alphabet_inverse()[ch]
