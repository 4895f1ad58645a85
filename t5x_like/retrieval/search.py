"""Exact maximum inner product search, on one device or sharded over a mesh.

Why by hand: the index is a plain ``[num_docs, dim]`` array, and a matmul plus
``jax.lax.top_k`` is already the exact answer; sharding it is one ``shard_map``:
each device scores its slice of the documents, keeps its own top k, and the
per-device candidates are gathered and merged with one more ``top_k``. On TPU
``jax.lax.approx_max_k`` replaces the per-shard ``top_k`` (the TPU-native partial
reduction; ``recall_target`` says how exact). faiss (``faiss_backend``) serves
indexes too large for device memory.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

DEFAULT_AXIS = "docs"


def default_approximate() -> bool:
    """Approximate top-k where it is the native primitive: TPU."""
    return jax.default_backend() == "tpu"


def _top_k(scores: jax.Array, k: int, approximate: bool, recall_target: float):
    if approximate:
        return jax.lax.approx_max_k(scores, k, recall_target=recall_target)
    return jax.lax.top_k(scores, k)


def top_k_scores(queries: jax.Array, docs: jax.Array, k: int, *, approximate: bool = False,
                 recall_target: float = 0.95) -> tuple[jax.Array, jax.Array]:
    """``(scores [Q, k], doc indices [Q, k])`` of the best ``q . d``, on one device;
    usable inside a jitted step (the RAG forward pass calls it)."""
    scores = jnp.einsum("qd,nd->qn", queries, docs.astype(queries.dtype),
                        preferred_element_type=jnp.float32)
    return _top_k(scores, k, approximate, recall_target)


def brute_force(queries: np.ndarray, docs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: every score in numpy, sorted (stable, so ties go to the lower index)."""
    scores = np.asarray(queries, np.float32) @ np.asarray(docs, np.float32).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def doc_mesh(devices=None, axis: str = DEFAULT_AXIS) -> Mesh:
    """A one-axis mesh over ``devices`` (default all) that shards the documents."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (axis,))


def shard_docs(docs, mesh: Mesh, axis: str = DEFAULT_AXIS) -> tuple[jax.Array, jax.Array, int]:
    """``(docs, valid, rows_per_shard)``: the index padded to a multiple of the mesh
    axis and placed one slice per device; ``valid`` masks the padding rows."""
    n, dim = docs.shape
    shards = mesh.shape[axis]
    per = max(1, math.ceil(n / shards))
    padded = np.zeros((per * shards, dim), np.asarray(docs).dtype)
    padded[:n] = np.asarray(docs)
    valid = np.arange(per * shards) < n
    sharding = jax.sharding.NamedSharding(mesh, P(axis))
    return jax.device_put(padded, sharding), jax.device_put(valid, sharding), per


@functools.partial(jax.jit, static_argnames=("k", "mesh", "axis", "per", "approximate",
                                             "recall_target"))
def _sharded_search(queries, docs, valid, *, k, mesh, axis, per, approximate, recall_target):
    local_k = min(k, per)

    def shard(q, d, v):
        scores = jnp.einsum("qd,nd->qn", q, d.astype(q.dtype), preferred_element_type=jnp.float32)
        scores = jnp.where(v[None, :], scores, -jnp.inf)
        s, i = _top_k(scores, local_k, approximate, recall_target)
        i = i + jax.lax.axis_index(axis) * per
        # Candidates of every shard, in shard order (ties keep the lower document index).
        s = jax.lax.all_gather(s, axis, axis=1, tiled=True)
        i = jax.lax.all_gather(i, axis, axis=1, tiled=True)
        best, where = jax.lax.top_k(s, k)
        return best, jnp.take_along_axis(i, where, axis=1)

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(axis), P(axis)),
                         out_specs=(P(), P()), check_vma=False)(queries, docs, valid)


class ShardedIndex:
    """Document embeddings sharded over a mesh axis; ``search`` is exact unless
    ``approximate`` (default: on TPU)."""

    def __init__(self, docs, mesh: Mesh | None = None, axis: str = DEFAULT_AXIS,
                 approximate: bool | None = None, recall_target: float = 0.95):
        self.mesh = mesh or doc_mesh(axis=axis)
        self.axis = axis
        self.num_docs, self.dim = docs.shape
        self.docs, self.valid, self.per = shard_docs(docs, self.mesh, axis)
        self.approximate = default_approximate() if approximate is None else approximate
        self.recall_target = recall_target

    def search(self, queries, k: int, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """``(scores [Q, k], indices [Q, k])`` as numpy, ``chunk`` queries at a time."""
        if not 0 < k <= self.num_docs:
            raise ValueError(f"k={k}: pass 1 <= k <= {self.num_docs} (the documents indexed).")
        queries = np.asarray(queries, np.float32)
        out_s, out_i = [], []
        for start in range(0, len(queries), chunk):
            s, i = _sharded_search(jnp.asarray(queries[start:start + chunk]), self.docs,
                                   self.valid, k=k, mesh=self.mesh, axis=self.axis, per=self.per,
                                   approximate=self.approximate,
                                   recall_target=self.recall_target)
            out_s.append(np.asarray(s))
            out_i.append(np.asarray(i))
        return np.concatenate(out_s), np.concatenate(out_i)


def recall_at(indices: np.ndarray, gold: np.ndarray, ks=(1, 5, 20)) -> dict[str, float]:
    """Percent of queries whose gold document is among their first k results."""
    hits = np.asarray(indices) == np.asarray(gold)[:, None]
    return {f"recall@{k}": float(100.0 * hits[:, :k].any(axis=1).mean()) for k in ks}
