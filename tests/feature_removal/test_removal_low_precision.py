"""Removals of quantized training and int8 weights: each check reads the compiled program
(the operand types of its matmuls, the types of its parameters) and, for the commands,
the int8 files that very command wrote and read back."""

import io
import json
import re
import shutil

import lm_eval.api.instance
import numpy as np
import pytest
from removals import Removal, called_from, compiled_programs, proving_tests
from test_quantization import decoder, random_batch

from t5x_like import eval as eval_cli
from t5x_like import infer, train
from t5x_like.checkpoints import int8_weights
from t5x_like.evaluation import harness_model
from t5x_like.models import quantization
from t5x_like.planner import hlo_matmuls

D_MODEL, D_FF = 64, 256


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """A float decoder checkpoint (two LM steps); each check copies it, so the int8 files
    it finds are the ones its own command wrote."""
    workdir = tmp_path_factory.mktemp("lm")
    train.run(decoder(**{"task_feature_lengths": {"targets": 64}, "model.d_model": D_MODEL,
                         "model.d_ff": D_FF, "model.num_heads": 4}), str(workdir), quiet=True)
    return workdir


def _fresh_copy(request, name):
    source = request.getfixturevalue("lm_checkpoint")
    target = request.getfixturevalue("tmp_path") / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(int8_weights.FOLDER))
    return target


# -- quantized training ---------------------------------------------------------------------

def _train_step_text(kind: str) -> str:
    """The compiled train step of a small one-layer decoder quantized to ``kind``, on one
    device (its attention and MLP matmuls are those of every layer)."""
    import jax

    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    config = decoder(**{"quantization.kind": kind, "model.vocab_size": 512, "model.num_layers": 1})
    trainer = trainer_lib.build_trainer(config, partitioning.make_mesh(
        {"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]))
    return trainer.lower_train_step(trainer.abstract_state,
                                    random_batch(trainer, config)).compile().as_text()


def int8_training_runs_int8_matmuls(request):
    """``quantization.kind=int8``: the compiled train step multiplies int8 operands (the
    attention and MLP matmuls, forward and backward)."""
    flops = hlo_matmuls.matmul_flops_by_dtype(_train_step_text("int8"))
    assert flops.get("s8", 0) > 0, flops


def fp8_training_rounds_matmul_operands_to_fp8(request):
    """``quantization.kind=fp8``: the compiled train step rounds the matmuls' operands to
    e4m3 (CPU multiplies them in float32 after; an H100 or a v7 in fp8)."""
    text = _train_step_text("fp8")
    assert re.search(r"f8e4m3fn\[[0-9,]+\]\S* convert\(", text), "no operand rounded to e4m3"


def _float_matmuls(monkeypatch):
    monkeypatch.setattr(quantization, "with_quantized_training",
                        lambda model, settings, lengths=None: model)


# -- int8 weights in eval, infer and the harness ---------------------------------------------

def _int8_kernel_parameters(programs: list[str]) -> list[str]:
    """The s8 parameters of the programs that decode or score (the MLP's ``[d, d_ff]`` and
    ``[d_ff, d]`` kernels among them when the weights are read in int8)."""
    found = []
    for text in programs:
        layout = text.split("\n", 1)[0]
        found += [f"s8[{dims}]" for dims in
                  re.findall(r"s8\[([0-9,]+)\]", layout.split("->")[0])]
    return found


def _assert_reads_int8_kernels(programs):
    kernels = _int8_kernel_parameters(programs)
    assert f"s8[{D_MODEL},{D_FF}]" in kernels and f"s8[{D_FF},{D_MODEL}]" in kernels, kernels


def _zero_saved_int8_values(checkpoint) -> None:
    """The command's saved int8 weights, their values zeroed: a command that reads them
    back computes something else than it did."""
    files = list((checkpoint / "checkpoints" / int8_weights.FOLDER).iterdir())
    assert files, "the command saved no int8 weights beside the checkpoint"
    for file in files:
        with np.load(file) as saved:
            values = {k: (np.zeros_like(v) if k.endswith("qvalue") else v)
                      for k, v in saved.items()}
        buffer = io.BytesIO()
        np.savez(buffer, **values)
        file.write_bytes(buffer.getvalue())


def infer_reads_int8_weights(request):
    """``infer --config.quantization.weights=int8``: its decode program takes the kernels
    as s8 parameters; it saves them beside the checkpoint, and the next ``infer`` reads
    that file back (its values zeroed, the predictions change)."""
    checkpoint = _fresh_copy(request, "infer_int8")
    tmp = request.getfixturevalue("tmp_path")
    inputs = tmp / "in.jsonl"
    inputs.write_text("".join(json.dumps({"inputs": text}) + "\n" for text in
                              ("It is a truth universally", "The evening was", "She said")))

    def run(out):
        with compiled_programs() as programs:
            assert infer.main(["--checkpoint", str(checkpoint), "--input_file", str(inputs),
                               "--output_file", str(out), "--max_decode_length", "8",
                               "--inputs_length", "16", "--batch_size", "8",
                               "--config.quantization.weights=int8"]) == 0
        return programs, [json.loads(line)["prediction"] for line in out.open()]
    programs, first = run(tmp / "first.jsonl")
    _assert_reads_int8_kernels(programs)
    _zero_saved_int8_values(checkpoint)
    _, again = run(tmp / "again.jsonl")
    assert again != first, "infer did not read back the int8 weights it saved"


def eval_reads_int8_weights(request):
    """``eval --config.quantization.weights=int8`` (scoring): its scoring program takes
    the kernels as s8 parameters; it saves them, and the next ``eval`` reads them back."""
    checkpoint = _fresh_copy(request, "eval_int8")
    tmp = request.getfixturevalue("tmp_path")

    def run(out):
        with compiled_programs() as programs:
            assert eval_cli.main([f"--checkpoint={checkpoint}", "--task=embedded_austen_cloze",
                                  "--max_examples=8", "--batch_size=8", "--inputs_length=48", "--targets_length=16",
                                  f"--output_dir={out}", "--quiet",
                                  "--config.quantization.weights=int8"]) == 0
        return programs, _scores(out)
    programs, first = run(tmp / "first")
    _assert_reads_int8_kernels(programs)
    _zero_saved_int8_values(checkpoint)
    _, again = run(tmp / "again")
    assert again != first, "eval did not read back the int8 weights it saved"


def _scores(out) -> list:
    """Every number eval wrote (its metrics and per-example scores)."""
    numbers = []
    for file in sorted(out.rglob("*.json*")):
        text = file.read_text()
        numbers += [float(x) for x in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)]
    assert numbers, f"eval wrote nothing under {out}"
    return numbers


def harness_reads_int8_weights(request):
    """lm-eval's ``t5x_like`` model with ``weights=int8``: its scoring program takes the
    kernels as s8 parameters, and a second load reads the saved file back."""
    checkpoint = _fresh_copy(request, "harness_int8")
    requests = [lm_eval.api.instance.Instance("loglikelihood", {}, (context, " " + answer), 0)
                for context, answer in (("It is a truth universally", "acknowledged"),
                                        ("The evening was", "fine"))]

    def run():
        with compiled_programs() as programs:
            model = harness_model.T5xLikeLM(checkpoint=str(checkpoint), weights="int8",
                                            batch_size=8)
            scores = [score for score, _ in model.loglikelihood(requests, disable_tqdm=True)]
        return programs, scores
    programs, first = run()
    _assert_reads_int8_kernels(programs)
    _zero_saved_int8_values(checkpoint)
    _, again = run()
    assert again != first, "the harness model did not read back the int8 weights it saved"


def _ignored_in(command_file: str):
    """``quantization.weights=int8`` ignored by one command (its float weights built)."""
    def remove(monkeypatch):
        original = int8_weights.weights_for

        def weights_for(config, structure, trainer):
            if called_from(command_file):
                return int8_weights.FloatWeights(structure, trainer)
            return original(config, structure, trainer)
        monkeypatch.setattr(int8_weights, "weights_for", weights_for)
    return remove


REMOVALS = [
    Removal("int8 training", "`with_quantized_training` returns the float model",
            "the compiled train step has s8 x s8 matmuls", _float_matmuls,
            int8_training_runs_int8_matmuls),
    Removal("fp8 training", "`with_quantized_training` returns the float model",
            "the compiled train step rounds matmul operands to e4m3", _float_matmuls,
            fp8_training_rounds_matmul_operands_to_fp8),
    Removal("int8 weights in infer", "`infer` builds float weights whatever the flag",
            "its decode program takes s8 kernels; its saved file is read back",
            _ignored_in("t5x_like/infer.py"), infer_reads_int8_weights),
    Removal("int8 weights in eval", "`eval` builds float weights whatever the flag",
            "its scoring program takes s8 kernels; its saved file is read back",
            _ignored_in("t5x_like/eval.py"), eval_reads_int8_weights),
    Removal("int8 weights in the harness", "the lm-eval model builds float weights",
            "its scoring program takes s8 kernels; its saved file is read back",
            _ignored_in("t5x_like/evaluation/loaded_lm.py"), harness_reads_int8_weights),
]

globals().update(proving_tests(REMOVALS))
