"""Train here, use anywhere (issue 63): a tiny run of each generating family we pretrain,
exported by ``convert export`` with no flag but the folders, loads in transformers with
``AutoTokenizer`` and the ``Auto*`` class of its head, and ``tokenizer(text)`` (for a
run trained on inputs, its chat template) then ``generate(**inputs)`` with default
arguments gives ``infer``'s tokens on 16 prompts: the exported tokenizer frames a text as
the run's tasks framed a prompt, and ``generation_config.json`` holds the run's special
ids and decode length.

The comparison decodes transformers' ids with our vocabulary, as ``infer`` decodes its
own (``evaluator._decode``), so a sentinel or a space decodes the same on both sides.

Beside generation: ``pipeline("fill-mask")`` on a BERT run's export names our top 5,
ELECTRA's discriminator scores as ours, lm-eval's ``hf`` model with its defaults equals
our lm-eval model, and a T5 or BART run's ``eval`` rank scores equal transformers'."""

import json

import pytest
import torch
import transformers

from t5x_like import infer, train
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.convert import __main__ as convert_cli
from t5x_like.evaluation import evaluator

TINY = ["--config.model.d_model=32", "--config.model.num_heads=2",
        "--config.model.head_dim=16", "--config.model.d_ff=64"]
LLAMA = ["--config.model.norm=rmsnorm", "--config.model.use_bias=False",
         "--config.model.tie_embeddings=False", "--config.model.mlp_activations=silu,linear",
         "--config.model.positions.kind=rotary", "--config.model.attention.num_kv_heads=1"]
SEQ2SEQ = ["--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
           "--config.task_feature_lengths.inputs=32", "--config.task_feature_lengths.targets=12"]

#: the cases trained on inputs, whose prompts travel as the chat template
CHAT = ("gpt2_sft",)
#: name: (config, overrides, transformers' class, the architecture config.json names,
#:        infer's flags: free text (an inputs length) or the task's own examples)
CASES = {
    "gpt2": ("configs/pretrain/gpt2_tiny.py",
             [*TINY, "--config.model.num_layers=1", "--config.task_feature_lengths.targets=12"],
             transformers.AutoModelForCausalLM, "GPT2LMHeadModel", ["--inputs_length=20"]),
    "llama": ("configs/pretrain/gpt2_tiny.py",
              [*TINY, *LLAMA, "--config.model.num_layers=1",
               "--config.task_feature_lengths.targets=12"],
              transformers.AutoModelForCausalLM, "LlamaForCausalLM", ["--inputs_length=20"]),
    "gpt2_sft": ("configs/finetune/gpt2_tiny_arithmetic_sft.py",
                 [*TINY, "--config.model.num_layers=1"],
                 transformers.AutoModelForCausalLM, "GPT2LMHeadModel",
                 ["--task=embedded_arithmetic", "--split=validation"]),
    "t5": ("configs/pretrain/t5_tiny.py", [*TINY, *SEQ2SEQ],
           transformers.AutoModelForSeq2SeqLM, "T5ForConditionalGeneration", []),
    "bart": ("configs/bart_base.py",
             [*TINY, *SEQ2SEQ, "--config.model.positions.max_length=64"],
             transformers.AutoModelForSeq2SeqLM, "BartForConditionalGeneration", []),
}


def prompts(count=16) -> list[str]:
    """Openings of the embedded corpus's lines: a few words each, inside every case's
    inputs length."""
    lines = [line for doc in tasks.embedded_en_documents("train") for line in doc.split("\n")
             if len(line.split()) >= 6]
    return [" ".join(line.split()[:4]) for line in lines[:count]]


def train_and_export(root, config: str, overrides) -> None:
    """``root/run``: 10 tiny steps of ``config``; ``root/hf``: its ``convert export`` with
    no flag but the folders."""
    assert train.main([f"--config={config}", f"--workdir={root / 'run'}", "--quiet",
                       "--config.num_train_steps=10", "--config.batch_size=8",
                       "--config.evals.held_out.batches=1", "--config.checkpoint.every_steps=10",
                       "--config.evals.held_out.every_steps=10", *overrides]) == 0
    assert convert_cli.main(["export", f"--checkpoint={root / 'run'}",
                             f"--out={root / 'hf'}"]) == 0


def export_case(name: str, root) -> tuple:
    """``(name, run workdir, its export, infer's records)`` of case ``name`` under
    ``root``: 10 steps of training, ``convert export --checkpoint=RUN --out=DIR``, then
    ``infer`` with its defaults on 16 prompts."""
    config, overrides, _, _, infer_flags = CASES[name]
    train_and_export(root, config, overrides)
    flags = list(infer_flags)
    if not any(flag.startswith("--task") for flag in flags):
        (root / "prompts.jsonl").write_text("".join(json.dumps({"inputs": text}) + "\n"
                                                    for text in prompts()))
        flags.append(f"--input_file={root / 'prompts.jsonl'}")
    assert infer.main([f"--checkpoint={root / 'run'}", f"--output_file={root / 'out.jsonl'}",
                       "--max_examples=16", *flags]) == 0
    records = [json.loads(line) for line in (root / "out.jsonl").read_text().splitlines()]
    assert len(records) == 16
    return name, root / "run", root / "hf", records


def prompt(tokenizer, name: str, text: str) -> dict:
    """The prompt a transformers user makes of ``text``: ``tokenizer(text)``; for a run
    trained on inputs (the SFT recipe), its chat template on one user message, which
    frames the text as the run's task did (``START text EOS``)."""
    if name in CHAT and tokenizer.chat_template is not None:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True, return_tensors="pt",
                                             return_dict=True)
    return tokenizer(text, return_tensors="pt")


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    return export_case(request.param, tmp_path_factory.mktemp(request.param))


def test_greedy_generate_with_default_arguments_gives_infers_tokens(exported):
    name, _, hf_dir, records = exported
    _, _, auto_class, architecture, _ = CASES[name]
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == [architecture]
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = auto_class.from_pretrained(hf_dir).eval()
    vocabulary = tasks.embedded_vocabulary()
    decoder_only = auto_class is transformers.AutoModelForCausalLM
    for record in records:
        inputs = prompt(tokenizer, name, record["inputs"])
        with torch.no_grad():
            out = model.generate(**inputs)  # every argument from generation_config.json
        generated = out[0, inputs["input_ids"].shape[1]:] if decoder_only else out[0, 1:]
        theirs = evaluator._decode(vocabulary, generated.numpy())
        assert theirs == record["prediction"], (name, record, inputs["input_ids"].tolist())


def test_the_tokenizer_frames_a_prompt_as_the_runs_tasks_did(exported):
    """The template's ids: a decoder's rows begin with its start id (the vocabulary's
    BOS since issue 63, never the pad id) and its tokenizer adds no EOS (lm-eval and TRL
    encode a context and its continuation apart); an SFT run's chat template ends a
    user's message with EOS as its task's inputs did; an encoder-decoder's input ends
    with EOS."""
    name, run, hf_dir, _ = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    vocabulary = tasks.embedded_vocabulary()
    text = "The garden was quiet"
    ids = list(vocabulary.encode(text))
    expected = {"gpt2": [3, *ids], "llama": [3, *ids], "gpt2_sft": [3, *ids],
                "t5": [*ids, 1], "bart": [*ids, 1]}[name]
    assert tokenizer(text).input_ids == expected
    chat = tokenizer.chat_template is not None
    assert chat == (name in CHAT)
    if chat:
        assert prompt(tokenizer, name, text)["input_ids"][0].tolist() == [3, *ids, 1]
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == vocabulary.eos_id
    assert generation["pad_token_id"] == vocabulary.pad_id
    saved = json.loads((run / "config.json").read_text())
    assert generation["max_new_tokens"] == saved["task_feature_lengths"]["targets"]
    if name in ("gpt2", "llama", "gpt2_sft"):
        assert saved["model"]["bos_id"] == generation["bos_token_id"] == vocabulary.bos_id
        assert tokenizer.padding_side == "left"


def test_lm_eval_hf_model_with_its_defaults_equals_our_lm_eval_model(tmp_path):
    """lm-eval's ``hf`` model on a language model's export, with nothing but
    ``pretrained`` (and a batch size) in its arguments, gives our ``t5x_like`` model's
    numbers on the run: multiple choice (acc, acc_norm, every request's log-likelihood and
    is_greedy), rolling perplexity and generation cut at stop sequences. Both encode
    with the checkpoint's framing: the tokenizer's template adds the run's start id."""
    import lm_eval  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)
    import test_harness_model as harness_tests

    from t5x_like.evaluation import harness_model

    _, run, hf_dir, _ = export_case("gpt2", tmp_path)
    harness_tests.write_tasks(tmp_path / "tasks")
    theirs = harness_tests.evaluate("hf", tmp_path, model_args=f"pretrained={hf_dir},batch_size=8,device=cpu")
    ours = harness_tests.evaluate(harness_model.NAME, tmp_path,
                                  model_args=f"checkpoint={run},batch_size=8")
    for task in harness_tests.TASKS:
        for key, value in theirs["results"][task].items():
            if isinstance(value, float) and not key.endswith("_stderr,none"):
                assert ours["results"][task][key] == pytest.approx(value, rel=1e-5), (task, key)
    for a, b in zip(harness_tests.samples(ours, "t5xl_cloze"),
                    harness_tests.samples(theirs, "t5xl_cloze"), strict=True):
        for [(score_a, greedy_a)], [(score_b, greedy_b)] in zip(a["resps"], b["resps"],
                                                                strict=True):
            assert score_a == pytest.approx(score_b, abs=1e-4) and greedy_a == greedy_b
    generated = [(a["resps"][0][0], b["resps"][0][0]) for a, b in zip(
        harness_tests.samples(ours, "t5xl_generate"),
        harness_tests.samples(theirs, "t5xl_generate"), strict=True)]
    assert all(a == b for a, b in generated), generated


def trained_and_exported(root, config: str, overrides) -> tuple:
    """A run of ``config`` (10 tiny steps), its ``convert export`` with no flag, and our
    model of the run's newest step with its host params (the model code, not the export)."""
    import ml_collections

    from t5x_like import structures

    train_and_export(root, config, overrides)
    flat, params, _, _, _ = convert_cli.load_for_export(str(root / "run"))
    return root / "hf", structures.build_model(ml_collections.ConfigDict(flat)), params


def masked_texts(count=16) -> list[str]:
    """Corpus openings with their third word masked, as a fill-mask user writes them."""
    texts = []
    for text in prompts(count):
        words = text.split()
        texts.append(" ".join([*words[:2], "[MASK]", *words[3:]]))
    return texts


def test_fill_mask_pipeline_on_a_bert_export_gives_our_top_5(tmp_path):
    """BERT pretrained here with MLM, exported: ``pipeline("fill-mask")`` with its
    defaults (the exported tokenizer frames a text as ``[CLS] text [SEP]``, as the MLM
    task did) names our model's five likeliest tokens at the mask, in order, with their
    probabilities."""
    import numpy as np

    hf_dir, model, params = trained_and_exported(
        tmp_path, "configs/pretrain/bert_tiny.py",
        [*TINY, "--config.model.num_layers=1", "--config.task_feature_lengths.inputs=32"])
    assert json.loads((hf_dir / "config.json").read_text())["architectures"] == [
        "BertForMaskedLM"]
    fill = transformers.pipeline("fill-mask", model=str(hf_dir))
    vocabulary = tasks.embedded_vocabulary()
    for text in masked_texts():
        theirs = fill(text)
        ids = [vocabulary.cls_id, *vocabulary.encode(text), vocabulary.sep_id]
        assert fill.tokenizer(text).input_ids == ids
        logits = np.asarray(model.apply({"params": params}, np.asarray([ids]))["mlm_logits"])
        row = logits[0, ids.index(vocabulary.mask_id)]
        probabilities = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        ours = np.argsort(-probabilities)[:5]
        assert [t["token"] for t in theirs] == ours.tolist(), text
        np.testing.assert_allclose([t["score"] for t in theirs], probabilities[ours],
                                   rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # two towers to compile and train (~20 s alone, ~40 s in a whole run)
def test_electra_discriminator_export_scores_as_ours(tmp_path):
    """ELECTRA pretrained here, exported as ``ElectraForPreTraining`` (the generator
    beside it as ``ElectraForMaskedLM``): the discriminator's replaced-token logits from
    ``tokenizer(text)`` equal ours within 1e-4."""
    import numpy as np

    hf_dir, model, params = trained_and_exported(
        tmp_path, "configs/pretrain/electra_tiny.py",
        [*TINY, "--config.model.num_layers=1", "--config.model.generator.num_layers=1",
         "--config.model.generator.d_ff=64", "--config.task_feature_lengths.inputs=32"])
    assert json.loads((hf_dir / "config.json").read_text())["architectures"] == [
        "ElectraForPreTraining"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    theirs_model = transformers.AutoModelForPreTraining.from_pretrained(hf_dir).eval()
    for text in prompts():
        inputs = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            theirs = theirs_model(**inputs).logits[0].numpy()
        ours = model.apply({"params": params}, inputs["input_ids"].numpy(),
                           method=model.discriminate)["rtd_logits"]
        np.testing.assert_allclose(np.asarray(ours)[0], theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_eval_scores_of_an_encoder_decoder_export_equal_transformers(name, tmp_path):
    """``eval --mode=rank`` on a T5 or BART run pretrained here: each option's score (the
    summed log-probability of its tokens and EOS after the inputs) equals transformers'
    on the export, from ``tokenizer(text)`` and the option's ids as labels, within 1e-4."""
    import numpy as np

    from t5x_like import eval as eval_cli

    _, run, hf_dir, _ = export_case(name, tmp_path)
    out = tmp_path / "rank"
    assert eval_cli.main([f"--checkpoint={run}", "--task=embedded_austen_cloze",
                          "--split=test", "--max_examples=6", "--mode=rank", "--quiet",
                          "--inputs_length=64", f"--output_dir={out}"]) == 0
    records = [json.loads(line) for line in
               (out / "predictions" / "embedded_austen_cloze" / "step_10.jsonl")
               .read_text().splitlines()]
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    vocabulary = tasks.embedded_vocabulary()
    whole = [r for r in records if len(tokenizer(r["inputs"]).input_ids) <= 64]
    assert len(whole) >= 2
    for record in whole:
        inputs = tokenizer(record["inputs"], return_tensors="pt")
        theirs = []
        for option in record["options"]:
            labels = torch.tensor([[*vocabulary.encode(option), vocabulary.eos_id]])
            with torch.no_grad():
                logits = model(**inputs, labels=labels).logits
            log_probs = torch.log_softmax(logits, -1)[0, torch.arange(labels.shape[1]),
                                                      labels[0]]
            theirs.append(float(log_probs.sum()))
        np.testing.assert_allclose(record["option_scores"], theirs, rtol=1e-4, atol=1e-4)
