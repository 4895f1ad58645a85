"""The dense retriever: exact top-k against brute force (one device, sharded over the
8 fake CPU devices of conftest, faiss), the index folder round trip, the embedded
retrieval task's splits, and a few contrastive steps that must lower the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import config_lib, errors
from t5x_like.builtin_tasks import bench as bench_tasks
from t5x_like.builtin_tasks import retrieval as retrieval_tasks
from t5x_like.objectives import rag as rag_objectives
from t5x_like.retrieval import index as index_lib
from t5x_like.retrieval import search, text, towers, training


def _data(n, q=7, d=12, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(q, d)).astype(np.float32), rng.normal(size=(n, d)).astype(np.float32))


def test_top_k_equals_brute_force():
    queries, docs = _data(50)
    scores, ids = search.top_k_scores(jnp.asarray(queries), jnp.asarray(docs), 10)
    ref_scores, ref_ids = search.brute_force(queries, docs, 10)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_docs,k", [(101, 20), (13, 5), (8, 8), (3, 2)])
def test_sharded_top_k_over_8_devices_equals_brute_force(num_docs, k):
    assert jax.device_count() == 8  # conftest's fake CPU devices
    queries, docs = _data(num_docs, seed=num_docs)
    index = search.ShardedIndex(docs, approximate=False)
    assert index.docs.sharding.shard_shape(index.docs.shape)[0] == index.per
    scores, ids = index.search(queries, k, chunk=4)  # several query chunks
    ref_scores, ref_ids = search.brute_force(queries, docs, k)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="k="):
        index.search(queries, num_docs + 1)


def test_sharded_search_on_a_sub_mesh_and_approximate_path():
    queries, docs = _data(40)
    mesh = search.doc_mesh(jax.devices()[:4])
    _, ids = search.ShardedIndex(docs, mesh=mesh, approximate=False).search(queries, 6)
    np.testing.assert_array_equal(ids, search.brute_force(queries, docs, 6)[1])
    # approx_max_k (TPU's path) runs anywhere; with recall_target 1.0 it finds them all.
    _, approx = search.ShardedIndex(docs, mesh=mesh, approximate=True,
                                    recall_target=1.0).search(queries, 6)
    assert np.mean([len(set(a) & set(b)) / 6 for a, b in zip(approx, ids, strict=False)]) >= 0.9


def test_faiss_backend_equals_brute_force():
    import faiss  # noqa: F401  (installed by the dev extra: a missing one must fail, not skip)

    from t5x_like.retrieval.faiss_backend import FaissIndex
    queries, docs = _data(60)
    scores, ids = FaissIndex(docs).search(queries, 7)
    ref_scores, ref_ids = search.brute_force(queries, docs, 7)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-4, atol=1e-4)


def test_faiss_missing_names_the_extra(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_faiss(name, *args, **kwargs):
        if name == "faiss":
            raise ImportError("no faiss")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_faiss)
    from t5x_like.retrieval.faiss_backend import FaissIndex
    with pytest.raises(errors.UserError, match=r"\[retrieval\]"):
        FaissIndex(np.zeros((2, 3), np.float32))


def test_index_is_written_per_shard_and_read_back(tmp_path):
    _, docs = _data(23)
    ids = [f"d{i}" for i in range(23)]
    texts = [f"text {i}" for i in range(23)]
    calls = []

    def encode(chunk):
        calls.append(len(chunk))
        return docs[[int(t.split()[1]) for t in chunk]]

    info = index_lib.build(tmp_path, ids, texts, encode, shard_size=10, meta={"retriever": "x"})
    assert calls == [10, 10, 3] and len(info["shards"]) == 3
    assert sorted(p.name for p in tmp_path.glob("embeddings_*.npy")) == [
        "embeddings_00000.npy", "embeddings_00001.npy", "embeddings_00002.npy"]
    loaded = index_lib.load(tmp_path)
    np.testing.assert_array_equal(loaded.embeddings, docs)
    assert loaded.ids == ids and loaded.texts == texts and loaded.meta["retriever"] == "x"
    with pytest.raises(errors.UserError, match="build-index"):
        index_lib.load(tmp_path / "missing")


def test_recall_at():
    found = np.array([[3, 1, 2], [0, 5, 4], [9, 8, 7]])
    assert search.recall_at(found, np.array([3, 5, 1]), ks=(1, 2, 3)) == {
        "recall@1": pytest.approx(100 / 3), "recall@2": pytest.approx(200 / 3),
        "recall@3": pytest.approx(200 / 3)}


def test_retrieval_task_keeps_the_bible_chapter_split():
    kjv_path, web_path = retrieval_tasks.default_paths()
    keys, texts = retrieval_tasks.kjv_corpus(kjv_path)
    pairs = retrieval_tasks.pairs(kjv_path, web_path)
    assert len(keys) > 30000 and all(len(pairs[s]) > 1000 for s in pairs)
    for split, rows in pairs.items():
        for row in rows[:: 97]:
            book, chapter, _ = bench_tasks._parse_key(row["key"])
            assert bench_tasks.chapter_split(book, chapter) == split
            assert keys[row["doc"]] == row["key"] and texts[row["doc"]] == row["target"]
    chapters = {s: {r["key"].rsplit(":", 1)[0] for r in rows} for s, rows in pairs.items()}
    assert not chapters["test"] & chapters["train"]


def test_tokenize_frames_and_pads():
    class Vocab:
        eos_id = 1

        def encode(self, s):
            return [len(w) + 10 for w in s.split()]

    rows = text.tokenize(Vocab(), ["a bb ccc dddd", "x"], 5, prefix=[5], suffix=[6])
    np.testing.assert_array_equal(rows, [[5, 11, 12, 13, 6], [5, 11, 6, 0, 0]])
    np.testing.assert_array_equal(text.generator_tokens(Vocab(), ["a"], 3), [[11, 1, 0]])


def test_contrastive_steps_lower_the_loss_and_find_the_pairs():
    enc = config_lib.model_defaults("encoder")
    enc.update(dict(vocab_size=40, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=1,
                    max_length=8, next_sentence_head=False))
    model = towers.bi_encoder(enc, "mean", normalize=True)
    params = towers.init_params(model, seed=0)
    rng = np.random.default_rng(0)
    docs = rng.integers(2, 40, size=(16, 6)).astype(np.int32)
    queries = docs.copy()
    queries[:, 1:3] = rng.integers(2, 40, size=(16, 2))  # a noisy copy: two tokens changed

    def loss_fn(p, batch):
        q, d = model.apply({"params": p}, batch["q"], batch["d"])
        return rag_objectives.contrastive_loss(q, d, 0.1)

    full_batch = jax.jit(loss_fn)  # one compile for the loss before and after
    before = float(full_batch(params, {"q": queries, "d": docs})[0])
    params, log = training.fit(loss_fn, params, lambda rows: {"q": queries[rows], "d": docs[rows]},
                               rates={"query": 1e-2, "doc": 1e-2}, steps=30, warmup=3,
                               num_examples=16, batch_size=8, seed=0, log_every=10)
    after, metrics = full_batch(params, {"q": queries, "d": docs})
    assert float(after) < 0.5 * before
    assert float(metrics["accuracy"]) >= 0.9
    assert set(params) == {"query", "doc"}


def test_identical_texts_count_as_one_answer():
    from t5x_like.retrieval.retriever_run import canonical_ids
    canonical = canonical_ids(["a", "b", "a", "c", "b"])
    np.testing.assert_array_equal(canonical, [0, 1, 0, 3, 1])
    found = np.array([[2, 3], [4, 0]])  # a tie listed the other copy first
    assert search.recall_at(canonical[found], canonical[[0, 1]], ks=(1,)) == {"recall@1": 100.0}


def test_a_missing_retriever_is_refused_naming_the_option_to_fix(tmp_path, capsys):
    from t5x_like.retrieval import cli
    missing = tmp_path / "nope"
    assert cli.main(["build-index", f"--retriever={missing}", f"--output={tmp_path / 'index'}"]) == 2
    assert f"retrieval: --retriever={missing}: no such folder." in capsys.readouterr().err
