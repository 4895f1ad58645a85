"""mBART-large-cc25 (about 611M parameters): a 12 + 12-layer, 1024-wide pre-LayerNorm
BART with a LayerNorm after each stack, embeddings scaled by sqrt(d_model) and a
250,027-row vocabulary (250,000 SentencePiece pieces, 25 language ids, ...);
denoising over 25 languages sampled with α = 0.7, language ids after ``</s>``
(Liu et al. 2020).

    python -m t5x_like.summary --config=configs/mbart_large_cc25.py
    python -m t5x_like.train --config=configs/mbart_large_cc25.py --workdir=runs/mbart_large
    python -m t5x_like.convert import --hf_dir=path/to/mbart-large-cc25 --out=converted/mbart_cc25

Pretraining here runs the embedded multilingual mixture (``multilingual_mbart``) on its 8k
vocabulary (``--config.model.vocab_size=8192``); the 250,027 rows are the published model's.
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("bart")
    model = config.model
    model.vocab_size = 250027
    model.d_model = 1024
    model.num_heads = 16
    model.head_dim = 64
    model.d_ff = 4096
    model.num_encoder_layers = 12
    model.num_decoder_layers = 12
    model.max_length = 1024
    model.pre_norm = True
    model.final_layer_norm = True
    model.scale_embedding = True
    model.decoder_start_from_targets = True
    # The embedded vocabulary's ids (pad 0, eos 1); imported checkpoints carry mBART's (1, 2).
    model.pad_id, model.eos_id, model.decoder_start_id = 0, 1, 0
    config.task = "multilingual_mbart"
    config.task_feature_lengths = {"inputs": 512, "targets": 512}
    config.batch_size = 1024  # the paper: 128k tokens per batch
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 3e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 10_000
    config.optimizer.b2 = 0.98
    config.optimizer.weight_decay = 0.01
    return config
