"""``python -m t5x_like.embed`` and the geometry analyses (t5x_like/analysis/)."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import config_lib, embed, models, structures
from t5x_like.analysis import alignment, embedding_files, geometry, hidden_states, probes
from t5x_like.builtin_tasks import pretraining as builtin
from t5x_like.data.vocabularies import ByteVocabulary
from t5x_like.models import stacking

SIZES = dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64)
FAMILY_SIZES = {"encoder": dict(num_layers=2, max_length=64, next_sentence_head=False),
                "decoder": dict(num_layers=2, max_length=64),
                "encoder_decoder": dict(num_encoder_layers=2, num_decoder_layers=1)}
TEXTS = ["The cat sat on the mat .", "Unbelievably, lexicographers misunderstood it!",
         "A dog barked."]


def tiny_run_config(family: str):
    config = config_lib.default_config()
    config.model = config_lib.model_defaults(family)
    config.model.update(dict(SIZES, **FAMILY_SIZES[family]))
    return config


def tiny_model(family: str) -> hidden_states.EmbeddingModel:
    config = tiny_run_config(family)
    module = structures.build_model(config.model)
    shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.PRNGKey(0),
                                          *models.example_inputs(module))["params"])
    rng = np.random.default_rng(0)  # random params without compiling an init
    params = jax.tree.map(lambda s: rng.normal(0.0, 0.3, s.shape).astype(np.float32), shapes)
    return hidden_states.EmbeddingModel(config, params, builtin.embedded_vocabulary())


@pytest.fixture(scope="module")
def tiny_models():
    return {family: tiny_model(family) for family in FAMILY_SIZES}


@pytest.fixture(scope="module")
def checkpoints(tiny_models, tmp_path_factory):
    """Random-init encoder and decoder saved as pretrained folders with the embedded vocabulary."""
    from t5x_like.checkpoints import pretrained
    folders = {}
    for family in ("encoder", "decoder"):
        model = tiny_models[family]
        folder = tmp_path_factory.mktemp("ckpt") / family
        pretrained.save_pretrained(folder, dict(model.config.model), model.params,
                                   vocabulary=builtin.embedded_vocabulary())
        folders[family] = str(folder)
    return folders


@pytest.fixture
def input_txt(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS[:2]) + "\n\n" + TEXTS[2] + "\n")
    return str(path)


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_cli_writes_the_documented_files(checkpoints, input_txt, tmp_path, family):
    out = tmp_path / "out"
    assert embed.main([f"--checkpoint={checkpoints[family]}", f"--input_file={input_txt}",
                       "--layers=all", f"--output={out}", "--batch_size=2"]) == 0
    loaded = embedding_files.Embeddings(out)
    vocabulary = builtin.embedded_vocabulary()
    n_words = sum(len(t.split()) for t in TEXTS)
    assert loaded.layers == [0, 1, 2] and loaded.meta["n_texts"] == 3
    assert [r["words"] for r in loaded.index] == [t.split() for t in TEXTS]
    assert loaded.word_texts() == [w for t in TEXTS for w in t.split()]
    n_tokens = sum(len(r["token_ids"]) for r in loaded.index)
    for k in loaded.layers:
        assert loaded.tokens(k).shape == (n_tokens, 32)
    for kind in ("mean", "first", "last"):
        assert loaded.pooled(kind).shape == (3, 3, 32)
    for kind in ("first", "mean"):
        assert loaded.words(kind).shape == (n_words, 3, 32)
    first = loaded.index[0]
    if family == "encoder":  # [CLS] text [SEP]
        assert first["token_ids"][0] == vocabulary.cls_id
        assert first["token_ids"][-1] == vocabulary.sep_id
    else:  # EOS text
        assert first["token_ids"][0] == vocabulary.eos_id
        assert first["text_span"][1] == len(first["token_ids"])
    # The arrays agree with each other: pooled and word vectors are the token rows'.
    record = loaded.index[1]
    rows = loaded.tokens(2)[record["token_start"]:record["token_start"] + len(record["token_ids"])]
    a, b = record["text_span"]
    np.testing.assert_allclose(loaded.pooled("mean")[1, 2], rows[a:b].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loaded.pooled("first")[1, 2], rows[0], rtol=1e-6)
    np.testing.assert_allclose(loaded.pooled("last")[1, 2], rows[b - 1], rtol=1e-6)
    (ws, we) = record["word_spans"][1]
    np.testing.assert_allclose(loaded.words("mean")[record["word_start"] + 1, 2],
                               rows[ws:we].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loaded.words("first")[record["word_start"] + 1, 2], rows[ws],
                               rtol=1e-6)
    # Batching and padding do not change a vector: one text alone gives the same.
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps({"id": "x", "words": TEXTS[1].split()}) + "\n")
    assert embed.main([f"--checkpoint={checkpoints[family]}", f"--input_file={alone}",
                       "--layers=-1", f"--output={tmp_path / 'alone'}", "--no_tokens",
                       "--batch_size=2"]) == 0
    single = embedding_files.Embeddings(tmp_path / "alone")
    assert single.layers == [2] and single.index[0]["id"] == "x"
    np.testing.assert_allclose(single.words("mean")[:, 0], loaded.words("mean")[
        record["word_start"]:record["word_start"] + len(record["words"]), 2], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("vocabulary", [builtin.embedded_vocabulary(), ByteVocabulary()],
                         ids=["sentencepiece", "bytes"])
def test_word_alignment_recovers_the_words(vocabulary):
    words = "Unbelievably , lexicographers misunderstood the cat's 1984 naïveté !".split()
    tokens = alignment.tokenize_words(vocabulary, words)
    assert tokens.same_as_text_encoding
    assert tokens.ids == list(vocabulary.encode(" ".join(words)))
    assert [vocabulary.decode(tokens.ids[a:b]).strip() for a, b in tokens.spans] == words
    assert tokens.spans[0][0] == 0 and tokens.spans[-1][1] == len(tokens.ids)
    assert any(b - a > 1 for a, b in tokens.spans)  # some words are several subwords
    assert alignment.words_fitting(tokens.spans, tokens.spans[2][1]) == 3
    assert alignment.words_fitting(tokens.spans, tokens.spans[2][1] - 1) == 2


def test_layers_are_the_embeddings_and_the_block_outputs(tiny_models):
    """Layer 0 is the embedding lookup computed by hand; the last layer is what the
    model's own forward pass gives (before the final norm, for pre-norm models)."""
    tokens = np.zeros((2, 16), np.int32)
    tokens[0, :5], tokens[1, :3] = [5, 400, 1200, 77, 6], [5, 9, 6]
    positions = np.arange(tokens.shape[1])

    bert = tiny_models["encoder"]
    states = bert.hidden_states(tokens, [0, 1, 2])
    p = bert.params
    summed = (p["token_embedder"]["embedding"][tokens] + p["position_embedder"]["embedding"][positions]
              + p["token_type_embedder"]["embedding"][0])
    mean, var = summed.mean(-1, keepdims=True), summed.var(-1, keepdims=True)
    by_hand = ((summed - mean) / np.sqrt(var + 1e-12) * p["embedding_norm"]["scale"]
               + p["embedding_norm"]["bias"])
    np.testing.assert_allclose(states[0], by_hand, rtol=1e-5, atol=1e-5)
    forward = jax.jit(bert.model.apply)({"params": p}, tokens)["hidden"]
    np.testing.assert_allclose(states[2], forward, rtol=1e-5, atol=1e-5)
    assert not np.allclose(states[1], states[2])

    gpt = tiny_models["decoder"]
    states = gpt.hidden_states(tokens, [0, 2])
    p = gpt.params
    np.testing.assert_allclose(states[0], p["token_embedder"]["embedding"][tokens]
                               + p["position_embedder"]["embedding"][positions], rtol=1e-6)
    final = jax.jit(gpt.model.apply, static_argnames="return_hidden")(
        {"params": p}, tokens, return_hidden=True)
    norm = p["final_norm"]
    last = jnp.asarray(states[1])
    normed = ((last - last.mean(-1, keepdims=True)) / jnp.sqrt(last.var(-1, keepdims=True) + 1e-5)
              * norm["scale"] + norm["bias"])
    np.testing.assert_allclose(normed, final, rtol=1e-4, atol=1e-4)

    # A scanned, rematerialized checkpoint of the same model reads the same layers.
    scanned_config = tiny_run_config("decoder")
    scanned_config.model.update(scan_layers=True, remat_policy="full")
    scanned = hidden_states.EmbeddingModel(scanned_config, stacking.stack_layer_params(p),
                                           gpt.vocabulary)
    np.testing.assert_array_equal(scanned.hidden_states(tokens, [0, 2]), states)

    t5 = tiny_models["encoder_decoder"]
    assert t5.num_layers == 2 and t5.stack == "encoder (T5)"
    states = t5.hidden_states(tokens, [0, 2])
    p = t5.params
    np.testing.assert_allclose(states[0], p["token_embedder"]["embedding"][tokens], rtol=1e-6)
    encoded = jax.jit(t5.model.apply, static_argnames="method")({"params": p}, tokens,
                                                                method="encode")
    last = states[1]
    rms = last / np.sqrt((last ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(rms * p["encoder"]["final_norm"]["scale"], encoded,
                               rtol=1e-4, atol=1e-4)


def test_anisotropy_of_identical_and_random_vectors():
    contexts = np.repeat(np.arange(50), 4)
    same = np.tile(np.random.default_rng(0).normal(size=(1, 64)), (200, 1))
    assert geometry.anisotropy(same, contexts) == pytest.approx(1.0)
    noise = np.random.default_rng(1).normal(size=(200, 64))
    assert abs(geometry.anisotropy(noise, contexts)) < 0.02
    shared = noise + 5 * np.ones(64)  # one common direction: anisotropic...
    assert geometry.anisotropy(shared, contexts) > 0.9
    # ...until it is removed (Mu & Viswanath) or the dimensions standardized.
    assert abs(geometry.anisotropy(geometry.centered(shared), contexts)) < 0.02
    assert abs(geometry.anisotropy(geometry.standardized(shared), contexts)) < 0.02
    rogue = noise.copy()
    rogue[:, 0] += np.random.default_rng(2).choice([-30.0, 30.0], size=200)
    assert geometry.top_component_share(geometry.centered(rogue)) > 0.8
    assert geometry.top_component_share(geometry.without_top_components(rogue, 1)) < 0.2


def test_self_and_intra_sentence_similarity():
    rng = np.random.default_rng(0)
    words = ["a", "b", "c"] * 6
    contexts = np.repeat(np.arange(6), 3)
    table = {w: rng.normal(size=16) for w in "abc"}
    static = np.stack([table[w] for w in words])  # a word has one vector in every context
    assert geometry.self_similarity(static, words, contexts, min_contexts=5) == pytest.approx(1.0)
    contextual = rng.normal(size=(18, 16))
    assert geometry.self_similarity(contextual, words, contexts, min_contexts=5) < 0.2
    with pytest.raises(ValueError, match="contexts"):
        geometry.self_similarity(static, words, contexts, min_contexts=7)
    one_per_sentence = np.repeat(rng.normal(size=(6, 16)), 3, axis=0)
    assert geometry.intra_sentence_similarity(one_per_sentence, contexts) == pytest.approx(1.0)
    assert geometry.intra_sentence_similarity(contextual, contexts) < 0.8


def test_probe_beats_the_majority_baseline_on_separable_data():
    rng = np.random.default_rng(0)
    labels = rng.choice(["NOUN", "VERB", "DET"], p=[0.5, 0.3, 0.2], size=600)
    centres = {"NOUN": 0.0, "VERB": 3.0, "DET": -3.0}
    x = rng.normal(size=(600, 2, 8))
    x[:, 1, 0] += [centres[t] for t in labels]  # layer 1 encodes the tag, layer 0 does not
    accuracy = probes.probe_by_layer(x[:400], labels[:400], x[400:], labels[400:])
    majority = probes.majority_baseline(labels[:400], labels[400:])
    assert accuracy[1] > 0.9 > majority + 0.3
    assert accuracy[0] < majority + 0.1
    words = ["the" if t == "DET" else "run" if t == "VERB" else "cat" for t in labels]
    assert probes.word_form_baseline(words[:400], labels[:400], words[400:], labels[400:]) == 1.0


def test_bad_input_exits_2_with_the_fix(checkpoints, input_txt, tmp_path, capsys):
    base = [f"--checkpoint={checkpoints['encoder']}", f"--output={tmp_path / 'o'}"]
    assert embed.main(base + [f"--input_file={tmp_path / 'missing.txt'}"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert embed.main(base + [f"--input_file={input_txt}", "--layers=middle"]) == 2
    assert "--layers=middle: expected all, last, or a comma list" in capsys.readouterr().err
    assert embed.main(base + [f"--input_file={input_txt}", "--layers=0,7"]) == 2
    assert "layer 7 does not exist; this model has layers 0..2" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    assert embed.main(base + [f"--input_file={bad}"]) == 2
    assert 'bad.jsonl:2 needs a non-empty "text" string' in capsys.readouterr().err
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n")
    assert embed.main(base + [f"--input_file={csv}"]) == 2
    assert "expected a .txt or .jsonl file" in capsys.readouterr().err
