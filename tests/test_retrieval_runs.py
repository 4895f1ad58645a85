"""The retrieval runs end to end through ``python -m t5x_like.retrieval``, on tiny models:
a retriever trained from scratch, saved and loaded back; the KJV index built from it;
recall measured with both backends; RAG-sequence, RAG-token and closed-book generators
trained from a pretrained folder and evaluated."""

import json

import jax
import numpy as np
import pytest

from t5x_like import config_lib, models, structures
from t5x_like.builtin_tasks import retrieval as retrieval_tasks
from t5x_like.checkpoints import pretrained
from t5x_like.retrieval import checkpoints, retriever_run
from t5x_like.retrieval import cli as retrieval_cli
from t5x_like.retrieval import index as index_lib

TINY_TOWER = ["--config.init_from=", "--config.model.d_model=16", "--config.model.num_heads=2",
              "--config.model.head_dim=8", "--config.model.d_ff=32", "--config.model.num_layers=1",
              "--config.model.max_length=32", "--config.query_length=16",
              "--config.doc_length=16", "--config.batch_size=8", "--config.num_train_steps=2",
              "--config.warmup_steps=1", "--config.log_every_steps=1"]


def cli(*argv):
    assert retrieval_cli.main(list(argv)) == 0


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    """A retriever trained 2 steps from scratch, and its index over every KJV verse."""
    root = tmp_path_factory.mktemp("retrieval")
    workdir = root / "retriever"
    cli("train-retriever", "--config=configs/retrieval/retriever.py", f"--workdir={workdir}",
        *TINY_TOWER)
    cli("build-index", f"--retriever={workdir}", f"--output={root / 'index'}",
        "--shard_size=20000")
    return root


def test_a_trained_retriever_saves_and_loads_back(retriever):
    params, run = checkpoints.load(retriever / "retriever")
    assert run["kind"] == "retriever" and run["steps"] == 2 and run["init_from"] == ""
    assert run["model"]["d_model"] == 16 and (run["query_length"], run["doc_length"]) == (16, 16)
    assert set(params) == {"query", "doc"}  # two towers, trained separately
    assert np.isfinite(run["final"]["loss"])
    log = [json.loads(line) for line in (retriever / "retriever" / "metrics.jsonl")
           .read_text().splitlines()]
    assert [row["step"] for row in log] == [1, 2]
    model, loaded, again = retriever_run.load_retriever(str(retriever / "retriever"))
    assert again == run
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_the_index_holds_every_kjv_verse_in_shards(retriever):
    index = index_lib.load(retriever / "index")
    ids, texts = retrieval_tasks.kjv_corpus(retrieval_tasks.default_paths()[0])
    assert len(index.texts) == len(texts) == 31102  # the KJV's verse count
    assert list(index.texts) == list(texts)
    assert index.embeddings.shape == (31102, 16)  # one d_model vector per verse
    assert [shard["rows"] for shard in index.meta["shards"]] == [20000, 11102]
    norms = np.linalg.norm(index.embeddings[:100], axis=-1)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)  # normalize=True


def test_recall_is_measured_the_same_by_both_backends(retriever):
    args = (str(retriever / "retriever"), str(retriever / "index"), "test")
    exact = retriever_run.evaluate(*args, max_examples=32)
    faiss = retriever_run.evaluate(*args, backend="faiss", max_examples=32)
    assert exact["queries"] == faiss["queries"] == 32
    for k in (1, 5, 20):
        assert 0.0 <= exact[f"recall@{k}"] <= 100.0
        assert exact[f"recall@{k}"] == faiss[f"recall@{k}"]
    assert exact["recall@1"] <= exact["recall@5"] <= exact["recall@20"]


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    """A tiny T5 saved as a pretrained folder (what ``convert import`` writes)."""
    folder = tmp_path_factory.mktemp("generator") / "t5"
    config = dict(config_lib.model_defaults("encoder_decoder").to_dict(), family="encoder_decoder",
                  vocab_size=8192, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                  num_encoder_layers=1, num_decoder_layers=1)
    model = structures.build_model(config)
    variables = model.init(jax.random.key(0), *models.example_inputs(model))
    params = jax.device_get(jax.tree.map(lambda x: getattr(x, "value", x), variables["params"],
                                         is_leaf=lambda x: hasattr(x, "value")))
    pretrained.save_pretrained(folder, config, params)
    return folder


@pytest.mark.parametrize("kind", ["sequence", "token", "closed_book"])
def test_rag_and_closed_book_runs_train_and_evaluate(kind, retriever, generator, tmp_path):
    workdir = tmp_path / kind
    cli("train-rag", f"--config=configs/retrieval/rag.py:{kind}", f"--workdir={workdir}",
        f"--config.generator_init={generator}", f"--config.retriever={retriever / 'retriever'}",
        f"--config.index={retriever / 'index'}", "--config.k=2", "--config.query_length=16",
        "--config.passage_length=16", "--config.target_length=8", "--config.batch_size=2",
        "--config.num_train_steps=2", "--config.warmup_steps=1", "--config.log_every_steps=1")
    params, run = checkpoints.load(workdir)
    assert run["kind"] == kind and np.isfinite(run["final"]["loss"])
    assert ("retriever" in params) == (kind != "closed_book")  # RAG trains the query tower
    cli("evaluate-rag", f"--run={workdir}", "--max_examples=4", "--batch_size=4")
    result = json.loads((workdir / "eval_test.json").read_text())
    assert result["examples"] == 4 and 0.0 <= result["bleu"] <= 100.0
    predictions = (workdir / "predictions_test.jsonl").read_text().splitlines()
    assert len(predictions) == 4
    assert ("recall@1" in result) == (kind != "closed_book")
