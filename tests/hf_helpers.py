"""Tiny randomly initialised transformers models shared by the parity tests (no download)."""

import numpy as np
import torch
import transformers

VARIANTS = {
    # v1.1 / mT5: gated-GELU, separate output projection, no output scaling.
    "v1_1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    # v1.0: ReLU, output through the shared embedding, scaled by d_model**-0.5.
    "v1_0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
}


def tiny_hf_t5(variant: str):
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
        num_heads=4, dropout_rate=0.0, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, **VARIANTS[variant])
    return transformers.T5ForConditionalGeneration(config).eval()


def padded_batch():
    rng = np.random.default_rng(0)
    encoder = rng.integers(2, 96, size=(2, 13))
    encoder[1, 9:] = 0                       # padding in the batch
    targets = rng.integers(2, 96, size=(2, 7))
    targets[0, 5:] = 0
    decoder_inputs = np.concatenate([np.zeros((2, 1), int), targets[:, :-1]], axis=1)
    return encoder, decoder_inputs, targets


def tiny_hf_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_head=4, n_layer=3,
                                     n_positions=40, bos_token_id=99, eos_token_id=99,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).eval()


def tiny_hf_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_attention_heads=4,
                                     num_hidden_layers=2, intermediate_size=48,
                                     max_position_embeddings=40, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    return transformers.BertForPreTraining(config).eval()


def export_import_export(tmp_path, hf_model):
    """Saves ``hf_model``, then import -> export -> import -> export; checks the two
    exports (weights and config.json) are identical and returns the first one's folder."""
    from t5x_like.checkpoints import hf_io
    from t5x_like.convert import __main__ as convert_cli

    hf_model.save_pretrained(tmp_path / "hf")
    convert_cli.import_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    convert_cli.export_hf(str(tmp_path / "ours"), str(tmp_path / "exported"))
    convert_cli.import_hf(str(tmp_path / "exported"), str(tmp_path / "ours_again"))
    convert_cli.export_hf(str(tmp_path / "ours_again"), str(tmp_path / "exported_again"))
    first = hf_io.read_weights(tmp_path / "exported")
    second = hf_io.read_weights(tmp_path / "exported_again")
    assert sorted(first) == sorted(second)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    assert hf_io.read_config(tmp_path / "exported") == hf_io.read_config(tmp_path / "exported_again")
    return tmp_path / "exported"


def tiny_hf_roberta():
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=100, hidden_size=32, num_attention_heads=4,
                                        num_hidden_layers=2, intermediate_size=48,
                                        max_position_embeddings=42, type_vocab_size=1,
                                        pad_token_id=1, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)
    return transformers.RobertaForMaskedLM(config).eval()


def tiny_hf_llama(**overrides):
    """Llama with grouped-query attention (4 query heads share 2 key/value heads)."""
    torch.manual_seed(0)
    settings = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                    num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64,
                    rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                    eos_token_id=2, pad_token_id=0)
    settings.update(overrides)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).eval()


def tiny_hf_mistral(sliding_window: int):
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=100, hidden_size=32, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=1, num_hidden_layers=2, max_position_embeddings=64,
        sliding_window=sliding_window, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)
    return transformers.MistralForCausalLM(config).eval()


def tiny_hf_albert(**overrides):
    torch.manual_seed(0)
    settings = dict(vocab_size=100, embedding_size=16, hidden_size=32, num_attention_heads=4,
                    num_hidden_layers=3, intermediate_size=48, max_position_embeddings=40,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    settings.update(overrides)
    return transformers.AlbertForPreTraining(transformers.AlbertConfig(**settings)).eval()


def tiny_hf_bart():
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=3,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=40, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0)
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():  # a non-zero output bias, so the test sees whether it is imported
        model.final_logits_bias.normal_(0.0, 0.5)
    return model


def bpe_tokenizer_on_corpus(vocab_size: int = 600, lines: int = 3000):
    """A GPT-2-style byte-level BPE (``<|endoftext|>`` its only special token) trained
    offline on the embedded corpus, wrapped as a transformers tokenizer."""
    from tokenizers import ByteLevelBPETokenizer

    from t5x_like.builtin_tasks import pretraining as tasks

    texts = [line for doc in tasks.embedded_en_documents("train") for line in doc.split("\n")]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts[:lines], vocab_size=vocab_size, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>")


def tiny_gpt2_with_tokenizer(folder, n_positions: int = 160):
    """A random GPT-2 sized to a corpus-trained BPE, saved with it as Hugging Face does."""
    tokenizer = bpe_tokenizer_on_corpus()
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_head=4, n_layer=2,
                                     n_positions=n_positions, bos_token_id=eos,
                                     eos_token_id=eos, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def tiny_hf_tokenizer(vocab_size: int = 100):
    """A word-level tokenizer over ``vocab_size`` made-up words (``<pad>`` 0, ``<s>`` 1,
    ``</s>`` 2): what TRL's trainers want as a processing class beside a tiny model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
