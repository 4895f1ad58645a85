"""faiss as an optional backend, for indexes too large to keep on the devices.

The ``retrieval`` extra installs it (``pip install -c constraints.txt -e ".[retrieval]"``). Inner
product throughout, the metric the bi-encoder is trained for; ``factory`` is a
faiss index-factory string (``"Flat"`` exact, ``"IVF1024,Flat"`` and the like
approximate).
"""

from __future__ import annotations

import numpy as np

from t5x_like.errors import UserError, install_hint

# Imports inside functions: faiss (optional) loads only when a faiss index is built.


def _faiss():
    try:
        import faiss
    except ImportError:
        raise UserError(f"The faiss backend needs faiss: {install_hint('retrieval')} (or pass "
                        "--backend=jax).") from None
    return faiss


class FaissIndex:
    def __init__(self, docs: np.ndarray, factory: str = "Flat", nprobe: int = 8):
        faiss = _faiss()
        docs = np.ascontiguousarray(docs, np.float32)
        self.num_docs, self.dim = docs.shape
        self.index = faiss.index_factory(self.dim, factory, faiss.METRIC_INNER_PRODUCT)
        if not self.index.is_trained:
            self.index.train(docs)
        if hasattr(self.index, "nprobe"):
            self.index.nprobe = nprobe
        self.index.add(docs)

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 < k <= self.num_docs:
            raise ValueError(f"k={k}: pass 1 <= k <= {self.num_docs} (the documents indexed).")
        scores, indices = self.index.search(np.ascontiguousarray(queries, np.float32), k)
        return scores, indices.astype(np.int64)
