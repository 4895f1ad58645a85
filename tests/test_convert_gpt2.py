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
