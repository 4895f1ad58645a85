import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# Published parameter counts (T5 paper / released checkpoints).
PUBLISHED = {
    "t5_1_0_small": 60.5e6,
    "t5_1_0_base": 222.9e6,
    "t5_1_1_small": 77.0e6,
    "t5_1_1_base": 247.6e6,
    "t5_1_1_large": 783.2e6,
    "t5_1_1_xl": 2.85e9,
    "t5_1_1_xxl": 11.1e9,
    "gpt2_small": 124.4e6,
    "gpt2_medium": 354.8e6,
    "gpt2_large": 774.0e6,
    "gpt2_xl": 1557.6e6,
    "bert_base": 110e6,
    "bert_large": 340e6,
    "roberta_base": 125e6,
    "albert_base": 11.7e6,         # albert-base-v2
    "bart_base": 139.4e6,          # facebook/bart-base
    "bart_large": 406.3e6,         # facebook/bart-large
    "decoder_modern_1b": 1.100e9,  # TinyLlama-1.1B's shape
    "longformer_base": 148.7e6,    # LongformerForMaskedLM, longformer-base-4096's config
}


def summary(config_name: str, *extra: str) -> str:
    result = subprocess.run([sys.executable, "-m", "t5x_like.summary",
                             f"--config=configs/{config_name}.py", *extra],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


# The same architectures in Hugging Face transformers (their own code, built on the meta
# device: nothing is allocated): an independent count, equal to ours parameter for
# parameter. ``extra`` is what transformers keeps outside ``parameters()``.
HF_EQUIVALENTS = {
    "t5_1_0_small": ("T5ForConditionalGeneration", dict(
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
        feed_forward_proj="relu"), 0),
    # v1.1 shares its input embeddings and keeps the output layer apart; transformers 5.23
    # unties the inputs too once tie_word_embeddings is off, so: tied count + lm_head.
    "t5_1_1_base": ("T5ForConditionalGeneration", dict(
        vocab_size=32128, d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_heads=12,
        feed_forward_proj="gated-gelu"), 32128 * 768),
    "t5_1_1_xxl": ("T5ForConditionalGeneration", dict(
        vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
        feed_forward_proj="gated-gelu"), 32128 * 4096),
    "gpt2_small": ("GPT2LMHeadModel", {}, 0),
    "gpt2_xl": ("GPT2LMHeadModel", dict(n_embd=1600, n_layer=48, n_head=25), 0),
    "bert_base": ("BertForPreTraining", {}, 0),
    "bert_large": ("BertForPreTraining", dict(hidden_size=1024, num_hidden_layers=24,
                                              num_attention_heads=16, intermediate_size=4096), 0),
    "roberta_base": ("RobertaForMaskedLM", dict(vocab_size=50265, max_position_embeddings=514,
                                                type_vocab_size=1), 0),
    "albert_base": ("AlbertForPreTraining", dict(
        embedding_size=128, vocab_size=30000, hidden_size=768, num_attention_heads=12,
        intermediate_size=3072), 0),
    "longformer_base": ("LongformerForMaskedLM", dict(
        vocab_size=50265, max_position_embeddings=4098, type_vocab_size=1, attention_window=512),
        0),
    # BART's final_logits_bias is a buffer in transformers and a parameter here.
    "bart_base": ("BartForConditionalGeneration", dict(
        vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
        decoder_ffn_dim=3072), 50265),
    "decoder_modern_1b": ("LlamaForCausalLM", dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False), 0),
}


def hf_count(class_name: str, settings: dict) -> int:
    import torch
    import transformers
    model_class = getattr(transformers, class_name)
    with torch.device("meta"):
        model = model_class(model_class.config_class(**settings))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(HF_EQUIVALENTS))
def test_standard_sizes_equal_their_hugging_face_counts(name):
    last = summary(name).strip().splitlines()[-1]
    assert last.startswith("params: ")
    class_name, settings, extra = HF_EQUIVALENTS[name]
    expected = hf_count(class_name, settings) + extra
    assert int(last.split()[1]) == expected
    assert abs(expected - PUBLISHED[name]) / PUBLISHED[name] < 0.02  # and the rounded papers'


def test_rows_add_up_and_overrides_apply():
    out = summary("t5_1_1_small", "--config.model.num_encoder_layers=1")
    lines = out.strip().splitlines()
    rows = [line.split() for line in lines[1:-1]]
    assert sum(int(r[1].replace(",", "")) for r in rows) == int(lines[-1].split()[1])
    assert "encoder/layers_0" in out and "encoder/layers_1" not in out


def test_every_size_config_validates():
    from t5x_like import config_lib
    for name in PUBLISHED:
        config_lib.validate(config_lib.load_config_file(str(REPO / "configs" / f"{name}.py")))
