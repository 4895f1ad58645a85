"""Byte (ByT5) and WordPiece (BERT vocab.txt) vocabularies, and objectives on them."""

import itertools

import numpy as np
import pytest

import t5x_like.data as td
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import preprocessors as pp

WORDPIECE_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "the", "cat", "sat",
                    "on", "mat", "dog", "play", "##ing", "##s", "a"]


@pytest.fixture
def wordpiece(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(WORDPIECE_TOKENS) + "\n")
    return td.WordPieceVocabulary(str(path))


def test_byte_vocabulary_round_trips_any_language_and_sentinels():
    vocab = td.ByteVocabulary()
    text = "Hola, 元始に神天地を創造たまへり ☃"
    ids = vocab.encode(text)
    assert min(ids) >= 3 and max(ids) < 259 and vocab.vocab_size == 384
    assert vocab.decode(ids + [vocab.sentinel_id(0)] + [vocab.eos_id, 50]) == text + "<extra_id_0>"
    assert vocab.decode([0xC3 + 3]) == "\ufffd"  # a cut UTF-8 sequence decodes, never raises


def test_wordpiece_encodes_decodes_and_knows_bert_ids(wordpiece):
    ids = wordpiece.encode("The cats sat on the mat playing.")
    pieces = [WORDPIECE_TOKENS[i] for i in ids]
    assert pieces == ["the", "cat", "##s", "sat", "on", "the", "mat", "play", "##ing", "."]
    assert wordpiece.decode(ids) == "the cats sat on the mat playing."
    assert (wordpiece.pad_id, wordpiece.cls_id, wordpiece.sep_id, wordpiece.mask_id) == (0, 2, 3, 4)
    assert wordpiece.word_start_mask(ids).tolist() == [p[:2] != "##" for p in pieces]
    assert wordpiece.random_token_range == (5, len(WORDPIECE_TOKENS))


def test_whole_word_mlm_on_wordpiece_masks_whole_words(wordpiece):
    td.TaskRegistry.add("wp_mlm", td.InMemorySource({"train": [
        {"text": "the cats sat on the mat playing. the dogs sat on a cat playing."}] * 20}),
        tasks.mlm_steps(whole_word=True),
        tasks.features("inputs", "targets", vocabulary=wordpiece))
    try:
        for ex in itertools.islice(iter(td.get_dataset("wp_mlm", {"inputs": 16}, seed=1)), 20):
            assert ex["inputs"][0] == wordpiece.cls_id and ex["inputs"][-1] == wordpiece.sep_id
            starts = wordpiece.word_start_mask(ex["targets"])
            sel = ex["loss_weights"] > 0
            for i in np.flatnonzero(sel):
                if not starts[i] and ex["targets"][i - 1] != wordpiece.cls_id:
                    # (a chunk may open mid-word: that piece is a word of its own)
                    assert sel[i - 1], "a ## piece was selected without its word"
    finally:
        td.TaskRegistry.remove("wp_mlm")


def test_wordpiece_vocab_without_mask_is_refused(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(ValueError, match="has no \\[MASK\\]"):
        td.WordPieceVocabulary(str(path))


def test_byte_span_corruption_fills_inputs():
    vocab = td.ByteVocabulary()
    ex = next(iter(td.get_dataset("embedded_bytes_ja_span_corruption",
                                  {"inputs": 64, "targets": 16})))
    assert ex["inputs"].size == 64 and ex["targets"][0] == vocab.sentinel_id(0)
    assert pp.random_spans_helper(64, 0.15, 3.0)[1] <= 16
