"""Tokenizers travel with checkpoints: Hugging Face tokenizers as vocabularies, kept by
``convert import``, written by ``convert export``, and used by ``--vocabulary``."""

import json

import numpy as np
import pytest
import torch
import transformers
from hf_helpers import tiny_gpt2_with_tokenizer, tiny_hf_gpt2

from t5x_like import eval as eval_cli
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.convert import __main__ as convert_cli
from t5x_like.data import dataset_providers as dp
from t5x_like.data import hf_tokenizers
from t5x_like.evaluation import few_shot

CLOZE = "embedded_austen_cloze"


def corpus_lines(count: int) -> list[str]:
    lines = [line for doc in tasks.embedded_en_documents("train") for line in doc.split("\n")]
    return lines[:count]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random GPT-2 with a byte-level BPE trained on the corpus, and its import."""
    root = tmp_path_factory.mktemp("gpt2_bpe")
    model, tokenizer = tiny_gpt2_with_tokenizer(root / "hf")
    assert convert_cli.main(["import", f"--hf_dir={root / 'hf'}", f"--out={root / 'ours'}"]) == 0
    return root, model, tokenizer


def test_an_imported_tokenizer_is_kept_with_its_special_ids(gpt2):
    root, _, tokenizer = gpt2
    metadata = json.loads((root / "ours" / "metadata.json").read_text())
    assert "tokenizer.json" in metadata["tokenizer"]["files"]
    vocabulary = hf_tokenizers.load(root / "ours" / "tokenizer")
    assert vocabulary.vocab_size == len(tokenizer) == 600
    assert vocabulary.eos_id == tokenizer.eos_token_id and vocabulary.pad_id is None
    assert vocabulary.extra_ids == 0
    for line in corpus_lines(300):
        assert vocabulary.encode(line) == tokenizer.encode(line, add_special_tokens=False)
    assert vocabulary.decode(vocabulary.encode("Emma smiled.") + [vocabulary.eos_id, 5]) == \
        "Emma smiled."
    with pytest.raises(ValueError, match="declares no mask token"):
        _ = vocabulary.mask_id


def test_checkpoint_vocabulary_scores_equal_transformers(gpt2, tmp_path):
    """``eval --vocabulary=checkpoint`` on a built-in multiple-choice task: every choice's
    written log-likelihood equals transformers' with the same tokenizer, 0 and 2 shots."""
    root, model, tokenizer = gpt2
    width = model.config.n_positions
    for shots in (0, 2):
        out = tmp_path / f"eval_{shots}"
        assert eval_cli.main([f"--checkpoint={root / 'ours'}", f"--task={CLOZE}", "--split=test",
                              "--max_examples=6", f"--num_shots={shots}", "--quiet",
                              "--vocabulary=checkpoint", f"--output_dir={out}"]) == 0
        records = [json.loads(line) for line in
                   (out / "predictions" / CLOZE / "step_0.jsonl").read_text().splitlines()]
        assert len(records) == 6 and all(len(r["option_scores"]) == 4 for r in records)
        assert all(r["inputs"].count("\n\n") >= shots for r in records)
        examples = dp.get_task_or_mixture(CLOZE).get_dataset(
            "test", {"targets": width}, shuffle=False, num_epochs=1)
        correct = []
        for record, example in zip(records, examples, strict=False):
            options = [str(o, "utf-8") if isinstance(o, bytes) else str(o)
                       for o in example["options"]]
            theirs = [hf_loglikelihood(model, tokenizer, record["inputs"], o, width)
                      for o in options]
            np.testing.assert_allclose(record["option_scores"], theirs, rtol=1e-4, atol=1e-4)
            correct.append(options[int(np.argmax(theirs))] == record["targets"])
        metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
        assert metrics["acc"] == pytest.approx(np.mean(correct))


def hf_loglikelihood(model, tokenizer, context, choice, width) -> float:
    """The harness's request scored by transformers: enc(context + " " + choice) after
    enc(context), the row cut from the left to ``width + 1`` tokens."""
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    whole = tokenizer.encode(context + few_shot.TARGET_DELIMITER + choice,
                             add_special_tokens=False)
    continuation = whole[len(context_ids):]
    tokens = (context_ids + continuation)[-(width + 1):]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens[:-1]])).logits.double()
    log_probs = torch.log_softmax(logits, -1)[0]
    n = len(continuation)
    return sum(float(log_probs[len(tokens) - 1 - n + i, t]) for i, t in enumerate(continuation))


def test_a_vocabulary_the_user_did_not_ask_for_is_refused(gpt2, tmp_path, capsys):
    root, _, _ = gpt2
    code = eval_cli.main([f"--checkpoint={root / 'ours'}", f"--task={CLOZE}", "--quiet",
                          f"--output_dir={tmp_path / 'eval'}", "--num_shots=0"])
    err = capsys.readouterr().err
    assert code == 2 and "SentencePieceVocabulary(8192" in err and "600 rows" in err
    assert "--vocabulary=checkpoint" in err


def test_vocabulary_checkpoint_without_a_tokenizer_is_refused(tmp_path, capsys):
    tiny_hf_gpt2().save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    assert "no tokenizer files" in capsys.readouterr().err
    code = eval_cli.main([f"--checkpoint={tmp_path / 'ours'}", f"--task={CLOZE}", "--quiet",
                          "--vocabulary=checkpoint", f"--output_dir={tmp_path / 'eval'}"])
    err = capsys.readouterr().err
    assert code == 2 and "carries no tokenizer" in err and "--vocabulary=PATH" in err
    assert not (tmp_path / "eval" / "metrics.jsonl").exists()


def test_a_tokenizer_larger_than_the_embedding_table_is_refused(gpt2, tmp_path, capsys):
    root, _, tokenizer = gpt2
    small = tiny_hf_gpt2()  # 100 embedding rows
    small.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")  # 600 tokens
    code = convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}", f"--out={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert code == 2 and "600 tokens" in err and "100 rows" in err
    assert not (tmp_path / "o").exists()


def test_span_corruption_on_a_vocabulary_without_sentinels_is_refused(gpt2, tmp_path, capsys):
    from t5x_like import train

    root, _, _ = gpt2
    code = train.main([f"--config=configs/finetune/pretrained_folder.py:{root / 'ours'}",
                       f"--workdir={tmp_path / 'run'}", "--config.eval.mixture=",
                       "--config.task=embedded_en_span_corruption"])
    err = capsys.readouterr().err
    assert code == 2 and "sentinel tokens <extra_id_N>" in err and "HfTokenizerVocabulary(600" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


def test_exported_tokenizers_load_with_autotokenizer_and_give_our_ids(tmp_path):
    """The embedded SentencePiece (sentinels included) and the byte vocabulary, written
    as tokenizer files, tokenize 1,000 corpus lines and multilingual text to our ids."""
    lines = corpus_lines(1000)
    multilingual = ["Hola, ¿qué tal? Ça va très bien.", "元始に神天地を創造たまへり ☃",
                    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich."]
    for vocabulary in (tasks.embedded_vocabulary(), tasks.byte_vocabulary()):
        folder = tmp_path / type(vocabulary).__name__
        hf_tokenizers.write_tokenizer(vocabulary, folder)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        for text in lines + multilingual:
            assert tokenizer.encode(text, add_special_tokens=False) == vocabulary.encode(text)
        assert tokenizer.eos_token_id == vocabulary.eos_id
        assert tokenizer.pad_token_id == vocabulary.pad_id
        for index in (0, 7, vocabulary.extra_ids - 1):
            assert tokenizer.convert_tokens_to_ids(f"<extra_id_{index}>") == \
                vocabulary.sentinel_id(index)
        ids = vocabulary.encode(lines[3])
        assert tokenizer.decode(ids) == vocabulary.decode(ids)
        # Read back, it is our own vocabulary again (same fingerprint, same ids).
        assert type(hf_tokenizers.load(folder)) is type(vocabulary)
    sentinel_text = "The <extra_id_0> sat on <extra_id_1> mat."
    vocabulary = tasks.embedded_vocabulary()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "SentencePieceVocabulary")
    assert tokenizer.encode(sentinel_text, add_special_tokens=False) == \
        vocabulary.encode(sentinel_text)


def test_wordpiece_vocabulary_exports_with_equal_ids(tmp_path):
    from tokenizers import BertWordPieceTokenizer

    from t5x_like.data import vocabularies

    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(corpus_lines(3000), vocab_size=500, show_progress=False)
    trainer.save_model(str(tmp_path))
    vocabulary = vocabularies.WordPieceVocabulary(str(tmp_path / "vocab.txt"))
    hf_tokenizers.write_tokenizer(vocabulary, tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in corpus_lines(1000):
        assert tokenizer.encode(text, add_special_tokens=False) == vocabulary.encode(text)
    assert (tokenizer.mask_token_id, tokenizer.cls_token_id) == (vocabulary.mask_id,
                                                                 vocabulary.cls_id)


def test_convert_export_writes_the_tokenizer_and_its_ids_into_config(gpt2, tmp_path):
    root, _, tokenizer = gpt2
    assert convert_cli.main(["export", f"--checkpoint={root / 'ours'}",
                             f"--out={tmp_path / 'hf'}"]) == 0
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    line = corpus_lines(1)[0]
    assert loaded.encode(line) == tokenizer.encode(line)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] == tokenizer.eos_token_id
    # Import of the export keeps it again: the round trip carries the tokenizer.
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'again'}"]) == 0
    again = hf_tokenizers.load(tmp_path / "again" / "tokenizer")
    assert again.encode(line) == tokenizer.encode(line, add_special_tokens=False)


def test_fine_tuning_in_the_checkpoints_tokenizer(gpt2, tmp_path, capsys):
    """``configs/finetune/pretrained_folder.py:FOLDER`` trains an imported GPT-2 on the
    benchmark mixture tokenized with its own BPE; the run keeps the tokenizer, so eval
    needs --vocabulary=checkpoint and refuses the built-in vocabulary."""
    from t5x_like import train

    root, _, tokenizer = gpt2
    workdir = tmp_path / "ft"
    code = train.main([f"--config=configs/finetune/pretrained_folder.py:{root / 'ours'}",
                       f"--workdir={workdir}", "--quiet", "--config.num_train_steps=2",
                       "--config.batch_size=8", "--config.eval_batches=1",
                       "--config.checkpoint_every_steps=2", "--config.eval_every_steps=2",
                       "--config.eval.mixture=", "--config.log_every_steps=1"])
    assert code == 0, capsys.readouterr().err
    copy = hf_tokenizers.load(workdir / "tokenizer")
    line = corpus_lines(1)[0]
    assert copy.encode(line) == tokenizer.encode(line, add_special_tokens=False)
    task = "embedded_spam"
    assert eval_cli.main([f"--checkpoint={workdir}", f"--task={task}", "--quiet",
                          "--max_examples=4", f"--output_dir={tmp_path / 'refused'}"]) == 2
    assert "--vocabulary=checkpoint" in capsys.readouterr().err
    assert eval_cli.main([f"--checkpoint={workdir}", f"--task={task}", "--quiet",
                          "--max_examples=4", "--vocabulary=checkpoint",
                          f"--output_dir={tmp_path / 'eval'}"]) == 0
    record = json.loads((tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["task"] == task and record["step"] == 2


LM_EVAL_TASK = "t5x_like_austen_cloze"


def lm_eval_agreement(hf_dir, checkpoint, vocabulary, width, tmp_path, extra=(), prefix=()
                      ) -> list[dict]:
    """lm-eval's HFLM on ``hf_dir`` (a ``width``-token window) and our ``eval`` on
    ``checkpoint`` (its default window, the same width), 0 and 2 shots on the first 6
    test examples of the cloze task: one comparison row per shot count."""
    from t5x_like.evaluation import lm_eval_harness as harness

    data = harness.write_task(tmp_path / "task", CLOZE, "test", LM_EVAL_TASK)
    lm = harness.load_model(hf_dir, width, batch_size=8)
    rows = []
    for shots in (0, 2):
        theirs = harness.run(lm, tmp_path / "task", LM_EVAL_TASK, shots, limit=6)
        out = tmp_path / f"ours_{shots}"
        assert eval_cli.main([f"--checkpoint={checkpoint}", f"--task={CLOZE}", "--split=test",
                              "--max_examples=6", f"--num_shots={shots}", "--quiet",
                              f"--output_dir={out}", *extra]) == 0
        predictions = next((out / "predictions" / CLOZE).glob("step_*.jsonl"))
        ours = harness.ours_from_predictions(predictions, vocabulary, data["test"][:6], prefix)
        rows.append(harness.compare(theirs, ours))
    return rows


def test_lm_eval_agrees_with_our_eval_on_an_imported_gpt2(gpt2, tmp_path):
    """The Hugging Face folder scored by lm-eval, its import by ``eval
    --vocabulary=checkpoint``: same prompts and request tokens, log-likelihoods within
    1e-4, identical acc and acc_norm."""
    import lm_eval  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)
    root, model, _ = gpt2
    vocabulary = hf_tokenizers.load(root / "ours" / "tokenizer")
    rows = lm_eval_agreement(root / "hf", root / "ours", vocabulary, model.config.n_positions,
                             tmp_path, ["--vocabulary=checkpoint"])
    for row in rows:
        assert row["prompts identical"] == "yes" and row["agree"], row
        assert row["max |Δ loglik|"] < 1e-4, row


@pytest.fixture(scope="module")
def decoder_run(tmp_path_factory):
    """A one-layer decoder trained 3 steps on the built-in SentencePiece vocabulary, and
    its Hugging Face export (``convert export`` of the run's workdir)."""
    from t5x_like import train

    root = tmp_path_factory.mktemp("decoder_run")
    assert train.main(["--config=configs/pretrain/gpt2_tiny.py", f"--workdir={root / 'run'}",
                       "--quiet", "--config.num_train_steps=3", "--config.batch_size=8",
                       "--config.eval_batches=1", "--config.checkpoint_every_steps=3",
                       "--config.eval_every_steps=3", "--config.model.num_layers=1",
                       "--config.model.d_model=32", "--config.model.num_heads=2",
                       "--config.model.head_dim=16", "--config.model.d_ff=64"]) == 0
    assert convert_cli.main(["export", f"--checkpoint={root / 'run'}",
                             f"--out={root / 'hf'}"]) == 0
    return root


def test_convert_export_takes_a_run_and_writes_the_tokenizer_it_trained_with(decoder_run):
    tokenizer = transformers.AutoTokenizer.from_pretrained(decoder_run / "hf")
    vocabulary = tasks.embedded_vocabulary()
    line = corpus_lines(5)[4]
    assert tokenizer.encode(line, add_special_tokens=False) == vocabulary.encode(line)
    # The template adds the start id the run's rows began with (a language model's
    # prompt is a text to continue: no EOS after it); a batch pads on the left.
    assert tokenizer(line).input_ids == [vocabulary.bos_id, *vocabulary.encode(line)]
    assert tokenizer.padding_side == "left"
    config = json.loads((decoder_run / "hf" / "config.json").read_text())
    assert (config["eos_token_id"], config["bos_token_id"]) == (vocabulary.eos_id,
                                                                 vocabulary.bos_id)
    # generate's ids come from generation_config.json: the tokenizer's. A new run starts
    # its rows with <s> (3), not with the pad id 0, which generate and TRL mask.
    generation = transformers.GenerationConfig.from_pretrained(decoder_run / "hf")
    assert (generation.eos_token_id, generation.bos_token_id) == (vocabulary.eos_id,
                                                                 vocabulary.bos_id)
    assert config["decoder_start_token_id"] == vocabulary.bos_id == 3
    assert generation.pad_token_id == vocabulary.pad_id == 0
    # Imported back, the tokenizer is the built-in vocabulary again: its tasks need no flag.
    out = decoder_run.parent / (decoder_run.name + "_imported")
    assert convert_cli.main(["import", f"--hf_dir={decoder_run / 'hf'}", f"--out={out}"]) == 0
    again = hf_tokenizers.load(out / "tokenizer")
    assert type(again) is type(vocabulary) and again.vocab_size == vocabulary.vocab_size
    assert eval_cli.main([f"--checkpoint={out}", f"--task={CLOZE}", "--max_examples=2",
                          "--num_shots=0", "--quiet", f"--output_dir={out / 'eval'}"]) == 0


def test_lm_eval_agrees_with_our_eval_on_our_exported_decoder(decoder_run, tmp_path):
    """Our decoder's run scored by ``eval``, its export (weights and tokenizer.json) by
    lm-eval."""
    import lm_eval  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)
    # Both sides frame each text with the run's start id (<s>, 3): lm-eval's by the
    # exported tokenizer's template, ours as the structure's text prefix.
    rows = lm_eval_agreement(decoder_run / "hf", decoder_run / "run",
                             tasks.embedded_vocabulary(), 160, tmp_path,  # the run's length
                             prefix=(3,))
    for row in rows:
        assert row["prompts identical"] == "yes" and row["agree"], row
        assert row["max |Δ loglik|"] < 1e-4, row


def test_a_t5_style_tokenizer_json_gives_sentinels_and_span_corruption(tmp_path):
    """A tokenizer.json whose <extra_id_N> sit at the top of the ids (T5's) serves span
    corruption exactly as the SentencePiece vocabulary it was written from."""
    native = tasks.embedded_vocabulary()
    hf_tokenizers.write_tokenizer(native, tmp_path)
    (tmp_path / hf_tokenizers.NATIVE_FILE).unlink()  # read it as any Hugging Face tokenizer
    vocabulary = hf_tokenizers.load(tmp_path)
    assert type(vocabulary).__name__ == "HfTokenizerVocabulary"
    assert (vocabulary.extra_ids, vocabulary.eos_id, vocabulary.pad_id) == (100, 1, 0)
    assert vocabulary.sentinel_id(3) == native.sentinel_id(3)
    assert vocabulary.mask_id == native.mask_id
    lengths = {"inputs": 64, "targets": 16}
    task = dp.get_task_or_mixture("embedded_en_span_corruption")
    ours = list(dp.with_vocabulary(task, vocabulary).get_dataset("train", lengths, seed=3)
                .__iter__().__next__().items())
    reference = list(task.get_dataset("train", lengths, seed=3).__iter__().__next__().items())
    for (key, a), (_, b) in zip(ours, reference, strict=False):
        np.testing.assert_array_equal(a, b, err_msg=key)


def test_a_bert_tokenizer_serves_masked_lm_with_its_own_special_ids(tmp_path):
    from tokenizers import BertWordPieceTokenizer

    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(corpus_lines(3000), vocab_size=300, limit_alphabet=100,
                                show_progress=False,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=trainer._tokenizer, pad_token="[PAD]", unk_token="[UNK]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    assert len(tokenizer) > 200
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32,
                                     num_attention_heads=4, num_hidden_layers=1,
                                     intermediate_size=48, max_position_embeddings=40)
    transformers.BertForPreTraining(config).save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    vocabulary = hf_tokenizers.load(tmp_path / "ours" / "tokenizer")
    assert (vocabulary.mask_id, vocabulary.cls_id, vocabulary.sep_id, vocabulary.pad_id) == (
        tokenizer.mask_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, 0)
    task = dp.with_vocabulary(dp.get_task_or_mixture("embedded_en_mlm"), vocabulary)
    example = next(iter(task.get_dataset("train", {"inputs": 32, "targets": 32}, seed=0)))
    assert example["inputs"][0] == tokenizer.cls_token_id
    assert tokenizer.mask_token_id in example["inputs"]
    assert example["targets"].max() < vocabulary.vocab_size
    with pytest.raises(ValueError, match="sentinel"):
        dp.with_vocabulary(dp.get_task_or_mixture("embedded_en_span_corruption"),
                           vocabulary).get_dataset("train", {"inputs": 64, "targets": 16})


def test_infer_reads_text_in_the_checkpoints_tokenizer(gpt2, tmp_path, capsys):
    from t5x_like import infer

    root, _, _ = gpt2
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"inputs": "It is a truth universally acknowledged"}\n')
    assert infer.main([f"--checkpoint={root / 'ours'}", f"--input_file={inputs}",
                       f"--output_file={tmp_path / 'out.jsonl'}", "--max_decode_length=8",
                       "--inputs_length=32", "--batch_size=8"]) == 0
    record = json.loads((tmp_path / "out.jsonl").read_text())
    assert record["inputs"].startswith("It is") and isinstance(record["prediction"], str)
    assert infer.main([f"--checkpoint={root / 'ours'}", "--task=embedded_spam",
                       f"--output_file={tmp_path / 'refused.jsonl'}", "--inputs_length=32",
                       "--batch_size=8"]) == 2
    assert "--vocabulary=checkpoint" in capsys.readouterr().err



def test_export_with_a_vocabulary_that_does_not_load_is_refused(gpt2, tmp_path, capsys):
    root, _, _ = gpt2
    code = convert_cli.main(["export", f"--checkpoint={root / 'ours'}", f"--out={tmp_path / 'hf'}",
                             f"--vocabulary={tmp_path / 'nowhere'}"])
    err = capsys.readouterr().err
    assert code == 2 and "--vocabulary=" in err and "no such tokenizer folder" in err
    assert not (tmp_path / "hf").exists()


def hf_option_loglikelihood(model, tokens: list[int], option: list[int]) -> float:
    """transformers' summed log-probability of ``option`` after ``tokens``."""
    row = tokens + option
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([row[:-1]])).logits.double()
    log_probs = torch.log_softmax(logits, -1)[0]
    return sum(float(log_probs[len(tokens) - 1 + i, t]) for i, t in enumerate(option))


def test_rank_scores_of_an_imported_gpt2_are_its_causal_log_likelihoods(gpt2, tmp_path, capsys):
    """Rank mode (options scored as targets, no --num_shots) on an imported GPT-2 with its
    own BPE: each option's score is transformers' log-probability of the option's tokens
    and EOS after <|endoftext|> and the prompt, read causally as GPT-2 was trained."""
    root, model, tokenizer = gpt2
    out = tmp_path / "rank"
    assert eval_cli.main([f"--checkpoint={root / 'ours'}", f"--task={CLOZE}", "--split=test",
                          "--max_examples=4", "--mode=rank", "--vocabulary=checkpoint",
                          f"--output_dir={out}"]) == 0
    assert "prompts read with causal attention, rows start with id " \
        f"{tokenizer.bos_token_id}" in capsys.readouterr().out
    records = [json.loads(line) for line in
               (out / "predictions" / CLOZE / "step_0.jsonl").read_text().splitlines()]
    eos = tokenizer.eos_token_id
    # The task's inputs end with EOS (AppendEos); the prompt is cut to its 3/4 of the
    # 160 positions, so the rows compared are those whose prompt fits whole.
    prompts = [[tokenizer.bos_token_id] + tokenizer.encode(r["inputs"], add_special_tokens=False)
               + [eos] for r in records]
    whole = [(r, p) for r, p in zip(records, prompts, strict=True) if len(p) - 1 <= 120]
    assert len(records) == 4 and len(whole) >= 2
    for record, prompt in whole:
        theirs = [hf_option_loglikelihood(model, prompt, tokenizer.encode(
            option, add_special_tokens=False) + [eos]) for option in record["options"]]
        np.testing.assert_allclose(record["option_scores"], theirs, rtol=1e-4, atol=1e-4)


def test_rank_scores_of_our_causal_run_equal_its_export(decoder_run, tmp_path, capsys):
    """The same for a decoder this framework pretrained without inputs, on the built-in
    SentencePiece vocabulary: scored causally from its start id (<s>, 3), equal to its
    export."""
    model = transformers.AutoModelForCausalLM.from_pretrained(decoder_run / "hf").eval()
    config = json.loads((decoder_run / "hf" / "config.json").read_text())
    vocabulary = tasks.embedded_vocabulary()
    assert config["decoder_start_token_id"] == vocabulary.bos_id == 3
    out = tmp_path / "rank"
    assert eval_cli.main([f"--checkpoint={decoder_run / 'run'}", f"--task={CLOZE}",
                          "--split=test", "--max_examples=3", "--mode=rank",
                          "--inputs_length=216", "--targets_length=32",
                          f"--output_dir={out}"]) == 0
    assert "prompts read with causal attention, rows start with id 3" in capsys.readouterr().out
    records = [json.loads(line) for line in
               (out / "predictions" / CLOZE / "step_3.jsonl").read_text().splitlines()]
    eos = vocabulary.eos_id
    prompts = [[3] + list(vocabulary.encode(r["inputs"])) + [eos] for r in records]
    whole = [(r, p) for r, p in zip(records, prompts, strict=True) if len(p) - 1 <= 216]
    assert len(whole) >= 2
    for record, prompt in whole:
        theirs = [hf_option_loglikelihood(model, prompt, list(vocabulary.encode(option)) + [eos])
                  for option in record["options"]]
        np.testing.assert_allclose(record["option_scores"], theirs, rtol=1e-4, atol=1e-4)
