"""ELECTRA (Clark et al. 2020): a 12-layer discriminator on BERT's 30,522-piece WordPiece and
512 positions, trained against a 12-layer generator (64-wide heads in both) with λ = 50, on
the embedded corpus (15% masked); AdamW with 10k warmup steps and linear decay (the paper's
Table 6). The sizes give their widths, heads and MLPs, and their sequence length, batch, steps
and learning rate."""

from t5x_like import config_lib


def base(**model):
    """ELECTRA's recipe on an ``electra`` model with ``model``'s keys."""
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("electra")
    config.model.update(dict(variant="electra", vocab_size=30522, head_dim=64, num_layers=12,
                             generator=dict(head_dim=64, num_layers=12),
                             discriminator_loss_weight=50.0, positions=dict(max_length=512)))
    config.model.update(model)
    config.task = "embedded_en_electra"
    config.optimizer.update(name="adamw", schedule="linear", warmup_steps=10_000,
                            weight_decay=0.01)
    return config
