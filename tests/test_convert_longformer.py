"""Parity with Hugging Face transformers' Longformer (randomly initialised, no download):
local attention plus global tokens through their own projections."""

import ml_collections
import numpy as np
import pytest
import torch
import transformers

from t5x_like import structures
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import hf_longformer, load_pretrained

LENGTH = 24


def tiny_hf_longformer(window=4):
    torch.manual_seed(0)
    config = transformers.LongformerConfig(
        vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=48, max_position_embeddings=LENGTH + 2, type_vocab_size=1,
        pad_token_id=1, attention_window=[window, window], hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    return transformers.LongformerForMaskedLM(config).eval()


def batch():
    """Two rows, the second padded; CLS global in both, two question tokens in the first."""
    rng = np.random.default_rng(0)
    lengths = np.array([[LENGTH], [17]])
    valid = np.arange(LENGTH)[None] < lengths
    tokens = np.where(valid, rng.integers(5, 100, size=(2, LENGTH)), 1)
    global_mask = np.zeros((2, LENGTH), np.int64)
    global_mask[:, 0] = 1
    global_mask[0, [5, 6]] = 1
    return tokens, valid, global_mask


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_imported_longformer_matches_transformers_with_global_tokens(tmp_path, implementation):
    hf_model = tiny_hf_longformer()
    hf_model.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    assert model_config["attention_window"] == 3 and model_config["global_attention"]
    model_config = dict(model_config, attention_impl=implementation)
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    tokens, valid, global_mask = batch()
    ours = np.asarray(model.apply({"params": params}, tokens, input_mask=valid,
                                  global_attention_mask=global_mask.astype(bool))["mlm_logits"])
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(
            valid.astype(np.int64)), global_attention_mask=torch.tensor(global_mask)).logits.numpy()
    error = np.abs(ours[valid] - theirs[valid]).max() / np.abs(theirs[valid]).max()
    assert error < 1e-4


def test_longformer_windows_that_differ_by_layer_are_refused():
    config = tiny_hf_longformer().config.to_dict()
    config["attention_window"] = [4, 8]
    with pytest.raises(ValueError, match="differs by layer"):
        hf_longformer.model_config_from_hf(config)
