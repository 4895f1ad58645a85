"""Parity with Hugging Face transformers' T5 (randomly initialised, no download)."""

import json

import ml_collections
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import VARIANTS, export_import_export, padded_batch, tiny_hf_t5

from t5x_like import structures
from t5x_like.checkpoints import hf_io
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained


def hf_logits(hf_model, encoder, decoder_inputs, targets):
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(encoder), attention_mask=torch.tensor(encoder > 0),
                       decoder_input_ids=torch.tensor(decoder_inputs),
                       decoder_attention_mask=torch.tensor(
                           np.concatenate([np.ones((2, 1), bool), targets[:, :-1] > 0], axis=1)))
    return out.logits.numpy()


def our_logits(folder, encoder, decoder_inputs, targets):
    model_config, params = load_pretrained(folder)
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    return np.asarray(model.apply({"params": params}, encoder, decoder_inputs, targets))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_imported_t5_matches_transformers_logits(tmp_path, variant):
    hf_model = tiny_hf_t5(variant)
    hf_model.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}", f"--out={tmp_path / 'ours'}"]) == 0

    encoder, decoder_inputs, targets = padded_batch()
    theirs = hf_logits(hf_model, encoder, decoder_inputs, targets)
    ours = our_logits(tmp_path / "ours", encoder, decoder_inputs, targets)
    valid = targets > 0
    error = np.abs(ours[valid] - theirs[valid]).max() / np.abs(theirs[valid]).max()
    assert error < 1e-4, f"max relative logit error {error:.2e}"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_import_export_is_the_identity(tmp_path, variant):
    export_import_export(tmp_path, tiny_hf_t5(variant))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exported_folder_loads_in_transformers_with_equal_logits(tmp_path, variant):
    hf_model = tiny_hf_t5(variant)
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    convert_cli.export_hf(str(tmp_path / "ours"), str(tmp_path / "exported"))
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "exported").eval()
    batch = padded_batch()
    valid = batch[2] > 0
    np.testing.assert_allclose(hf_logits(reloaded, *batch)[valid], hf_logits(hf_model, *batch)[valid],
                               rtol=1e-5, atol=1e-5)
    # generate's ids: an encoder-decoder keeps its pad id (it pads the encoder's input).
    generation = transformers.GenerationConfig.from_pretrained(tmp_path / "exported")
    # (T5 starts its decoder with the pad id.)
    assert (generation.decoder_start_token_id, generation.pad_token_id,
            generation.eos_token_id) == (hf_model.config.pad_token_id,
                                         hf_model.config.pad_token_id, hf_model.config.eos_token_id)
    assert generation.pad_token_id is not None


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="pickle files can execute code"):
        hf_io.read_weights(tmp_path)


def test_import_refuses_to_overwrite(tmp_path, capsys):
    hf_model = tiny_hf_t5("v1_1")
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}", f"--out={tmp_path / 'ours'}"]) == 2
    assert "choose a new --out folder" in capsys.readouterr().err


def test_folder_without_config_json_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        hf_io.read_config(tmp_path)
