"""Contextual embeddings and their geometry (``python -m t5x_like.embed``, docs/embeddings.md).

- ``hidden_states``: every layer of any family's checkpoint (an interceptor on the stack's blocks);
- ``alignment``: which tokens make up which word;
- ``extraction``: texts -> framed, batched model inputs -> pooled arrays;
- ``embedding_files``: the folder ``embed`` writes, and reading it back;
- ``geometry``: anisotropy, self-similarity, intra-sentence similarity, post-processing;
- ``probes``: linear probes by layer and their baselines;
- ``plots``: one PNG per analysis, models as lines.
"""
