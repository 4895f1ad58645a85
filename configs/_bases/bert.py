"""BERT (Devlin et al. 2019) and the encoders trained on its recipe (RoBERTa, ALBERT): a
post-LayerNorm encoder on BERT's 30,522-piece WordPiece and 512 positions, 64-wide heads,
masked LM on the embedded corpus at 128 tokens, batch 256, AdamW at 1e-4 with 10k warmup
steps and linear decay. The sizes give their width, heads, MLP and depth, and what else of
the network and recipe differs."""

from t5x_like import config_lib


def base(**model):
    """BERT's recipe on an ``encoder`` model with ``model``'s keys."""
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("encoder")
    config.model.update(dict(variant="bert", vocab_size=30522, head_dim=64,
                             positions=dict(max_length=512)))
    config.model.update(model)
    config.task = "embedded_en_mlm"
    config.task_feature_lengths = {"inputs": 128}
    config.batch_size = 256
    config.optimizer.update(name="adamw", learning_rate=1e-4, schedule="linear",
                            warmup_steps=10_000, weight_decay=0.01)
    return config
