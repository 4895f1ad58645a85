"""Geometry of our pretrained BERT, GPT-2 and T5 encoder, layer by layer, beside
random-init controls of the same configs: anisotropy, self-similarity and
intra-sentence similarity (Ethayarajh 2019), the effect of centering, standardizing and
removing top principal components (Mu & Viswanath 2018), and UPOS linear probes
(Tenney et al. 2019). Prints a table per analysis; writes a PNG per analysis.

    .venv/bin/python -m t5x_like.train --config=configs/pretrain/bert_tiny.py --workdir=runs/pt_bert
    .venv/bin/python -m t5x_like.train --config=configs/pretrain/gpt2_tiny.py --workdir=runs/pt_gpt2
    .venv/bin/python -m t5x_like.train --config=configs/pretrain/t5_tiny.py --workdir=runs/pt_t5
    .venv/bin/python benchmarks/embedding_geometry.py --runs=runs --images=docs/images/embeddings
    .venv/bin/python benchmarks/embedding_geometry.py --smoke   # tiny: a check that it runs

Texts (fixed, seeded): ``--corpus_sentences`` sentences of the embedded corpus's
validation documents and ``--ud_geometry`` sentences of UD EWT dev (the analyses of
geometry), ``--probe_train`` sentences of UD EWT train and ``--probe_test`` of UD EWT
test (the probes; the embedded_ud_pos task's splits and order). Each model embeds them
all once through ``t5x_like.embed``'s code (``analysis.extraction``), into a
scratch folder; word vectors are the mean of each word's subwords.

``--smoke``: tiny pretraining runs (2 steps, 32 wide) made in a temporary ``--runs``
unless it holds them, 10 sentences of each set (5 probe test), the random-init control of
the last model only (every control loads and embeds through the same code), PNGs into a
temporary folder unless ``--images`` is given: a check that the script runs.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import re
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from t5x_like.analysis import geometry, probes  # noqa: E402

MODELS = {"BERT": "pt_bert", "GPT-2": "pt_gpt2", "T5 encoder": "pt_t5"}
RANDOM = " (random init)"
WORD_VECTORS = "mean"


def corpus_sentences(count: int, seed: int = 0) -> list[str]:
    """Sentences of 8-40 words from the embedded corpus's validation documents (verse
    references dropped), a seeded sample."""
    from t5x_like.builtin_tasks import pretraining as tasks
    sentences = []
    for document in tasks.embedded_en_documents("validation"):
        body = document.split("\t")[-1]
        for sentence in re.split(r"(?<=[.!?])\s+", body):
            if 8 <= len(sentence.split()) <= 40:
                sentences.append(sentence)
    random.Random(seed).shuffle(sentences)
    return sentences[:count]


def ud_sentences(split: str, count: int) -> list[dict]:
    """The embedded_ud_pos task's examples of ``split`` (its fixed order): words, tags."""
    from t5x_like.builtin_tasks import bench as bench_tasks
    examples = bench_tasks.ud_pos_examples(bench_tasks._ud_paths())[split]
    return [{"words": ex["words"], "tags": ex["tags"]} for ex in examples[:count]]


def inputs(args) -> tuple[list, dict]:
    """All texts as ``TextInput``s (ids say which set) and the UPOS tags by text id."""
    from t5x_like.analysis.extraction import TextInput
    items = [TextInput(f"corpus:{i}", s, tuple(s.split()))
             for i, s in enumerate(corpus_sentences(args.corpus_sentences))]
    tags = {}
    for name, split, count in (("ud_geometry", "validation", args.ud_geometry),
                               ("probe_train", "train", args.probe_train),
                               ("probe_test", "test", args.probe_test)):
        for i, ex in enumerate(ud_sentences(split, count)):
            items.append(TextInput(f"{name}:{i}", " ".join(ex["words"]), tuple(ex["words"])))
            tags[f"{name}:{i}"] = ex["tags"]
    return items, tags


def embed_all(label: str, checkpoint: pathlib.Path, items, folder: pathlib.Path,
              random_init: bool):
    from t5x_like.analysis import embedding_files, extraction, hidden_states
    model = hidden_states.load(str(checkpoint), random_init=random_init)
    layers = list(range(model.num_layers + 1))
    started = time.time()
    extraction.embed_to_folder(model, items, folder, layers=layers, batch_size=64, tokens=False)
    print(f"  {label}: {model.stack}, {model.num_layers} layers, "
          f"{time.time() - started:.1f}s to embed {len(items)} texts", flush=True)
    return embedding_files.Embeddings(folder)


def word_rows(embeddings, prefixes: tuple[str, ...]) -> np.ndarray:
    """Rows of ``words_*.npy`` whose text id starts with one of ``prefixes``."""
    rows = []
    for record in embeddings.index:
        if str(record["id"]).startswith(prefixes):
            rows.extend(range(record["word_start"], record["word_start"] + len(record["words"])))
    return np.asarray(rows, np.int64)


def word_tags(embeddings, tags: dict, prefix: str) -> list[str]:
    """The tags of the rows ``word_rows(embeddings, (prefix,))`` (a text cut to the
    model's positions keeps the tags of the words it kept)."""
    return [tag for record in embeddings.index if str(record["id"]).startswith(prefix)
            for tag in tags[record["id"]][:len(record["words"])]]


# Post-processing of one layer's vectors: (vectors, top_k) -> vectors.
TREATMENTS = {"raw": lambda v, k: v,
              "centered": lambda v, k: geometry.centered(v),
              "standardized": lambda v, k: geometry.standardized(v),
              "all_but_top": lambda v, k: geometry.without_top_components(v, k)}


def analyse(embeddings, tags: dict, top_k: int) -> dict:

    vectors = np.asarray(embeddings.words(WORD_VECTORS), np.float64)
    words = embeddings.word_texts()
    contexts = embeddings.word_text_index()
    rows = word_rows(embeddings, ("corpus:", "ud_geometry:"))
    rows = rows[np.isfinite(vectors[rows]).all(axis=(1, 2))]
    forms = [words[r] if words[r].isalpha() else "" for r in rows]
    counted = np.asarray([bool(f) for f in forms])
    result = {name: [] for name in ("anisotropy", "self_similarity", "intra_sentence")}
    for treatment in TREATMENTS:
        result[f"anisotropy_{treatment}"], result[f"top_share_{treatment}"] = [], []
    for k in range(vectors.shape[1]):
        layer, ctx = vectors[rows, k], contexts[rows]
        base = geometry.anisotropy(layer, ctx)
        result["anisotropy"].append(base)
        result["self_similarity"].append(geometry.self_similarity(
            layer[counted], [f for f in forms if f], ctx[counted]) - base)
        result["intra_sentence"].append(geometry.intra_sentence_similarity(layer, ctx) - base)
        for treatment, transform in TREATMENTS.items():
            treated = transform(layer, top_k)
            result[f"anisotropy_{treatment}"].append(geometry.anisotropy(treated, ctx))
            result[f"top_share_{treatment}"].append(geometry.top_component_share(treated))
    train, test = word_rows(embeddings, ("probe_train:",)), word_rows(embeddings, ("probe_test:",))
    result["probe"] = probes.probe_by_layer(vectors[train], word_tags(embeddings, tags, "probe_train:"),
                                            vectors[test], word_tags(embeddings, tags, "probe_test:"))
    result["num_layers"] = vectors.shape[1] - 1
    return result


def baselines(embeddings, tags: dict) -> dict:
    words = embeddings.word_texts()
    train = [words[r] for r in word_rows(embeddings, ("probe_train:",))]
    test = [words[r] for r in word_rows(embeddings, ("probe_test:",))]
    train_tags = word_tags(embeddings, tags, "probe_train:")
    test_tags = word_tags(embeddings, tags, "probe_test:")
    return {"majority": probes.majority_baseline(train_tags, test_tags),
            "word_form": probes.word_form_baseline(train, train_tags, test, test_tags),
            "train_words": len(train), "test_words": len(test)}


TREATMENT_TITLES = {"raw": "raw", "centered": "centered (mean vector removed)",
                    "standardized": "standardized (centered, unit variance per dimension)",
                    "all_but_top": "all-but-the-top (centered, top {k} PCs removed)"}
TABLES = ([("anisotropy", "Anisotropy (mean cosine of random word pairs from different sentences)"),
           ("self_similarity", "Self-similarity, minus anisotropy"),
           ("intra_sentence", "Intra-sentence similarity, minus anisotropy")]
          + [(f"anisotropy_{t}", f"Anisotropy, {title}") for t, title in TREATMENT_TITLES.items()
             if t != "raw"]
          + [(f"top_share_{t}", f"Top-direction share of the second moment, {title}")
             for t, title in TREATMENT_TITLES.items()]
          + [("probe", "UPOS linear probe accuracy (UD EWT test words)")])


def print_tables(results: dict, top_k: int) -> None:
    depth = max(r["num_layers"] for r in results.values())
    for key, title in TABLES:
        print(f"\n{title.format(k=top_k)}\n")
        print("| model | " + " | ".join(f"layer {k}" for k in range(depth + 1)) + " |")
        print("|---|" + "---:|" * (depth + 1))
        for name, result in results.items():
            cells = [f"{v:.3f}" for v in result[key]] + ["–"] * (depth - result["num_layers"])
            print(f"| {name} | " + " | ".join(cells) + " |")


def write_plots(results: dict, base: dict, images: pathlib.Path, top_k: int,
                d_model: int) -> None:
    from t5x_like.analysis import plots
    images.mkdir(parents=True, exist_ok=True)
    curves = lambda key: {name: r[key] for name, r in results.items()}  # noqa: E731
    plots.layer_curves(images / "anisotropy.png", curves("anisotropy"),
                       title="Anisotropy by layer (random word pairs, different sentences)",
                       ylabel="mean cosine similarity")
    plots.layer_curves(images / "self_similarity.png", curves("self_similarity"),
                       title="Self-similarity of a word across contexts (minus anisotropy)",
                       ylabel="adjusted self-similarity")
    plots.layer_curves(images / "intra_sentence_similarity.png", curves("intra_sentence"),
                       title="Intra-sentence similarity (minus anisotropy)",
                       ylabel="adjusted intra-sentence similarity")
    names = {t: title.split(" (")[0].replace("all-but-the-top", f"all-but-top-{top_k}")
             for t, title in TREATMENT_TITLES.items()}
    plots.panels(images / "postprocessing.png",
                 {names[t]: curves(f"top_share_{t}") for t in TREATMENT_TITLES},
                 title="Share of the second moment on the top direction, before and after "
                       "post-processing (isotropic: 1/d)",
                 ylabel="top-direction share", size=(10, 4.5),
                 hlines={"isotropic (1/d)": (1 / d_model, "grey")})
    plots.layer_curves(images / "pos_probe.png", curves("probe"),
                       title="UPOS linear probe accuracy by layer (UD EWT)",
                       ylabel="test accuracy",
                       hlines={f"majority tag ({base['majority']:.3f})": (base["majority"], "grey"),
                               f"word-form lookup ({base['word_form']:.3f})":
                                   (base["word_form"], "black")})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="")
    parser.add_argument("--images", default="")
    parser.add_argument("--models", default=",".join(MODELS), help="Comma list of " + ", ".join(MODELS))
    parser.add_argument("--no_random", action="store_true", help="Skip the random-init controls.")
    parser.add_argument("--corpus_sentences", type=int, default=1000)
    parser.add_argument("--ud_geometry", type=int, default=1000)
    parser.add_argument("--probe_train", type=int, default=1000)
    parser.add_argument("--probe_test", type=int, default=500)
    parser.add_argument("--results", default="", help="Also write the numbers as JSON here.")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny runs and few sentences: a check that the script runs")
    args = parser.parse_args(argv)
    if not args.smoke:
        return report(args, args.runs or "runs", args.images or "docs/images/embeddings")
    import _smoke
    _smoke.IN_PROCESS = True
    args.corpus_sentences = args.ud_geometry = args.probe_train = 10
    args.probe_test = 5
    args.random_models = args.models.split(",")[-1:]
    with tempfile.TemporaryDirectory(prefix="embedding_geometry_smoke_") as scratch:
        runs = pathlib.Path(args.runs or scratch)
        for name in args.models.split(","):
            _smoke.pretrained(runs, MODELS[name])
        return report(args, str(runs), args.images or str(pathlib.Path(scratch) / "images"))


def report(args, runs: str, images: str) -> int:
    """Embeds the texts with each model of ``runs``, prints the tables, draws the PNGs."""

    started = time.time()
    items, tags = inputs(args)
    print(f"{len(items)} texts: {args.corpus_sentences} corpus + {args.ud_geometry} UD dev "
          f"sentences (geometry), {args.probe_train} UD train / {args.probe_test} UD test "
          "sentences (probes)", flush=True)
    results, base = {}, None
    # The models with a random-init control (--smoke: the last one).
    controlled = getattr(args, "random_models", args.models.split(","))
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            checkpoint = pathlib.Path(runs) / MODELS[name]
            for random_init in ([False] if args.no_random or name not in controlled
                                else [False, True]):
                label = name + (RANDOM if random_init else "")
                folder = pathlib.Path(scratch) / re.sub(r"\W+", "_", label)
                embeddings = embed_all(label, checkpoint, items, folder, random_init)
                top_k = math.ceil(embeddings.meta["d_model"] / 100)
                analysis_started = time.time()
                results[label] = analyse(embeddings, tags, top_k)
                base = base or baselines(embeddings, tags)
                print(f"  {label}: analyses {time.time() - analysis_started:.1f}s", flush=True)
    print(f"\nprobe words: {base['train_words']} train, {base['test_words']} test; "
          f"majority-tag baseline {base['majority']:.3f}, word-form baseline {base['word_form']:.3f}")
    print_tables(results, top_k)
    write_plots(results, base, pathlib.Path(images), top_k, embeddings.meta["d_model"])
    if args.results:
        pathlib.Path(args.results).write_text(json.dumps({"results": results, "baselines": base},
                                                         indent=1))
    print(f"\nPNGs in {images}; total {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
