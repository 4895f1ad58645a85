"""RAG on the WEB -> KJV task: the tiny T5 (configs/pretrain/t5_tiny.py) reads the WEB
verse and each of the top 4 KJV verses the trained retriever finds; RAG-sequence
marginal likelihood; the query tower trains, the index stays fixed. 200 steps of 8
queries (32 generator rows), about 15 minutes on 2 busy CPU cores.

    python -m t5x_like.retrieval train-rag --config=configs/retrieval/rag.py \\
        --workdir=runs/rag_sequence
    python -m t5x_like.retrieval train-rag --config=configs/retrieval/rag.py:token \\
        --workdir=runs/rag_token
    python -m t5x_like.retrieval train-rag --config=configs/retrieval/rag.py:closed_book \\
        --workdir=runs/closed_book
    python -m t5x_like.retrieval evaluate-rag --run=runs/rag_sequence

Needs runs/pt_t5, and runs/ret_bert with its index (configs/retrieval/retriever.py).
The argument after ``:`` is ``kind``: ``sequence`` (default), ``token`` or ``closed_book``
(the same generator, steps and batch, reading the WEB verse alone).
"""

import ml_collections


def get_config(kind: str = "sequence"):
    config = ml_collections.ConfigDict()
    config.kind = kind
    config.generator_init = "runs/pt_t5"
    config.retriever = "runs/ret_bert"
    config.index = "runs/ret_bert/index"
    config.k = 4
    config.query_length = 64      # generator tokens of "kjv: " + WEB verse
    config.passage_length = 64    # generator tokens of "context: " + KJV verse + EOS
    config.target_length = 64
    config.batch_size = 8
    config.num_train_steps = 200
    config.warmup_steps = 20
    config.learning_rate = 1e-3           # generator
    config.retriever_learning_rate = 2e-5  # query tower
    config.seed = 0
    config.log_every_steps = 20
    return config
