"""BART against Hugging Face transformers, randomly initialised (no download)."""

import functools

import jax
import ml_collections
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import tiny_hf_bart

from t5x_like import structures
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained
from t5x_like.models import decoding

PAD, START = 1, 2


def padded_batch():
    rng = np.random.default_rng(0)
    encoder = rng.integers(3, 100, size=(2, 13))
    encoder[1, 9:] = PAD
    targets = rng.integers(3, 100, size=(2, 7))
    targets[0, 5:] = PAD
    decoder_inputs = np.concatenate([np.full((2, 1), START), targets[:, :-1]], axis=1)
    return encoder, decoder_inputs, targets


def imported(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    return model_config, structures.build_model(ml_collections.ConfigDict(model_config)), params


def test_imported_bart_matches_transformers_logits(tmp_path):
    hf_model = tiny_hf_bart()
    model_config, model, params = imported(tmp_path, hf_model)
    assert model_config["family"] == "bart"
    encoder, decoder_inputs, targets = padded_batch()
    ours = np.asarray(model.apply({"params": params}, encoder, decoder_inputs, targets))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(encoder),
                          attention_mask=torch.tensor(encoder != PAD),
                          decoder_input_ids=torch.tensor(decoder_inputs)).logits.numpy()
    valid = targets != PAD
    error = np.abs(ours[valid] - theirs[valid]).max() / np.abs(theirs[valid]).max()
    assert error < 1e-4, f"max relative logit error {error:.2e}"


def test_bart_greedy_decoding_matches_transformers_generate(tmp_path):
    hf_model = tiny_hf_bart()
    _, model, params = imported(tmp_path, hf_model)
    encoder, _, _ = padded_batch()
    with torch.no_grad():
        theirs = hf_model.generate(
            input_ids=torch.tensor(encoder), attention_mask=torch.tensor(encoder != PAD),
            max_new_tokens=8, do_sample=False, num_beams=1, forced_eos_token_id=None,
            forced_bos_token_id=None, no_repeat_ngram_size=0, min_length=0).numpy()
    # transformers puts the start id first; ours returns only the generated ids.
    ours = jax.jit(functools.partial(decoding.decode, model, max_decode_length=8))(params, encoder)
    np.testing.assert_array_equal(np.asarray(ours)[:, :theirs.shape[1] - 1], theirs[:, 1:])


def test_pre_norm_mbart_layout_is_refused(tmp_path):
    hf_model = tiny_hf_bart()
    hf_model.config.normalize_before = True
    hf_model.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="Only BART's post-norm layout"):
        convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))


def test_bart_export_import_export_is_the_identity_and_loads(tmp_path):
    """BART's exporter (issue 63: a BART pretrained here leaves as
    ``BartForConditionalGeneration``): the original tensors come back unchanged, and the
    export reloaded by transformers gives the original's logits."""
    from hf_helpers import export_import_export

    from t5x_like.checkpoints import hf_io

    hf_model = tiny_hf_bart()
    exported = export_import_export(tmp_path, hf_model)
    original, first = hf_io.read_weights(tmp_path / "hf"), hf_io.read_weights(exported)
    for name, value in original.items():
        np.testing.assert_array_equal(first[name], value, err_msg=name)
    reloaded = transformers.BartForConditionalGeneration.from_pretrained(exported).eval()
    encoder, decoder_inputs, _ = padded_batch()
    with torch.no_grad():
        args = dict(input_ids=torch.tensor(encoder), attention_mask=torch.tensor(encoder != PAD),
                    decoder_input_ids=torch.tensor(decoder_inputs))
        np.testing.assert_allclose(reloaded(**args).logits.numpy(),
                                   hf_model(**args).logits.numpy(), rtol=1e-5, atol=1e-5)
