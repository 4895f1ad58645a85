"""How contextual the vectors of one layer are, in the measures of Ethayarajh (2019),
"How Contextual are Contextualized Word Representations?", and how much of it the
post-processing of Mu & Viswanath (2018), "All-but-the-Top", removes.

Inputs are word vectors ``[N, d]`` of one layer with, per row, the context (sentence)
it came from and its word form. Cosine similarity throughout.

- anisotropy: the expected cosine of two random vectors from different contexts;
  near 0 for directions spread evenly, near 1 when all vectors share a direction;
- self-similarity of a word: mean pairwise cosine of its vectors across different
  contexts (words seen in at least ``min_contexts``), averaged over words;
- intra-sentence similarity: mean cosine of a sentence's words to the sentence's
  mean vector, averaged over sentences.

The last two are reported minus the layer's anisotropy (Ethayarajh's adjustment): a
layer whose every vector points the same way is not thereby context-free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

# Imports inside functions: scikit-learn loads only for the PCA figure that uses it.


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, np.float64)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def anisotropy(vectors: np.ndarray, contexts: Sequence[int], *, num_pairs: int = 20_000,
               seed: int = 0) -> float:
    """Mean cosine of ``num_pairs`` random pairs of rows whose contexts differ."""
    contexts = np.asarray(contexts)
    if len(np.unique(contexts)) < 2:
        raise ValueError("anisotropy needs vectors from at least two contexts.")
    rng = np.random.default_rng(seed)
    unit = unit_rows(vectors)
    left, right = [], []
    while sum(map(len, left)) < num_pairs:
        i = rng.integers(0, len(unit), num_pairs)
        j = rng.integers(0, len(unit), num_pairs)
        keep = contexts[i] != contexts[j]
        left.append(i[keep])
        right.append(j[keep])
    i, j = np.concatenate(left)[:num_pairs], np.concatenate(right)[:num_pairs]
    return float(np.einsum("nd,nd->n", unit[i], unit[j]).mean())


def self_similarity(vectors: np.ndarray, words: Sequence[str], contexts: Sequence[int], *,
                    min_contexts: int = 5, max_contexts: int = 50, seed: int = 0) -> float:
    """Mean over word forms seen in >= ``min_contexts`` contexts of the mean pairwise
    cosine of their vectors, one occurrence per context (the first), at most
    ``max_contexts`` contexts per word (a fixed random subset: frequent words would
    otherwise dominate the cost, not the average)."""
    unit = unit_rows(vectors)
    rng = np.random.default_rng(seed)
    scores = []
    for rows in occurrences_by_word(words, contexts, min_contexts).values():
        if len(rows) > max_contexts:
            rows = sorted(rng.choice(rows, max_contexts, replace=False))
        block = unit[rows]
        n = len(rows)
        gram = block @ block.T
        scores.append((gram.sum() - np.trace(gram)) / (n * (n - 1)))
    if not scores:
        raise ValueError(f"No word occurs in {min_contexts} different contexts; embed more "
                         "text or lower min_contexts.")
    return float(np.mean(scores))


def occurrences_by_word(words: Sequence[str], contexts: Sequence[int],
                        min_contexts: int) -> dict[str, list[int]]:
    """Word form -> its first row in each context, for forms seen in enough contexts."""
    seen: dict[str, dict[int, int]] = defaultdict(dict)
    for row, (word, context) in enumerate(zip(words, contexts, strict=False)):
        seen[word].setdefault(int(context), row)
    return {w: list(rows.values()) for w, rows in seen.items() if len(rows) >= min_contexts}


def intra_sentence_similarity(vectors: np.ndarray, contexts: Sequence[int]) -> float:
    """Mean over sentences (>= 2 words) of the mean cosine of each word to the
    sentence's mean vector."""
    _, group = np.unique(np.asarray(contexts), return_inverse=True)
    raw = np.asarray(vectors, np.float64)
    sums = np.zeros((group.max() + 1, raw.shape[1]))
    np.add.at(sums, group, raw)
    counts = np.bincount(group)
    cosines = np.einsum("nd,nd->n", unit_rows(raw), unit_rows(sums)[group])
    per_sentence = np.bincount(group, weights=cosines) / counts
    return float(per_sentence[counts >= 2].mean())


# -- post-processing ----------------------------------------------------------------------

def centered(vectors: np.ndarray) -> np.ndarray:
    """Minus the mean vector (the common direction anisotropy measures)."""
    vectors = np.asarray(vectors, np.float64)
    return vectors - vectors.mean(axis=0)


def standardized(vectors: np.ndarray) -> np.ndarray:
    """Centered, then each dimension divided by its standard deviation (the rogue
    dimensions that dominate cosine lose their weight)."""
    vectors = centered(vectors)
    return vectors / np.maximum(vectors.std(axis=0), 1e-12)


def without_top_components(vectors: np.ndarray, k: int) -> np.ndarray:
    """All-but-the-top: centered, minus the projection on the top ``k`` principal
    directions."""
    from sklearn.decomposition import PCA
    vectors = centered(vectors)
    if k <= 0:
        return vectors
    components = PCA(n_components=k, svd_solver="full").fit(vectors).components_
    return vectors - (vectors @ components.T) @ components


def top_component_share(vectors: np.ndarray, k: int = 1) -> float:
    """Fraction of the (uncentered) second moment along the top ``k`` directions: how
    much one direction carries, the quantity behind high anisotropy."""
    vectors = np.asarray(vectors, np.float64)
    singular = np.linalg.svd(vectors, compute_uv=False) ** 2
    return float(singular[:k].sum() / singular.sum())
