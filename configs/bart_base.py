"""BART base (about 139M parameters): post-LayerNorm encoder-decoder with learned positions,
GELU, biases and an output tied to the shared embedding.

    python -m t5x_like.summary --config=configs/bart_base.py
    python -m t5x_like.train --config=configs/bart_base.py --workdir=runs/bart_base
    python -m t5x_like.convert import --hf_dir=path/to/bart-base --out=converted/bart_base
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("bart")
    model = config.model
    model.vocab_size = 50265
    model.d_model = 768
    model.num_heads = 12
    model.head_dim = 64
    model.d_ff = 3072
    model.num_encoder_layers = 6
    model.num_decoder_layers = 6
    model.max_length = 1024
    # Pretraining here uses the embedded vocabulary's ids (pad 0, eos 1, start 0);
    # checkpoints imported from Hugging Face carry BART's own (1, 2, 2) in their config.
    model.pad_id, model.eos_id, model.decoder_start_id = 0, 1, 0
    config.task = "embedded_en_bart"
    config.task_feature_lengths = {"inputs": 512, "targets": 512}
    config.batch_size = 256
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 4e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 10_000
    config.optimizer.weight_decay = 0.01
    return config
