"""Parity with Hugging Face transformers' BERT (randomly initialised, no download)."""

import ml_collections
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import export_import_export, tiny_hf_bert

from t5x_like import structures
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained


def padded_pairs():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 100, size=(3, 16))
    mask = np.arange(16)[None, :] < np.array([[16], [10], [7]])
    token_types = (np.arange(16)[None, :] >= np.array([[8], [5], [3]])).astype(int) * mask
    return np.where(mask, tokens, 0), token_types, mask


def hf_outputs(model, tokens, token_types, mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens), token_type_ids=torch.tensor(token_types),
                    attention_mask=torch.tensor(mask))
    return out.prediction_logits.numpy(), out.seq_relationship_logits.numpy()


def relative_error(ours, theirs):
    return np.abs(ours - theirs).max() / np.abs(theirs).max()


def test_imported_bert_matches_transformers_mlm_and_nsp_logits(tmp_path):
    hf_model = tiny_hf_bert()
    hf_model.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}", f"--out={tmp_path / 'ours'}"]) == 0
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    tokens, token_types, mask = padded_pairs()
    ours = model.apply({"params": params}, tokens, token_types)
    mlm, nsp = hf_outputs(hf_model, tokens, token_types, mask)
    assert relative_error(np.asarray(ours["mlm_logits"])[mask], mlm[mask]) < 1e-4
    assert relative_error(np.asarray(ours["nsp_logits"]), nsp) < 1e-4


def test_bert_export_import_export_is_the_identity_and_loads(tmp_path):
    hf_model = tiny_hf_bert()
    exported = export_import_export(tmp_path, hf_model)
    reloaded = transformers.BertForPreTraining.from_pretrained(exported).eval()
    batch = padded_pairs()
    for a, b in zip(hf_outputs(reloaded, *batch), hf_outputs(hf_model, *batch), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_imported_roberta_matches_transformers_mlm_logits(tmp_path):
    from hf_helpers import tiny_hf_roberta

    hf_model = tiny_hf_roberta()
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    assert (model_config["position_offset"], model_config["pad_id"]) == (2, 1)
    model = structures.build_model(ml_collections.ConfigDict(model_config))
    tokens, _, mask = padded_pairs()
    tokens = np.where(mask, tokens, 1)  # RoBERTa pads with id 1
    ours = model.apply({"params": params}, tokens)
    assert "nsp_logits" not in ours
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(tokens),
                          attention_mask=torch.tensor(mask)).logits.numpy()
    assert relative_error(np.asarray(ours["mlm_logits"])[mask], theirs[mask]) < 1e-4
    # Exporting a RoBERTa-layout model as BERT would be wrong, so it is refused.
    with pytest.raises(ValueError, match="Only BERT-layout encoders export"):
        convert_cli.export_hf(str(tmp_path / "ours"), str(tmp_path / "exported"))


def test_a_bert_without_the_next_sentence_head_exports_as_masked_lm_and_back(tmp_path):
    """``BertForMaskedLM`` (no pooler, no NSP head: what an MLM run here exports as)
    imports without the next-sentence head, exports back to the same tensors, and the
    export reloads with the original's logits."""
    from t5x_like.checkpoints import hf_io

    config = tiny_hf_bert().config
    torch.manual_seed(1)
    hf_model = transformers.BertForMaskedLM(config).eval()
    exported = export_import_export(tmp_path, hf_model)
    assert hf_io.read_config(exported)["architectures"] == ["BertForMaskedLM"]
    original, first = hf_io.read_weights(tmp_path / "hf"), hf_io.read_weights(exported)
    for name, value in original.items():
        if name in first:
            np.testing.assert_array_equal(first[name], value, err_msg=name)
    reloaded = transformers.BertForMaskedLM.from_pretrained(exported).eval()
    tokens = torch.tensor([[2, 15, 27, 33, 3]])
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(tokens).logits.numpy(), hf_model(tokens).logits.numpy(),
                                   rtol=1e-5, atol=1e-5)
