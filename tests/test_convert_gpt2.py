"""Parity with Hugging Face transformers' GPT-2 (randomly initialised, no download)."""

import ml_collections
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import export_import_export, tiny_hf_gpt2

from t5x_like import structures
from t5x_like.checkpoints import hf_io
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained


def right_padded_batch():
    tokens = np.random.default_rng(0).integers(0, 99, size=(2, 17))
    lengths = np.array([17, 11])
    mask = np.arange(17)[None, :] < lengths[:, None]
    return np.where(mask, tokens, 0), mask


def hf_logits(model, tokens, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits.numpy()


def test_imported_gpt2_matches_transformers_logits(tmp_path):
    hf_model = tiny_hf_gpt2()
    hf_model.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}", f"--out={tmp_path / 'ours'}"]) == 0
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    assert model_config["family"] == "decoder"
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    tokens, mask = right_padded_batch()
    ours = np.asarray(model.apply({"params": params}, tokens))
    theirs = hf_logits(hf_model, tokens, mask)
    error = np.abs(ours[mask] - theirs[mask]).max() / np.abs(theirs[mask]).max()
    assert error < 1e-4, f"max relative logit error {error:.2e}"


def test_gpt2_export_import_export_is_the_identity_and_loads(tmp_path):
    hf_model = tiny_hf_gpt2()
    exported = export_import_export(tmp_path, hf_model)
    first = hf_io.read_weights(exported)
    original = hf_io.read_weights(tmp_path / "hf")
    for name, value in original.items():
        if name in first:
            np.testing.assert_array_equal(first[name], value, err_msg=name)

    reloaded = transformers.GPT2LMHeadModel.from_pretrained(exported).eval()
    tokens, mask = right_padded_batch()
    np.testing.assert_allclose(hf_logits(reloaded, tokens, mask)[mask],
                               hf_logits(hf_model, tokens, mask)[mask], rtol=1e-5, atol=1e-5)


def test_wrong_architecture_in_config_is_a_clear_error(tmp_path):
    hf_model = tiny_hf_gpt2()
    hf_model.save_pretrained(tmp_path / "hf")
    import json
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["n_layer"] = 2  # the weights have 3 layers
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="have no place in the model"):
        convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))


def test_greedy_generation_matches_transformers_generate(tmp_path):
    import functools

    import jax

    from t5x_like.models import decoding

    hf_model = tiny_hf_gpt2()
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    prompt = np.random.default_rng(3).integers(0, 99, size=(3, 6))
    with torch.no_grad():
        theirs = hf_model.generate(input_ids=torch.tensor(prompt), max_new_tokens=10,
                                   do_sample=False, num_beams=1, pad_token_id=99).numpy()[:, 6:]
    ours = jax.jit(functools.partial(decoding.generate, model, max_new_tokens=10))(params, prompt)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_a_runs_export_carries_a_model_card_of_how_it_was_trained(tmp_path):
    """``README.md`` in Hugging Face's model card format beside the weights: the
    architecture and its parameters (those transformers loads), the task, the steps and
    positions read, the last train and held-out losses of metrics.jsonl, every launch's
    command (a run and its resume), and each embedded data file's license as
    data/README.md states it."""
    import json
    import pathlib
    import re

    from safetensors.numpy import load_file

    from t5x_like import train
    repo = pathlib.Path(__file__).resolve().parents[1]
    workdir, out = tmp_path / "run", tmp_path / "hf"
    launch = [f"--config={repo / 'configs' / 'pretrain' / 'gpt2_tiny.py'}",
              f"--workdir={workdir}", "--config.batch_size=8", "--quiet"]
    assert train.main([*launch, "--config.num_train_steps=2"]) == 0
    assert train.main([*launch, "--config.num_train_steps=3"]) == 0  # resumed from step 2
    assert convert_cli.main(["export", f"--checkpoint={workdir}", f"--out={out}"]) == 0
    card = (out / "README.md").read_text()
    front, body = card.split("\n---\n", 1)
    assert front.splitlines()[:2] == ["---", "library_name: transformers"]
    assert "pipeline_tag: text-generation" in front
    exported = sum(v.size for v in load_file(out / "model.safetensors").values())
    assert f"`GPT2LMHeadModel` (`model_type` gpt2), {exported:,} parameters." in body
    assert "- Task: `embedded_en_lm`: Causal LM" in body
    assert "- 3 steps of 8 rows x 160 positions: 3,840 positions read" in body
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert f"- Train loss {records[-1]['loss']:.4f} (the mean logged at step 3)." in body
    assert f"loss {records[-1]['eval_loss']:.4f}" in body.split("- Held-out (step 3): ")[1]
    launches = re.findall(r"^(.*t5x_like\.train .*)  # from step (\d+), ", body, flags=re.M)
    assert [(command.endswith(f"--config.num_train_steps={steps}"), start)
            for (command, start), steps in zip(launches, (2, 3), strict=True)] == [
        (True, "0"), (True, "2")]
    licenses = (repo / "data" / "README.md").read_text()
    for name in ("austen", "shakespeare", "kjv_bible", "web_bible"):
        line = next(li for li in body.splitlines() if li.startswith(f"- `en/{name}.txt.gz`: "))
        stated = line.split(": ", 1)[1]
        assert "public domain" in stated and stated in licenses, line
