"""Mixtures of experts against transformers, randomly initialised (no download): Mixtral,
Qwen2-MoE (shared expert under its gate, q/k/v biases, dense layers between sparse ones)
and Switch Transformers (T5 with top-1 experts every other layer). Each imports at 1e-4
logit parity, decodes greedily as ``generate`` does, and exports back to the tensors
transformers saved; unsupported mixtures are refused with exit 2."""

import functools
import json
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import bpe_tokenizer_on_corpus, padded_batch
from test_convert_llama import import_and_build, right_padded_batch
from test_convert_open_decoders import perturbed
from test_convert_refusals import hf_folder, refusal

from t5x_like import structures
from t5x_like.checkpoints import hf_io
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import hf_moe, hf_switch, load_pretrained
from t5x_like.data import hf_tokenizers
from t5x_like.errors import UserError
from t5x_like.models import decoding

DECODER = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1,
               eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)


def mixtral(**overrides):
    torch.manual_seed(0)
    settings = dict(DECODER, intermediate_size=24, num_hidden_layers=2, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=5, router_jitter_noise=0.1)
    settings.update(overrides)
    return perturbed(transformers.MixtralForCausalLM(transformers.MixtralConfig(**settings)))


def qwen2_moe(**overrides):
    torch.manual_seed(0)
    settings = dict(DECODER, intermediate_size=48, moe_intermediate_size=16,
                    shared_expert_intermediate_size=40, num_hidden_layers=4, num_experts=4,
                    num_experts_per_tok=2, decoder_sparse_step=2, norm_topk_prob=False)
    settings.update(overrides)
    return perturbed(transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**settings)))


def switch(**overrides):
    torch.manual_seed(0)
    settings = dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                    num_decoder_layers=2, num_heads=4, num_experts=4, num_sparse_encoder_layers=1,
                    num_sparse_decoder_layers=1, relative_attention_num_buckets=8,
                    relative_attention_max_distance=20, dropout_rate=0.0)
    settings.update(overrides)
    config = transformers.SwitchTransformersConfig(**settings)
    return perturbed(transformers.SwitchTransformersForConditionalGeneration(config))


DECODERS = {"mixtral": mixtral, "qwen2_moe": qwen2_moe,
            # Layer 0 dense by mlp_only_layers (moe_every=2), no q/k/v biases.
            "qwen2_moe_normalised_mlp_only": lambda: qwen2_moe(
                norm_topk_prob=True, decoder_sparse_step=1, num_hidden_layers=2,
                mlp_only_layers=[0], qkv_bias=False)}


def our_logits(model, params, *inputs):
    """Jitted: one compilation is seconds faster than running the layers op by op."""
    return np.asarray(jax.jit(model.apply)({"params": params}, *inputs))


def max_errors(ours, theirs):
    """(max absolute, max relative to the largest logit) difference."""
    absolute = np.abs(ours - theirs).max()
    return absolute, absolute / np.abs(theirs).max()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """``imported(case)``: ``(root, hf_model, model_config, model, params)`` of a decoder
    case, saved and imported once per module."""
    cache = {}

    def get(case):
        if case not in cache:
            root = tmp_path_factory.mktemp(case)
            hf_model = DECODERS[case]()
            cache[case] = (root, hf_model, *import_and_build(root, hf_model))
        return cache[case]
    return get


@pytest.mark.parametrize("case", sorted(DECODERS))
def test_decoder_logits_match_transformers(imported, case):
    _, hf_model, model_config, model, params = imported(case)
    assert model_config["moe_dispatch"] == "dropless"
    tokens, mask = right_padded_batch(length=20)
    ours = our_logits(model, params, tokens)
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(tokens),
                          attention_mask=torch.tensor(mask.astype(np.int64))).logits.numpy()
    absolute, relative = max_errors(ours[mask], theirs[mask])
    assert relative < 1e-4, f"max logit error {absolute:.2e} ({relative:.2e} relative)"
    if case == "qwen2_moe":  # the routing weights matter: the other softmax moves the logits
        flipped = structures.build_model(ml_collections.ConfigDict(
            {**model_config, "router_softmax": "after_top_k"}))
        assert not np.allclose(ours, our_logits(flipped, params, tokens), atol=1e-3)


def test_the_imported_expert_keys_are_each_architectures(imported):
    mixtral_config = imported("mixtral")[2]
    assert (mixtral_config["num_experts"], mixtral_config["num_experts_per_token"],
            mixtral_config["moe_every"], mixtral_config["expert_d_ff"]) == (4, 2, 1, 24)
    assert mixtral_config["router_softmax"] == "after_top_k"
    assert mixtral_config["sliding_window"] == 5 and mixtral_config["router_jitter"] == 0.1
    assert not mixtral_config.get("shared_expert_d_ff") and not mixtral_config["qkv_bias"]
    _, _, qwen_config, _, params = imported("qwen2_moe")
    assert (qwen_config["moe_every"], qwen_config["d_ff"], qwen_config["expert_d_ff"],
            qwen_config["shared_expert_d_ff"]) == (2, 48, 16, 40)
    assert qwen_config["shared_expert_gate"] and qwen_config["qkv_bias"]
    assert qwen_config["router_softmax"] == "before_top_k"
    assert "wi_0" in params["layers_0"]["mlp"]  # dense, then sparse
    assert params["layers_1"]["mlp"]["experts"]["wi_0"].shape == (4, 32, 16)
    assert params["layers_1"]["mlp"]["shared_expert_gate"]["kernel"].shape == (32, 1)


def test_fused_expert_tensors_import_as_the_per_expert_ones(imported, tmp_path):
    """transformers 5 holds experts fused (``mlp.experts.gate_up_proj``); a folder saved
    from that state dict imports to the same parameters as save_pretrained's."""
    from safetensors.torch import save_file

    root, hf_model, _, _, saved = imported("mixtral")
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file({k: v.contiguous() for k, v in hf_model.state_dict().items()},
              str(fused / "model.safetensors"), metadata={"format": "pt"})
    (fused / "config.json").write_text((root / "hf" / "config.json").read_text())
    assert any("gate_up_proj" in name for name in hf_io.read_weights(fused))
    convert_cli.import_hf(str(fused), str(tmp_path / "ours_fused"))
    _, params = load_pretrained(tmp_path / "ours_fused")
    for (path, ours), theirs in zip(jax.tree_util.tree_leaves_with_path(params),
                                    jax.tree_util.tree_leaves(saved), strict=True):
        np.testing.assert_array_equal(ours, theirs, err_msg=jax.tree_util.keystr(path))


def test_greedy_decoding_with_the_tokenizer_matches_generate(tmp_path):
    """Mixtral saved with a byte-level BPE (trained offline): the imported tokenizer encodes
    the prompts as transformers' does, and greedy decoding gives the same text."""
    tokenizer = bpe_tokenizer_on_corpus(vocab_size=300, lines=600)
    hf_model = mixtral(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    tokenizer.save_pretrained(tmp_path / "hf")
    _, model, params = import_and_build(tmp_path, hf_model)
    vocabulary = hf_tokenizers.load(tmp_path / "ours" / "tokenizer")
    prompts = ["Emma smiled at", "It was a truth"]
    encoded = [vocabulary.encode(text) for text in prompts]
    assert encoded == [tokenizer.encode(text, add_special_tokens=False) for text in prompts]
    width = min(len(ids) for ids in encoded)
    prompt = np.array([ids[:width] for ids in encoded])
    with torch.no_grad():
        theirs = hf_model.generate(input_ids=torch.tensor(prompt),
                                   attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                                   max_new_tokens=10, do_sample=False, num_beams=1,
                                   pad_token_id=0, eos_token_id=None).numpy()[:, width:]
    ours = np.asarray(jax.jit(functools.partial(
        decoding.generate, model, max_new_tokens=10, eos_id=-1, pad_id=0))(params, prompt))
    np.testing.assert_array_equal(ours, theirs)
    assert [vocabulary.decode(row.tolist()) for row in ours] == \
        tokenizer.batch_decode(theirs, skip_special_tokens=True)


def test_qwen2_moe_greedy_decoding_matches_generate(imported):
    _, hf_model, _, model, params = imported("qwen2_moe")
    prompt = np.random.default_rng(3).integers(3, 99, size=(2, 6))
    with torch.no_grad():
        theirs = hf_model.generate(input_ids=torch.tensor(prompt),
                                   attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                                   max_new_tokens=10, do_sample=False, num_beams=1,
                                   pad_token_id=0, eos_token_id=None).numpy()[:, 6:]
    ours = jax.jit(functools.partial(decoding.generate, model, max_new_tokens=10, eos_id=-1,
                                     pad_id=0))(params, prompt)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


@pytest.mark.parametrize("case", sorted(DECODERS))
def test_decoder_export_gives_back_the_tensors_and_reloads(imported, tmp_path, case):
    root, hf_model, _, _, _ = imported(case)
    convert_cli.export_hf(str(root / "ours"), str(tmp_path / "back"))
    original, exported = hf_io.read_weights(root / "hf"), hf_io.read_weights(tmp_path / "back")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_allclose(exported[name], tensor, atol=1e-6, err_msg=name)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(reloaded) is type(hf_model)
    for key in ("num_experts_per_tok", "sliding_window", "norm_topk_prob", "qkv_bias",
                "moe_intermediate_size", "shared_expert_intermediate_size"):
        assert getattr(reloaded.config, key, None) == getattr(hf_model.config, key, None), key
    assert [type(layer.mlp) for layer in reloaded.model.layers] == \
        [type(layer.mlp) for layer in hf_model.model.layers]  # the same layers sparse
    tokens, _ = right_padded_batch(length=20)
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(input_ids=torch.tensor(tokens)).logits.numpy(),
                                   hf_model(input_ids=torch.tensor(tokens)).logits.numpy(),
                                   rtol=1e-5, atol=1e-5)


def switch_logits(hf_model, encoder, decoder_inputs, targets):
    decoder_mask = np.concatenate([np.ones((2, 1), bool), targets[:, :-1] > 0], axis=1)
    with torch.no_grad():
        return hf_model(input_ids=torch.tensor(encoder), attention_mask=torch.tensor(encoder > 0),
                        decoder_input_ids=torch.tensor(decoder_inputs),
                        decoder_attention_mask=torch.tensor(decoder_mask)).logits.numpy()


@pytest.fixture(scope="module")
def switch_import(tmp_path_factory):
    root = tmp_path_factory.mktemp("switch")
    hf_model = switch()
    hf_model.save_pretrained(root / "hf")
    assert convert_cli.main(["import", f"--hf_dir={root / 'hf'}", f"--out={root / 'ours'}"]) == 0
    model_config, params = load_pretrained(root / "ours")
    model_config = convert_cli.flat_model(model_config)  # the converters' flat view
    return root, hf_model, model_config, structures.build_model(
        ml_collections.ConfigDict(model_config)), params


def test_switch_logits_match_transformers(switch_import):
    _, hf_model, model_config, model, params = switch_import
    assert (model_config["num_experts"], model_config["num_experts_per_token"],
            model_config["moe_every"], model_config["mlp_activations"]) == (4, 1, 2, ("relu",))
    assert model_config["logits_via_embedding"] and model_config["router_jitter"] == 0.01
    assert "router" in params["encoder"]["layers_1"]["mlp"]
    assert "wi" in params["decoder"]["layers_0"]["mlp"]
    encoder, decoder_inputs, targets = padded_batch()
    theirs = switch_logits(hf_model, encoder, decoder_inputs, targets)
    ours = our_logits(model, params, encoder, decoder_inputs, targets)
    valid = targets > 0
    absolute, relative = max_errors(ours[valid], theirs[valid])
    assert relative < 1e-4, f"max logit error {absolute:.2e} ({relative:.2e} relative)"


def test_switch_greedy_decoding_matches_generate(switch_import):
    _, hf_model, _, model, params = switch_import
    encoder, _, _ = padded_batch()
    with torch.no_grad():
        theirs = hf_model.generate(
            input_ids=torch.tensor(encoder), attention_mask=torch.tensor(encoder > 0),
            max_new_tokens=8, do_sample=False, num_beams=1, decoder_start_token_id=0,
            eos_token_id=1, pad_token_id=0).numpy()[:, 1:]
    theirs = np.pad(theirs, ((0, 0), (0, 8 - theirs.shape[1])))
    ours = jax.jit(functools.partial(decoding.decode, model, max_decode_length=8))(
        params, jnp.asarray(encoder))
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_switch_export_gives_back_the_tensors_and_reloads(switch_import, tmp_path):
    root, hf_model, _, _, _ = switch_import
    convert_cli.export_hf(str(root / "ours"), str(tmp_path / "back"))
    original, exported = hf_io.read_weights(root / "hf"), hf_io.read_weights(tmp_path / "back")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_allclose(exported[name], tensor, atol=1e-6, err_msg=name)
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["expert_capacity"] == hf_switch.DROPLESS_CAPACITY
    reloaded = transformers.SwitchTransformersForConditionalGeneration.from_pretrained(
        tmp_path / "back").eval()
    assert (reloaded.config.encoder_sparse_step, reloaded.config.decoder_sparse_step) == (2, 2)
    batch = padded_batch()
    valid = batch[2] > 0
    np.testing.assert_allclose(switch_logits(reloaded, *batch)[valid],
                               switch_logits(hf_model, *batch)[valid], rtol=1e-5, atol=1e-5)


def test_an_unsupported_mixture_of_experts_is_refused_exit_2(tmp_path, capsys):
    hf = hf_folder(tmp_path, {"model_type": "qwen3_moe", "num_experts": 8, "hidden_size": 32})
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert "'qwen3_moe' is a mixture of experts" in line
    assert "mixtral, qwen2_moe, switch_transformers" in line
    assert not (tmp_path / "ours").exists()


@pytest.mark.parametrize("config,message", [
    (dict(model_type="qwen2_moe", mlp_only_layers=[0, 3]), r"sparse layers \[1, 2\]"),
    (dict(model_type="qwen2_moe", shared_expert_intermediate_size=0), "shared expert"),
    (dict(model_type="switch_transformers", num_layers=4, num_decoder_layers=4,
          num_sparse_encoder_layers=4, num_sparse_decoder_layers=2), "both steps must be equal"),
    (dict(model_type="switch_transformers", num_layers=6, num_sparse_encoder_layers=2,
          num_sparse_decoder_layers=2), "1 or 2"),
    (dict(model_type="switch_transformers", router_bias=True), "router_bias"),
])
def test_inexpressible_expert_layouts_are_refused_exit_2(tmp_path, capsys, config, message):
    base = {"qwen2_moe": dict(DECODER, intermediate_size=48, moe_intermediate_size=16,
                              shared_expert_intermediate_size=40, num_hidden_layers=4,
                              num_experts=4, num_experts_per_tok=2, hidden_act="silu"),
            "switch_transformers": dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                        num_heads=4, num_experts=4, num_sparse_encoder_layers=1,
                                        num_sparse_decoder_layers=1)}[config["model_type"]]
    hf = hf_folder(tmp_path, {**base, **config})
    line = refusal(capsys, "import", f"--hf_dir={hf}", f"--out={tmp_path / 'ours'}")
    assert line.count("\n") == 0
    assert re.search(message, line), line


@pytest.mark.parametrize("change,message", [
    (dict(router_softmax="before_top_k"), "'after_top_k'"),
    (dict(moe_every=2), "every Mixtral layer is sparse"),
    (dict(shared_expert_d_ff=8, shared_expert_gate=False), "gates its shared expert"),
])
def test_decoder_mixtures_without_an_equivalent_are_refused_on_export(change, message):
    cfg = {**hf_moe.model_config_from_hf(dict(DECODER, model_type="mixtral", intermediate_size=24,
                                              num_hidden_layers=2, num_local_experts=4,
                                              num_experts_per_tok=2)), **change}
    with pytest.raises(UserError, match=message):
        hf_moe.hf_config_from_model_config(cfg)


def test_moe_every_is_found_only_where_it_draws_the_layers():
    assert hf_moe.moe_every_for([True, True, True]) == 1
    assert hf_moe.moe_every_for([False, True, False, True]) == 2
    assert hf_moe.moe_every_for([False, True, True, False]) is None
    assert hf_moe.moe_every_for([False, False]) is None
    # transformers' Switch: layer i sparse when i % step == 1; steps 1 and 2 are ours.
    assert hf_switch.hf_sparse_layers(4, 2) == [False, True, False, True]
    assert hf_switch.hf_sparse_layers(6, 2) == [False, True, False, False, True, False]
