"""GPT-2 (Radford et al. 2019): learned positions, pre-LayerNorm, GELU MLP, tied output, on its
50,257-piece BPE and 1,024 positions; causal LM on the embedded corpus at GPT-2's batch of 512
sequences. The sizes (configs/gpt2_*.py) give their width, heads, MLP and depth; the modern
decoder (configs/decoder_modern_1b.py) its own vocabulary, positions and layer recipe."""

from t5x_like import config_lib


def base(**model):
    """GPT-2's recipe on a ``decoder`` model with ``model``'s keys (64-wide heads unless given)."""
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("decoder")
    config.model.update(dict(variant="gpt2", vocab_size=50257, head_dim=64,
                             positions=dict(max_length=1024)))
    config.model.update(model)
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": config.model.positions.max_length}
    config.batch_size = 512
    return config
