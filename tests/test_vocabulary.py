import hashlib

from t5x_like import train_vocab
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import embedded, vocabularies


def test_special_ids_follow_t5_conventions():
    vocab = tasks.embedded_vocabulary()
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.bos_id) == (0, 1, 2, 3)
    specials = {vocab.mask_id, vocab.cls_id, vocab.sep_id}
    assert len(specials) == 3 and not specials & {0, 1, 2, 3}
    assert vocab.vocab_size == 8192
    assert vocab.base_vocab_size == 8192 - 100


def test_sentinels_sit_at_the_top_of_the_id_range():
    vocab = tasks.embedded_vocabulary()
    assert vocab.sentinel_id(0) == vocab.vocab_size - 1
    assert vocab.sentinel_id(99) == vocab.base_vocab_size
    # seqio's spacing: the sentinel pieces are "\u2581<extra_id_N>".
    assert vocab.decode([vocab.sentinel_id(0), vocab.sentinel_id(1)]) == "<extra_id_0> <extra_id_1>"


def test_sentinel_text_encodes_and_decodes_as_seqio():
    # Values from seqio.SentencePieceVocabulary(embedded_en_8k.model, extra_ids=100), seqio 0.0.20.
    vocab = tasks.embedded_vocabulary()
    assert vocab.encode("Elizabeth <extra_id_3>. He") == [836, 8188, 265, 335]
    assert vocab.encode("<extra_id_0> <extra_id_99>") == [8191, 8092]
    assert vocab.sentinel_id(3) == 8188
    assert vocab.decode([50, 8191, 60, 61, 8190, 0, 1, 70]) == "+ <extra_id_0>56 <extra_id_1>"
    assert vocab.decode(vocab.encode("Elizabeth <extra_id_3>. He")) == "Elizabeth <extra_id_3>. He"
    assert vocab.base_vocab_size == 8092  # sentinels stay outside the SentencePiece range


def test_special_pieces_are_single_tokens():
    vocab = tasks.embedded_vocabulary()
    assert vocab.encode("[MASK]")[-1] == vocab.mask_id
    assert vocab.cls_id in vocab.encode("[CLS] a [SEP]")


def test_encode_decode_round_trip_and_no_unknowns():
    vocab = tasks.embedded_vocabulary()
    text = "It is a truth universally acknowledged, that thou art ☃ 1811."
    ids = vocab.encode(text)
    assert vocab.unk_id not in ids  # byte fallback covers unseen characters
    assert vocab.decode(ids + [vocab.eos_id, 42]) == text


def test_vocab_training_is_deterministic(tmp_path):
    documents = tasks.embedded_en_documents("validation")
    first = train_vocab.train_sentencepiece(documents, vocab_size=600)
    second = train_vocab.train_sentencepiece(documents, vocab_size=600)
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()
    path = tmp_path / "small.model"
    path.write_bytes(first)
    vocab = vocabularies.SentencePieceVocabulary(str(path), extra_ids=10)
    assert vocab.vocab_size == 610 and vocab.mask_id > vocab.bos_id


def test_checked_in_vocabulary_is_reproduced_by_the_script(tmp_path):
    out = tmp_path / "rebuilt.model"
    train_vocab.main(["--output", str(out)])
    with open(embedded.vocab_model_path(), "rb") as f:
        assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(f.read()).digest()


def test_missing_model_file_names_the_fix(tmp_path):
    import pytest
    with pytest.raises(FileNotFoundError, match="python -m t5x_like.train_vocab"):
        vocabularies.SentencePieceVocabulary(str(tmp_path / "absent.model"))


def test_model_with_other_special_ids_is_refused(tmp_path):
    import io

    import pytest
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(tasks.embedded_en_documents("validation")),
                                   model_writer=model, vocab_size=300, minloglevel=2)  # unk=0
    path = tmp_path / "default_ids.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(ValueError, match="needs pad_id=0 \\(T5 convention\\)"):
        vocabularies.SentencePieceVocabulary(str(path))


def test_ids_are_sentencepieces_own_below_the_sentinels():
    """The ids of ordinary text are what SentencePiece itself gives for the model file
    (read here with sentencepiece directly, not through t5x_like), and the 100 sentinels
    take the top ids, <extra_id_0> first (seqio's convention)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=embedded.vocab_model_path())
    vocab = tasks.embedded_vocabulary()
    for text in ("It is a truth universally acknowledged.", "In the beginning God created",
                 "Ay, marry, is't: but to my mind", "1811 ☃ naïve"):
        assert vocab.encode(text) == processor.encode(text)
        assert vocab.decode(processor.encode(text)) == processor.decode(processor.encode(text))
    assert processor.get_piece_size() == vocab.base_vocab_size == 8092
    assert [vocab.sentinel_id(n) for n in (0, 1, 99)] == [8191, 8190, 8092]
