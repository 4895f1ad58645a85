"""The open decoders of 2025-26 against transformers, randomly initialised (no download):
Qwen2/Qwen2.5, Qwen3, Gemma 2, Gemma 3 (text) and Llama 3.1's RoPE scaling (and the
``linear`` and ``yarn`` rescalings config.json may carry). Each imports at 1e-4 logit
parity, decodes greedily as ``generate`` does, and exports back to the same tensors."""

import functools

import jax
import numpy as np
import pytest
import torch
import transformers
from test_convert_llama import assert_logits_match, import_and_build, right_padded_batch

from t5x_like import structures
from t5x_like.checkpoints import hf_io
from t5x_like.convert import __main__ as convert_cli
from t5x_like.errors import UserError
from t5x_like.models import decoding

SMALL = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, num_hidden_layers=4, max_position_embeddings=64,
             rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def perturbed(model):
    """Transformers initialises biases to zero and Gemma's norms to zero (a scale of one):
    a parity test on those would not see them. Every parameter moves a little."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def qwen2(**overrides):
    torch.manual_seed(0)
    settings = dict(SMALL, tie_word_embeddings=False)
    settings.update(overrides)
    return perturbed(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**settings)))


def qwen3(**overrides):
    torch.manual_seed(0)
    settings = dict(SMALL, tie_word_embeddings=True)
    settings.update(overrides)
    return perturbed(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**settings)))


def gemma2(**overrides):
    torch.manual_seed(0)
    settings = dict(SMALL, sliding_window=5, query_pre_attn_scalar=12,
                    attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
    settings.update(overrides)
    return perturbed(transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**settings)))


def gemma3(**overrides):
    torch.manual_seed(0)
    settings = dict(SMALL, sliding_window=5, query_pre_attn_scalar=12,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                 "sliding_attention"],
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 8.0,
                                           "rope_theta": 1_000_000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
    settings.update(overrides)
    return perturbed(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**settings)))


def llama(rope_parameters):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**dict(SMALL, tie_word_embeddings=False,
                                             rope_parameters=rope_parameters))
    return perturbed(transformers.LlamaForCausalLM(config))


CASES = {
    "qwen2_untied": lambda: qwen2(),
    "qwen2.5_tied": lambda: qwen2(tie_word_embeddings=True),
    "qwen2_sliding_from_layer_2": lambda: qwen2(use_sliding_window=True, sliding_window=5,
                                                max_window_layers=2),
    "qwen3": lambda: qwen3(),
    "qwen3_yarn": lambda: qwen3(rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "rope_theta": 10_000.0}),
    "gemma2": lambda: gemma2(),
    "gemma3": lambda: gemma3(),
    "llama3.1_rope": lambda: llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "rope_theta": 500_000.0,
                                    "original_max_position_embeddings": 16}),
    "llama_linear_rope": lambda: llama({"rope_type": "linear", "factor": 2.0,
                                        "rope_theta": 10_000.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(tmp_path, case):
    hf_model = CASES[case]()
    model_config, model, params = import_and_build(tmp_path, hf_model)
    tokens, mask = right_padded_batch(length=40)  # past the windows and the original contexts
    assert_logits_match(model, params, hf_model, tokens, mask)
    if case.startswith("gemma"):
        # The switches matter: without the sliding layers' windows the logits move.
        unwindowed = structures.build_model({**model_config, "layer_types": (), "sliding_window": 0})
        assert not np.allclose(model.apply({"params": params}, tokens),
                               unwindowed.apply({"params": params}, tokens), atol=1e-3)
    if model_config["rope_type"] != "default":
        # So does the rescaling of the RoPE frequencies.
        plain = structures.build_model({**model_config, "rope_type": "default"})
        assert not np.allclose(model.apply({"params": params}, tokens),
                               plain.apply({"params": params}, tokens), atol=1e-3)


def test_the_imported_switches_are_the_families(tmp_path):
    configs = {case: import_and_build(tmp_path / case, CASES[case]())[0]
               for case in ("qwen2_sliding_from_layer_2", "qwen3", "gemma2", "gemma3",
                            "llama3.1_rope")}
    qwen2_config = configs["qwen2_sliding_from_layer_2"]
    assert qwen2_config["qkv_bias"] and not qwen2_config["qk_norm"]
    assert tuple(qwen2_config["layer_types"]) == ("full_attention", "full_attention",
                                           "sliding_attention", "sliding_attention")
    assert configs["qwen3"]["qk_norm"] and configs["qwen3"]["tie_embeddings"]
    gemma = configs["gemma2"]
    assert (gemma["attention_logit_softcap"], gemma["final_logit_softcap"]) == (2.0, 3.0)
    assert tuple(gemma["layer_types"][:2]) == ("sliding_attention", "full_attention")
    assert gemma["post_sublayer_norms"] and gemma["scale_embeddings"]
    assert configs["gemma3"]["local_rotary_max_wavelength"] == 10_000.0
    assert (configs["gemma3"]["rope_type"], configs["gemma3"]["rope_factor"]) == ("linear", 8.0)
    assert configs["llama3.1_rope"]["rope_type"] == "llama3"


@pytest.mark.parametrize("case", ["qwen2_sliding_from_layer_2", "qwen3", "gemma2", "gemma3",
                                  "llama3.1_rope"])
def test_greedy_decoding_matches_generate(tmp_path, case):
    hf_model = CASES[case]()
    _, model, params = import_and_build(tmp_path, hf_model)
    prompt = np.random.default_rng(3).integers(3, 99, size=(2, 6))
    with torch.no_grad():
        theirs = hf_model.generate(input_ids=torch.tensor(prompt),
                                   attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                                   max_new_tokens=12, do_sample=False, num_beams=1,
                                   pad_token_id=0, eos_token_id=None).numpy()[:, 6:]
    ours = jax.jit(functools.partial(decoding.generate, model, max_new_tokens=12, eos_id=-1,
                                     pad_id=0))(params, prompt)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


@pytest.mark.parametrize("case", ["qwen2_sliding_from_layer_2", "qwen2.5_tied", "qwen3_yarn",
                                  "gemma2", "gemma3", "llama3.1_rope"])
def test_export_gives_back_the_same_tensors_and_config(tmp_path, case):
    hf_model = CASES[case]()
    import_and_build(tmp_path, hf_model)
    convert_cli.export_hf(str(tmp_path / "ours"), str(tmp_path / "back"))
    original, exported = hf_io.read_weights(tmp_path / "hf"), hf_io.read_weights(tmp_path / "back")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_allclose(exported[name], tensor, atol=1e-6, err_msg=name)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(reloaded) is type(hf_model)
    tokens, _ = right_padded_batch(length=40)
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(input_ids=torch.tensor(tokens)).logits.numpy(),
                                   hf_model(input_ids=torch.tensor(tokens)).logits.numpy(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config,message", [
    (dict(model_type="llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                               "rope_theta": 1e4}), "'dynamic'"),
    (dict(model_type="qwen3", rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}),
     "'longrope'"),
    (dict(model_type="qwen3", attention_bias=True), "attention_bias"),
    (dict(model_type="gemma2", use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(model_type="gemma3_text", rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}),
     "sliding layers"),
])
def test_unsupported_switches_are_refused_naming_what_is(config, message):
    from t5x_like.convert import hf_gemma, hf_llama
    hf = dict(SMALL, vocab_size=100, num_hidden_layers=2, **config)
    module = hf_gemma if config["model_type"].startswith("gemma") else hf_llama
    with pytest.raises(UserError, match=message) as error:
        module.model_config_from_hf(hf)
    if "rope" in message or "longrope" in message:
        assert "default, linear, llama3, yarn" in str(error.value)


@pytest.mark.parametrize("model,message", [
    (dict(layer_types=("full_attention", "sliding_attention")), "sliding_window=0; set a window"),
    (dict(layer_types=("full_attention",), sliding_window=4), "names 1 layers"),
    (dict(layer_types=("full_attention", "local")), "each layer is one of"),
    (dict(layer_types=("full_attention", "sliding_attention"), sliding_window=4,
          scan_layers=True), "use numerics.scan_layers=False"),
    (dict(rope_type="dynamic"), "'model.positions.rope.scaling' is 'dynamic'; choose one of"),
])
def test_bad_decoder_switches_are_config_errors_naming_the_fix(model, message):
    from test_peft import tiny_decoder

    from t5x_like import config_lib, errors
    config = tiny_decoder(num_layers=2)  # the layer_types cases name two layers
    config.model.update(model)
    with pytest.raises(errors.ConfigError, match=message):
        config_lib.validate(config)


def test_beam_search_over_mixed_layer_types_is_refused(tmp_path):
    hf_model = CASES["gemma2"]()
    _, model, params = import_and_build(tmp_path, hf_model)
    prompt = np.random.default_rng(3).integers(3, 99, size=(1, 6))
    with pytest.raises(ValueError, match="decode it greedily or by sampling"):
        decoding.beam_generate(model, params, prompt, max_new_tokens=3, num_beams=2, eos_id=2)


def test_infer_with_beams_on_mixed_layer_types_is_refused_exit_2(tmp_path, capsys):
    from t5x_like import infer
    import_and_build(tmp_path, CASES["gemma2"]())
    (tmp_path / "in.jsonl").write_text('{"inputs": "hello"}\n')
    code = infer.main([f"--checkpoint={tmp_path / 'ours'}", f"--input_file={tmp_path / 'in.jsonl'}",
                       f"--output_file={tmp_path / 'out.jsonl'}", "--num_beams=4",
                       "--inputs_length=8"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "--num_beams=4" in line and "--num_beams=1" in line
    assert not (tmp_path / "out.jsonl").exists()

