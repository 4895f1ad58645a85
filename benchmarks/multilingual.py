"""Multilingual pretraining tables (docs/multilingual.md): sampling rates, the vocabulary,
translation after mBART pretraining, language id with XLM-R features.

    python benchmarks/multilingual.py rates                 # q_i at α = 1, 0.7, 0.3; drawn shares
    python benchmarks/multilingual.py vocab [--alpha1_vocab runs/ml/multilingual_alpha1.model]
    python benchmarks/multilingual.py results --runs runs/ml  # BLEU/chrF, langid from eval runs
    python benchmarks/multilingual.py retarget --run=runs/pt_mbart --language=es --out=runs/pt_mbart_es
    python benchmarks/multilingual.py --smoke   # all four, tiny: a check that they run

``rates`` compares, per language, the formula q_i = p_i^α / Σ p_j^α (p_i: the
language's share of the train split's characters) with the mixture's own rates
and with the share of ``--draw`` examples drawn from it (masked-LM tasks).
``vocab`` tokenizes each language's validation text with the English 8k vocabulary,
the multilingual one (α = 0.3) and, if given, one trained with α = 1
(``python -m t5x_like.train_vocab --multilingual --alpha=1 --output=...``).
``results`` reads ``<runs>/<name>/eval/metrics.jsonl`` written by ``t5x_like.eval``
for the runs named in docs/multilingual.md.

``--smoke``: every subcommand (or the one named) at tiny sizes, a check that the script
runs: ``rates`` drawing 40 examples per α, ``vocab`` on each language's first 20
validation texts, ``results`` reading what ``--runs`` holds (a temporary folder: no runs),
and ``retarget`` of a tiny mBART pretraining run (2 steps, 1 + 1 layers, 32 wide, no
held-out evaluation: ``retarget`` reads only its params) made there.
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import json
import pathlib

from t5x_like.builtin_tasks import multilingual as multilingual_tasks
from t5x_like.builtin_tasks import pretraining as builtin_tasks
from t5x_like.data import MixtureRegistry, TaskRegistry, vocabularies
from t5x_like.data import preprocessors as pp
from t5x_like.data.dataset_providers import Feature

LANGS = multilingual_tasks.LANGUAGES


def characters(split: str = "train") -> dict[str, int]:
    return {lang: sum(len(ex["text"]) for ex in multilingual_tasks.language_source(lang).get(split))
            for lang in LANGS}


def _tag(language, example, rng=None):
    return {"targets": example["text"][:64], "language": language}


def rates_table(draw: int) -> None:
    """The mixture's rates are the masked-LM mixture's (``character_temperature_rates``
    over the same sources); the draw mixes per-language tasks that only tag each
    document with its language, so the drawn shares measure the sampling itself."""
    chars = characters()
    total = sum(chars.values())
    tagged = []
    for lang in LANGS:
        name = f"_bench_tagged_{lang}"
        TaskRegistry.remove(name)
        TaskRegistry.add(name, multilingual_tasks.language_source(lang),
                         [pp.FunctionStep(functools.partial(_tag, lang))],
                         {"targets": Feature(vocabularies.ByteVocabulary(), add_eos=False)})
        tagged.append(name)
    print("| language | characters | p_i | α | q_i (formula) | q_i (mixture) | drawn share |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = [f"multilingual_{lang}_mlm" for lang in LANGS]
    for alpha in (1.0, 0.7, 0.3):
        powered = {lang: (chars[lang] / total) ** alpha for lang in LANGS}
        formula = {lang: v / sum(powered.values()) for lang, v in powered.items()}
        MixtureRegistry.remove("_bench_mlm")
        rates = MixtureRegistry.add("_bench_mlm", multilingual_tasks.character_temperature_rates(
            names, alpha)).leaf_rates("train")
        drawn = collections.Counter()
        if draw:
            MixtureRegistry.remove("_bench_tagged")
            mixture = MixtureRegistry.add("_bench_tagged", multilingual_tasks.character_temperature_rates(
                tagged, alpha, size_fn=lambda task, split: chars[task.rsplit("_", 1)[1]]))
            for ex in itertools.islice(mixture.get_dataset("train", {"targets": 64}, seed=0), draw):
                drawn[ex["language"]] += 1
        for lang in LANGS:
            share = f"{drawn[lang] / draw:.4f}" if draw else "-"
            print(f"| {lang} | {chars[lang]:,} | {chars[lang] / total:.4f} | {alpha} | "
                  f"{formula[lang]:.4f} | {rates[f'multilingual_{lang}_mlm']:.4f} | {share} |")
    MixtureRegistry.remove("_bench_mlm")
    MixtureRegistry.remove("_bench_tagged")


def vocab_table(alpha1_vocab: str | None, texts_per_language: int | None = None) -> None:
    vocabs = {"English 8k": builtin_tasks.embedded_vocabulary(),
              "multilingual 8k (α = 0.3)": multilingual_tasks.multilingual_vocabulary()}
    if alpha1_vocab:
        vocabs["multilingual 8k (α = 1)"] = vocabularies.SentencePieceVocabulary(alpha1_vocab)
    texts = {lang: [ex["text"] for ex in multilingual_tasks.language_source(lang).get("validation")
                    ][:texts_per_language] for lang in LANGS}
    print("| language | vocabulary | tokens per character | byte-fallback tokens | "
          "pieces used |")
    print("| --- | --- | ---: | ---: | ---: |")
    for lang in LANGS:
        chars = sum(len(t) for t in texts[lang])
        for name, vocab in vocabs.items():
            ids = [i for t in texts[lang] for i in vocab.encode(t)]
            byte_share = sum(vocab._sp.is_byte(i) for i in ids) / len(ids)
            print(f"| {lang} | {name} | {len(ids) / chars:.3f} | {100 * byte_share:.1f} % | "
                  f"{len(set(ids)):,} |")


def _metrics(path: pathlib.Path, split: str) -> dict | None:
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("split") == split]
    return rows[-1] if rows else None


RUNS = {"translation": [("en -> es", "mbart_en_es", "rand_en_es"),
                        ("es -> en", "mbart_es_en", "rand_es_en")],
        "langid": [("UDHR language id (435)", "xlmr_langid", "rand_langid")]}


def results_table(runs: pathlib.Path, split: str) -> None:
    print("| task | init | metric | value | step |")
    print("| --- | --- | --- | ---: | ---: |")
    for kind, rows in RUNS.items():
        for label, pretrained, random_init in rows:
            name = "mBART tiny" if kind == "translation" else "XLM-R tiny"
            for init, run in ((name, pretrained),
                              ("random", random_init)):
                m = _metrics(runs / run / "eval" / "metrics.jsonl", split)
                if m is None:
                    print(f"| {label} | {init} | (no run at {runs / run}) | | |")
                    continue
                for key, value in m.items():
                    if key in ("step", "task", "split"):
                        continue
                    print(f"| {label} | {init} | {key} | {value:.2f} | {m['step']} |")


def retarget(run: str, language: str, out: str) -> None:
    """A params-only folder of ``run``'s newest step whose model decodes from ``language``'s
    id (``decoder_start_id``): ``train`` refuses an ``init_from`` whose model keys differ
    from the config's, and this key differs between pretraining (never decodes) and each
    translation direction. Parameters are unchanged."""
    from t5x_like import resolving
    from t5x_like.checkpoints import param_sources, pretrained
    from t5x_like.engine import partitioning

    source = param_sources.resolve(run)
    step = source.steps()[-1]
    config = resolving.resolve_checkpoint(source, step).spec
    import jax
    mesh = partitioning.make_mesh({"data": 1}, jax.devices()[:1])  # host arrays: one device
    params, _ = param_sources.base_params(run, config, mesh)
    model_config = dict(config.model.to_dict(),
                        decoder_start_id=multilingual_tasks.language_id(language))
    pretrained.save_pretrained(out, model_config, params,
                               vocabulary=multilingual_tasks.multilingual_vocabulary())
    print(f"wrote {out}: {run} step {step}, decoder_start_id {model_config['decoder_start_id']}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", nargs="?", choices=("rates", "vocab", "results", "retarget"),
                        help="required but in --smoke")
    parser.add_argument("--draw", type=int, default=2000,
                        help="rates: examples drawn per α (0: none)")
    parser.add_argument("--alpha1_vocab", default=None)
    parser.add_argument("--runs", default="runs/ml")
    parser.add_argument("--split", default="test")
    parser.add_argument("--run", help="retarget: the pretraining workdir")
    parser.add_argument("--language", help="retarget: the target language (en, es)")
    parser.add_argument("--out", help="retarget: the params-only folder to write")
    parser.add_argument("--smoke", action="store_true",
                        help="every subcommand, tiny: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(args)
    if args.table is None:
        parser.error("name a table: rates, vocab, results or retarget")
    if args.table == "retarget":
        return retarget(args.run, args.language, args.out)
    if args.table == "rates":
        rates_table(args.draw)
    elif args.table == "vocab":
        vocab_table(args.alpha1_vocab)
    else:
        results_table(pathlib.Path(args.runs), args.split)


# --smoke's mBART: the recipe's model, 1 + 1 layers, 32 wide, on 16-token rows.
SMOKE_MBART = ["--config.model.d_model=32", "--config.model.num_heads=2",
               "--config.model.head_dim=16", "--config.model.d_ff=64",
               "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
               "--config.task_feature_lengths.inputs=16", "--config.task_feature_lengths.targets=16"]


def smoke(args) -> None:
    """Each subcommand (``args.table``, or all four) at tiny sizes, in a temporary folder."""
    import tempfile

    import _smoke
    _smoke.IN_PROCESS = True
    tables = [args.table] if args.table else ["rates", "vocab", "results", "retarget"]
    with tempfile.TemporaryDirectory(prefix="multilingual_smoke_") as scratch:
        if "rates" in tables:
            rates_table(40)
        if "vocab" in tables:
            vocab_table(args.alpha1_vocab, texts_per_language=20)
        if "results" in tables:
            results_table(pathlib.Path(scratch), args.split)
        if "retarget" in tables:
            run = _smoke.pretrain(pathlib.Path(scratch) / "pt_mbart",
                                  "configs/pretrain/mbart_tiny.py", *SMOKE_MBART,
                                  _smoke.NO_HELD_OUT)
            retarget(str(run), "es", str(pathlib.Path(scratch) / "pt_mbart_es"))


if __name__ == "__main__":
    main()
