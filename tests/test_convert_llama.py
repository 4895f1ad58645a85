"""The modern decoder (rotary, RMSNorm, SwiGLU, grouped-query, sliding window) against
Hugging Face Llama and Mistral, randomly initialised (no download)."""

import functools

import jax
import ml_collections
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import export_import_export, tiny_hf_llama, tiny_hf_mistral

from t5x_like import config_lib, structures
from t5x_like.checkpoints import hf_io
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained
from t5x_like.models import decoding


def right_padded_batch(length=17):
    tokens = np.random.default_rng(0).integers(3, 99, size=(2, length))
    mask = np.arange(length)[None, :] < np.array([length, 11])[:, None]
    return np.where(mask, tokens, 0), mask


def import_and_build(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    return model_config, structures.build_model(ml_collections.ConfigDict(model_config)), params


def assert_logits_match(model, params, hf_model, tokens, mask):
    ours = np.asarray(model.apply({"params": params}, tokens))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(tokens),
                          attention_mask=torch.tensor(mask.astype(np.int64))).logits.numpy()
    error = np.abs(ours[mask] - theirs[mask]).max() / np.abs(theirs[mask]).max()
    assert error < 1e-4, f"max relative logit error {error:.2e}"


def test_llama_with_grouped_query_attention_matches_transformers(tmp_path):
    hf_model = tiny_hf_llama()
    model_config, model, params = import_and_build(tmp_path, hf_model)
    assert (model_config["num_kv_heads"], model_config["position_embedding"]) == (2, "rotary")
    assert params["layers_0"]["attention"]["key"]["kernel"].shape == (32, 2, 8)
    assert_logits_match(model, params, hf_model, *right_padded_batch())


def test_mistral_sliding_window_matches_transformers(tmp_path):
    hf_model = tiny_hf_mistral(sliding_window=5)
    model_config, model, params = import_and_build(tmp_path, hf_model)
    assert model_config["sliding_window"] == 5 and model_config["num_kv_heads"] == 1
    tokens, mask = right_padded_batch(length=20)
    assert_logits_match(model, params, hf_model, tokens, mask)
    # The window matters: without it the logits differ.
    unwindowed = structures.build_model(ml_collections.ConfigDict({**model_config, "sliding_window": 0}))
    assert not np.allclose(model.apply({"params": params}, tokens),
                           unwindowed.apply({"params": params}, tokens), atol=1e-4)


def test_llama_greedy_generation_matches_transformers_generate(tmp_path):
    hf_model = tiny_hf_llama()
    _, model, params = import_and_build(tmp_path, hf_model)
    prompt = np.random.default_rng(3).integers(3, 99, size=(3, 6))
    with torch.no_grad():
        theirs = hf_model.generate(input_ids=torch.tensor(prompt), max_new_tokens=10,
                                   do_sample=False, num_beams=1, pad_token_id=0).numpy()[:, 6:]
    assert (theirs == 2).any()  # one row stops at eos and is padded after it
    ours = jax.jit(functools.partial(decoding.generate, model, max_new_tokens=10, eos_id=2,
                                     pad_id=0))(params, prompt)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_llama_export_import_export_is_the_identity_and_reloads(tmp_path):
    hf_model = tiny_hf_llama()
    exported = export_import_export(tmp_path, hf_model)
    original = hf_io.read_weights(tmp_path / "hf")
    assert sorted(hf_io.read_weights(exported)) == sorted(original)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(exported).eval()
    tokens, _ = right_padded_batch()
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(input_ids=torch.tensor(tokens)).logits.numpy(),
                                   hf_model(input_ids=torch.tensor(tokens)).logits.numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_a_rope_type_that_is_not_built_is_refused_exit_2(tmp_path, capsys):
    hf_model = tiny_hf_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                              "rope_theta": 10000.0})
    hf_model.save_pretrained(tmp_path / "hf")
    code = convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'ours'}"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "'dynamic'" in line and "default, linear, llama3, yarn" in line
    assert not (tmp_path / "ours").exists()


def test_a_modern_decoder_cannot_be_exported_as_gpt2():
    from t5x_like.convert import hf_gpt2

    cfg = dict(config_lib.model_defaults("decoder").to_dict(), norm="rmsnorm")
    with pytest.raises(ValueError, match="no GPT-2 equivalent"):
        hf_gpt2.hf_config_from_model_config(cfg)
