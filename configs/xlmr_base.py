"""XLM-R base (about 270M parameters, 192M of them the 250k-piece embedding): RoBERTa's
network (12 layers, 768 wide) on a 250,002-piece SentencePiece vocabulary, masked LM over
100 languages sampled q_i ∝ p_i^0.3 (Conneau et al. 2020).

    python -m t5x_like.summary --config=configs/xlmr_base.py
    python -m t5x_like.train --config=configs/xlmr_base.py --workdir=runs/xlmr_base
    python -m t5x_like.convert import --hf_dir=path/to/xlm-roberta-base --out=converted/xlmr_base

Pretraining here runs the embedded multilingual mixture (``multilingual_mlm``) on its 8k
vocabulary, so give ``--config.model.vocab_size=8192`` (or import the published
checkpoint and its tokenizer); the 250,002 rows are the published model's.
"""

from t5x_like import config_lib


def get_config():
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("encoder")
    model = config.model
    model.vocab_size = 250002
    model.d_model = 768
    model.num_heads = 12
    model.head_dim = 64
    model.d_ff = 3072
    model.num_layers = 12
    model.max_length = 514
    model.type_vocab_size = 1
    model.pad_id = 1
    model.position_offset = 2
    model.next_sentence_head = False
    model.layer_norm_epsilon = 1e-5
    config.task = "multilingual_mlm"
    config.task_feature_lengths = {"inputs": 512}
    config.batch_size = 8192
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 6e-4
    config.optimizer.schedule = "linear"
    config.optimizer.warmup_steps = 24_000
    config.optimizer.weight_decay = 0.01
    config.optimizer.b2 = 0.98
    return config
