"""ALBERT (factorized embeddings, one shared layer, sentence-order head) against
Hugging Face transformers, randomly initialised (no download)."""

import ml_collections
import numpy as np
import pytest
import torch
from hf_helpers import tiny_hf_albert
from test_convert_bert import padded_pairs, relative_error

from t5x_like import config_lib, structures
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained


def test_imported_albert_matches_transformers_mlm_and_sentence_order_logits(tmp_path):
    hf_model = tiny_hf_albert()
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    assert model_config["embedding_dim"] == 16 and model_config["share_layers"]
    assert "shared_layer" in params and "layers_0" not in params
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    tokens, token_types, mask = padded_pairs()
    ours = model.apply({"params": params}, tokens, token_types)
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(tokens), token_type_ids=torch.tensor(token_types),
                       attention_mask=torch.tensor(mask))
    assert relative_error(np.asarray(ours["mlm_logits"])[mask], out.prediction_logits.numpy()[mask]) < 1e-4
    assert relative_error(np.asarray(ours["nsp_logits"]), out.sop_logits.numpy()) < 1e-4


def test_albert_with_several_layer_groups_is_refused(tmp_path):
    tiny_hf_albert(num_hidden_groups=3).save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="Only ALBERT with one shared layer"):
        convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))


def test_an_albert_model_cannot_be_exported_as_bert():
    from t5x_like.convert import hf_bert

    cfg = dict(config_lib.model_defaults("encoder").to_dict(), embedding_dim=16, share_layers=True)
    with pytest.raises(ValueError, match="Only BERT-layout encoders export"):
        hf_bert.hf_config_from_model_config(cfg)
