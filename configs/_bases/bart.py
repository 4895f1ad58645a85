"""BART (Lewis et al. 2020) and mBART (Liu et al. 2020): post-LayerNorm encoder-decoder with
learned positions, GELU, biases and an output tied to the shared embedding, on BART's 50,265-piece
BPE and 1,024 positions, 64-wide heads; denoising of the embedded corpus at 512/512, batch 256,
AdamW at 4e-4 with 10k warmup steps and linear decay. The sizes give their width, heads, MLP
and depths, and what else differs."""

from t5x_like import config_lib


def base(**model):
    """BART's recipe on a ``bart`` model with ``model``'s keys."""
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("bart")
    # Pretraining here uses the embedded vocabulary's ids (pad 0, eos 1, start 0);
    # checkpoints imported from Hugging Face carry BART's own (1, 2, 2) in their config.
    config.model.update(dict(variant="bart", vocab_size=50265, head_dim=64,
                             positions=dict(max_length=1024), pad_id=0, eos_id=1,
                             decoder_start_id=0))
    config.model.update(model)
    config.task = "embedded_en_bart"
    config.task_feature_lengths = {"inputs": 512, "targets": 512}
    config.batch_size = 256
    config.optimizer.update(name="adamw", learning_rate=4e-4, schedule="linear",
                            warmup_steps=10_000, weight_decay=0.01)
    return config
