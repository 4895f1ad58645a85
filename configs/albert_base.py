"""ALBERT base (about 12M parameters): 128-wide factorized embeddings projected to 768, one
block shared by all 12 layers, sentence-order head.

    python -m t5x_like.summary --config=configs/albert_base.py
    python -m t5x_like.train --config=configs/albert_base.py --workdir=runs/albert_base
    python -m t5x_like.convert import --hf_dir=path/to/albert-base-v2 --out=converted/albert_base
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("encoder")
    model = config.model
    model.vocab_size = 30000
    model.embedding_dim = 128
    model.share_layers = True
    model.d_model = 768
    model.num_heads = 12
    model.head_dim = 64
    model.d_ff = 3072
    model.num_layers = 12
    model.max_length = 512
    model.mlp_activations = ("gelu",)  # ALBERT's gelu_new (tanh approximation)
    config.task = "embedded_en_mlm"
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 4096
    config.optimizer.name = "adamw"  # the paper's LAMB is not in optax's standard chains here
    config.optimizer.learning_rate = 1.76e-3
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 3125
    config.optimizer.weight_decay = 0.01
    return config
