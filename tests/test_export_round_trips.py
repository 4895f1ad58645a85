"""Train here, use anywhere (issue 63): a tiny run of each generating family we pretrain,
exported by ``convert export`` with no flag but the folders, loads in transformers with
``AutoTokenizer`` and the ``Auto*`` class of its head, and ``tokenizer(text)`` then
``generate(**inputs)`` with default arguments gives ``infer``'s tokens on 16 prompts: the
exported tokenizer frames a text as the run's tasks framed a prompt (its template), and
``generation_config.json`` holds the run's special ids and decode length.

The comparison decodes transformers' ids with our vocabulary, as ``infer`` decodes its
own (``evaluator._decode``), so a sentinel or a space decodes the same on both sides."""

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


def export_case(name: str, root) -> tuple:
    """``(name, run workdir, its export, infer's records)`` of case ``name`` under
    ``root``: 10 steps of training, ``convert export --checkpoint=RUN --out=DIR``, then
    ``infer`` with its defaults on 16 prompts."""
    config, overrides, _, _, infer_flags = CASES[name]
    assert train.main([f"--config={config}", f"--workdir={root / 'run'}", "--quiet",
                       "--config.num_train_steps=10", "--config.batch_size=8",
                       "--config.evals.held_out.batches=1", "--config.checkpoint.every_steps=10",
                       "--config.evals.held_out.every_steps=10", *overrides]) == 0
    assert convert_cli.main(["export", f"--checkpoint={root / 'run'}",
                             f"--out={root / 'hf'}"]) == 0
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
        inputs = tokenizer(record["inputs"], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs)  # every argument from generation_config.json
        generated = out[0, inputs["input_ids"].shape[1]:] if decoder_only else out[0, 1:]
        theirs = evaluator._decode(vocabulary, generated.numpy())
        assert theirs == record["prediction"], (name, record, inputs["input_ids"].tolist())


def test_the_tokenizer_frames_a_prompt_as_the_runs_tasks_did(exported):
    """The template's ids: a decoder's rows begin with its start id (the vocabulary's
    BOS since issue 63, never the pad id); an SFT run's prompt ends with EOS as its task's
    inputs did, a language model's does not; an encoder-decoder's input ends with EOS."""
    name, run, hf_dir, _ = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    vocabulary = tasks.embedded_vocabulary()
    text = "The garden was quiet"
    ids = list(vocabulary.encode(text))
    expected = {"gpt2": [3, *ids], "llama": [3, *ids], "gpt2_sft": [3, *ids, 1],
                "t5": [*ids, 1], "bart": [*ids, 1]}[name]
    assert tokenizer(text).input_ids == expected
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == vocabulary.eos_id
    assert generation["pad_token_id"] == vocabulary.pad_id
    saved = json.loads((run / "config.json").read_text())
    assert generation["max_new_tokens"] == saved["task_feature_lengths"]["targets"]
    if name in ("gpt2", "llama", "gpt2_sft"):
        assert saved["model"]["bos_id"] == generation["bos_token_id"] == vocabulary.bos_id
        assert tokenizer.padding_side == "left"
