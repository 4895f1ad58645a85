"""Dense retrieval and retrieval-augmented generation (REALM / RAG), one concern a module:

- ``towers``: the bi-encoder (query and document towers from the encoder family, pooled);
- ``search``: exact maximum inner product search, sharded over devices (``approx_max_k`` on TPU);
- ``faiss_backend``: faiss for indexes too large for the devices (the ``retrieval`` extra);
- ``index``: the index folder (embeddings per shard, ``index.json``, ``docs.jsonl``);
- ``text``: texts to framed token arrays;
- ``rag``: the RAG forward pass (query tower, fixed index, T5 generator) and its decoding;
- ``training``: the small AdamW loop the runs share;
- ``checkpoints``: what runs start from and leave;
- ``retriever_run``, ``rag_run``: the runs on ``embedded_bible_web_to_kjv``;
- ``cli``: ``python -m t5x_like.retrieval <subcommand>``.

The losses are in ``objectives.rag``; the task in ``data.retrieval_tasks``.
"""
