"""Every refusal of ``python -m t5x_like.convert`` is one line on stderr and exit status 2
(a ``UserError`` that names what is supported), never a traceback.

The folders here are config.json files (and at most an empty safetensors file) written by
hand: each refusal comes before any weight is read, so neither torch nor a download is
needed.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from t5x_like.convert import __main__ as convert_cli

REPO = pathlib.Path(__file__).resolve().parents[1]

TINY_GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 100,
             "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 40,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 100,
              "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False}


def hf_folder(root: pathlib.Path, config: dict, name: str = "hf") -> pathlib.Path:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def refusal(capsys, *argv) -> str:
    """The one stderr line of a refused convert command (exit status 2)."""
    code = convert_cli.main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convert: "), err
    assert "Traceback" not in err
    return lines[0]


def test_an_unknown_model_type_is_refused_naming_the_supported_ones(tmp_path, capsys):
    hf = hf_folder(tmp_path, {"model_type": "whisper", "d_model": 32})
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert "model_type 'whisper'" in line and str(hf) in line
    for supported in ("gpt2", "llama", "t5", "bert", "electra", "xlm-roberta"):
        assert supported in line
    assert not (tmp_path / "ours").exists()


def test_a_config_without_model_type_is_refused(tmp_path, capsys):
    hf = hf_folder(tmp_path, {"d_model": 32})
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert "no model_type entry" in line and "supported model_types" in line


def test_gpt2_with_scale_attn_by_inverse_layer_idx_is_refused(tmp_path, capsys):
    hf = hf_folder(tmp_path, dict(TINY_GPT2, scale_attn_by_inverse_layer_idx=True))
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert "GPT-2 without scale_attn_by_inverse_layer_idx" in line
    assert not (tmp_path / "ours").exists()


def test_llama_with_attention_bias_is_refused(tmp_path, capsys):
    hf = hf_folder(tmp_path, dict(TINY_LLAMA, attention_bias=True))
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert "attention_bias" in line and "Llama/Mistral/Qwen3 without biases" in line


def test_a_missing_hf_dir_is_refused(tmp_path, capsys):
    line = refusal(capsys, "import", f"--hf_dir={tmp_path / 'nowhere'}",
                   f"--out={tmp_path / 'ours'}")
    assert "no such folder" in line and "--hf_dir" in line


def test_an_existing_out_is_refused_before_the_weights_are_read(tmp_path, capsys):
    hf = hf_folder(tmp_path, TINY_GPT2)  # no weights: the refusal must come first
    (tmp_path / "ours" / "params").mkdir(parents=True)
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert "holds a checkpoint already" in line and "choose a new --out folder" in line


def test_a_checkpoint_without_a_tensor_is_refused_naming_it(tmp_path, capsys):
    import safetensors.numpy as st_numpy
    hf = hf_folder(tmp_path, TINY_GPT2)
    st_numpy.save_file({}, str(hf / "model.safetensors"), metadata={"format": "pt"})
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert "has no tensor" in line and str(hf) in line
    assert not (tmp_path / "ours").exists()


def test_export_of_a_family_without_a_hugging_face_exporter_is_refused(tmp_path, capsys):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "model_config.json").write_text(json.dumps({"family": "bilm"}))
    line = refusal(capsys, "export", f"--checkpoint={ours}", f"--out={tmp_path / 'hf'}")
    assert "family 'bilm'" in line
    for exportable in ("decoder", "encoder", "encoder_decoder", "electra", "bart"):
        assert exportable in line
    assert not (tmp_path / "hf").exists()


def test_the_command_line_exits_2_with_one_line_and_no_traceback(tmp_path):
    hf = hf_folder(tmp_path, dict(TINY_GPT2, scale_attn_by_inverse_layer_idx=True))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]), JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.convert", "import", f"--hf_dir={hf}",
         f"--out={tmp_path / 'ours'}"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convert: "), result.stderr
    assert "scale_attn_by_inverse_layer_idx" in lines[0]
