"""XLM-RoBERTa and mBART against Hugging Face transformers, randomly initialised from small
configs (no download): logits agree to 1e-4 relative, and so does greedy decoding."""

import functools

import jax
import ml_collections
import numpy as np
import pytest
import torch
import transformers

from t5x_like import structures
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained
from t5x_like.models import decoding

PAD, EOS = 1, 2
LANG = 97  # a language-id token at the top of the tiny vocabulary, as mBART's are


def relative_error(ours, theirs) -> float:
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def imported(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    model_config, params = load_pretrained(tmp_path / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    return model_config, structures.build_model(ml_collections.ConfigDict(model_config)), params


def tiny_hf_xlm_roberta():
    torch.manual_seed(0)
    config = transformers.XLMRobertaConfig(
        vocab_size=100, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=48, max_position_embeddings=42, type_vocab_size=1, pad_token_id=PAD,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.XLMRobertaForMaskedLM(config).eval()
    with torch.no_grad():  # non-trivial norms and output bias, so a missed tensor shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("lm_head.bias"):
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    return model


def tiny_hf_mbart(scale_embedding=True):
    torch.manual_seed(0)
    config = transformers.MBartConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=3,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=40, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, scale_embedding=scale_embedding, pad_token_id=PAD,
        eos_token_id=EOS, bos_token_id=0, decoder_start_token_id=LANG)
    model = transformers.MBartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    return model


def mbart_batch():
    """Source ``x </s> <lang>`` and labels ``y </s> <lang>``, padded (mBART's layout)."""
    rng = np.random.default_rng(0)
    encoder = rng.integers(3, 90, size=(2, 13))
    encoder[:, -2:] = EOS, LANG
    encoder[1, 7:9] = EOS, LANG
    encoder[1, 9:] = PAD
    targets = rng.integers(3, 90, size=(2, 9))
    targets[:, -2:] = EOS, LANG
    targets[0, 4:6] = EOS, LANG
    targets[0, 6:] = PAD
    return encoder, targets


def test_imported_xlm_roberta_matches_transformers_mlm_logits(tmp_path):
    hf_model = tiny_hf_xlm_roberta()
    model_config, model, params = imported(tmp_path, hf_model)
    assert model_config["family"] == "encoder"
    assert (model_config["position_offset"], model_config["pad_id"]) == (2, PAD)
    assert not model_config["next_sentence_head"]
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 100, size=(2, 17))
    tokens[:, 0] = 0  # <s>
    tokens[1, 11:] = PAD
    mask = tokens != PAD
    ours = np.asarray(model.apply({"params": params}, tokens)["mlm_logits"])
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(tokens),
                          attention_mask=torch.tensor(mask)).logits.numpy()
    assert relative_error(ours[mask], theirs[mask]) < 1e-4


@pytest.mark.parametrize("scale_embedding", [True, False])
def test_imported_mbart_matches_transformers_logits(tmp_path, scale_embedding):
    hf_model = tiny_hf_mbart(scale_embedding)
    model_config, model, params = imported(tmp_path, hf_model)
    assert model_config["family"] == "bart"
    assert model_config["pre_norm"] and model_config["final_layer_norm"]
    assert model_config["scale_embedding"] == scale_embedding
    assert model_config["decoder_start_from_targets"]
    encoder, targets = mbart_batch()
    # Our feature converter shifts right with 0 first; the model puts <lang> there itself.
    decoder_inputs = np.concatenate([np.zeros((2, 1), int), targets[:, :-1]], axis=1)
    ours = np.asarray(model.apply({"params": params}, encoder, decoder_inputs, targets))
    with torch.no_grad():  # labels only: transformers builds the decoder inputs (shift + wrap)
        theirs = hf_model(input_ids=torch.tensor(encoder),
                          attention_mask=torch.tensor(encoder != PAD),
                          labels=torch.tensor(targets)).logits.numpy()
    valid = targets != PAD
    assert relative_error(ours[valid], theirs[valid]) < 1e-4


def test_mbart_greedy_decoding_matches_transformers_generate(tmp_path):
    hf_model = tiny_hf_mbart()
    _, model, params = imported(tmp_path, hf_model)
    encoder, _ = mbart_batch()
    with torch.no_grad():
        theirs = hf_model.generate(
            input_ids=torch.tensor(encoder), attention_mask=torch.tensor(encoder != PAD),
            decoder_start_token_id=LANG, max_new_tokens=8, do_sample=False, num_beams=1,
            forced_eos_token_id=None, forced_bos_token_id=None, no_repeat_ngram_size=0,
            min_length=0).numpy()
    assert (theirs[:, 0] == LANG).all()  # the decoder starts with the language id
    ours = jax.jit(functools.partial(decoding.decode, model, max_decode_length=8))(params, encoder)
    np.testing.assert_array_equal(np.asarray(ours)[:, :theirs.shape[1] - 1], theirs[:, 1:])


def test_mbart_export_import_export_is_the_identity(tmp_path):
    """mBART leaves as ``MBartForConditionalGeneration``: pre-norm blocks and both
    stacks' final norms written back, every original tensor unchanged."""
    from hf_helpers import export_import_export

    from t5x_like.checkpoints import hf_io

    exported = export_import_export(tmp_path, tiny_hf_mbart())
    assert hf_io.read_config(exported)["model_type"] == "mbart"
    original, first = hf_io.read_weights(tmp_path / "hf"), hf_io.read_weights(exported)
    for name, value in original.items():
        np.testing.assert_array_equal(first[name], value, err_msg=name)
