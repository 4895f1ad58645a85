"""The dense retriever of the WEB -> KJV task: two towers from the pretrained tiny BERT
(configs/pretrain/bert_tiny.py), mean-pooled and L2-normalised, trained contrastively
with in-batch negatives (120 steps of 64 pairs, about 8 minutes on 2 busy CPU cores).

    python -m t5x_like.retrieval train-retriever --config=configs/retrieval/retriever.py \\
        --workdir=runs/ret_bert
    python -m t5x_like.retrieval build-index --retriever=runs/ret_bert --output=runs/ret_bert/index
    python -m t5x_like.retrieval evaluate-retriever --retriever=runs/ret_bert \\
        --index=runs/ret_bert/index

``--config.init_from=''`` trains towers of ``model`` from scratch instead.
"""

import ml_collections

from t5x_like import config_lib


def get_config():
    config = ml_collections.ConfigDict()
    config.init_from = "runs/pt_bert"
    model = config_lib.model_defaults("encoder")  # used only when init_from is ""
    model.update(dict(vocab_size=8192, d_model=128, num_heads=4, head_dim=32, d_ff=512,
                      num_layers=4, positions=dict(max_length=256),
                      next_sentence_head=False))
    config.model = model
    config.pooling = "mean"
    config.normalize = True
    config.temperature = 0.05
    config.query_length = 96
    config.doc_length = 96
    config.batch_size = 64
    config.num_train_steps = 120
    config.warmup_steps = 12
    config.learning_rate = 2e-4
    config.seed = 0
    config.log_every_steps = 20
    return config
