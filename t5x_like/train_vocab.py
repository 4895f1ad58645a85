"""Trains the embedded SentencePiece vocabularies, deterministically.

    python -m t5x_like.train_vocab            # rewrites data/vocab/embedded_en_8k.model
    python -m t5x_like.train_vocab --multilingual   # data/vocab/multilingual_8k.model

Only the ``train`` split is read, so held-out text never shapes the tokenizer.
One thread, no sampling inside SentencePiece and no shuffling make two runs
byte-identical.

``--multilingual`` trains on English, Spanish, Japanese and the UDHR languages
with XLM-R's temperature sampling over the sources: source i, holding a share
p_i of the characters, gets a share q_i = p_i^α / Σ_j p_j^α of the input text
(α = ``--alpha``, 0.3 as XLM-R; α = 1 keeps the natural shares, α -> 0 makes
them uniform). A source whose share exceeds its text is repeated (its lines in
a seeded order, cycled); a larger one is cut. So Japanese and the UDHR
languages, small next to the English corpus, still win pieces. mBART's
language-id tokens (``en_XX``, ...) are added as user-defined pieces.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
import sentencepiece as spm

from t5x_like.builtin_tasks import multilingual as multilingual_tasks
from t5x_like.data import dataset_providers, embedded, sources, vocabularies

MULTILINGUAL_MODEL = multilingual_tasks.VOCAB_MODEL
MULTILINGUAL_ALPHA = 0.3
MULTILINGUAL_BUDGET_CHARS = 6_000_000
LANGUAGE_TOKENS = multilingual_tasks.LANGUAGE_TOKENS  # mBART's language ids, user-defined pieces


def train_sentencepiece(documents: list[str], vocab_size: int, model_type: str = "unigram",
                        character_coverage: float = 1.0,
                        extra_symbols: Sequence[str] = ()) -> bytes:
    """Returns the serialized model; pieces 0..3 are pad, eos, unk, bos, then [MASK],
    [CLS], [SEP] and ``extra_symbols`` (user-defined: always one piece each)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(documents),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=vocabularies.PAD_ID,
        eos_id=vocabularies.EOS_ID,
        unk_id=vocabularies.UNK_ID,
        bos_id=vocabularies.BOS_ID,
        user_defined_symbols=list(vocabularies.SPECIAL_PIECES) + list(extra_symbols),
        byte_fallback=True,              # no <unk> for unseen characters
        split_digits=True,
        max_sentence_length=1 << 16,     # keep long Austen paragraphs
        input_sentence_size=0,           # use every sentence: no sampling
        shuffle_input_sentence=False,
        num_threads=1,                   # float sums in a fixed order
        minloglevel=2,
    )
    return model.getvalue()


# -- temperature sampling over sources ------------------------------------------------------

def _source_seed(name: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")


def temperature_sample(texts: Mapping[str, Sequence[str]], alpha: float, budget_chars: int,
                       seed: int = 0) -> tuple[list[str], dict[str, dict]]:
    """Lines of every source, source i taking about q_i * ``budget_chars`` characters
    (its lines in a seeded order, cycled when it must repeat). Returns the lines
    (sources in name order) and per source: chars, p, q, sampled chars and repeats."""
    sizes = {name: sum(len(line) for line in lines) for name, lines in texts.items()}
    shares = dataset_providers.temperature_probabilities(sizes, 1.0)
    rates = dataset_providers.temperature_probabilities(sizes, alpha)
    out: list[str] = []
    report: dict[str, dict] = {}
    for name in sorted(texts):
        lines = [line for line in texts[name] if line]
        order = np.random.default_rng(_source_seed(name, seed)).permutation(len(lines))
        target = rates[name] * budget_chars
        taken = 0
        i = 0
        while taken < target and lines:
            line = lines[order[i % len(lines)]]
            out.append(line)
            taken += len(line)
            i += 1
        report[name] = {"chars": sizes[name], "p": shares[name], "q": rates[name],
                        "sampled_chars": taken, "repeats": taken / max(sizes[name], 1)}
    return out, report


def multilingual_texts() -> dict[str, list[str]]:
    """Train-split lines per source: the English corpus, the Spanish and Japanese Bibles,
    and the UDHR translations (all languages as one source; each has ~3,000 characters)."""
    texts = {"en": sources.TextLineSource(embedded.english_files(), split="train").documents()}
    for language in ("es", "ja"):
        texts[language] = sources.TextLineSource([embedded.multilingual_bible(language)],
                                                 split="train").documents()
    udhr = sources.JsonlSource((embedded.udhr_path(),), holdout_every=10).get("train")
    texts["udhr"] = [line.strip() for record in udhr for line in record["text"].split("\n")
                     if line.strip()]
    return texts


def _write(out: pathlib.Path, blob: bytes) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=None,
                        help="Default: data/vocab/embedded_en_8k.model, or "
                             "data/vocab/multilingual_8k.model with --multilingual.")
    parser.add_argument("--vocab_size", type=int, default=embedded.SENTENCEPIECE_SIZE,
                        help="SentencePiece pieces; sentinels are added on top.")
    parser.add_argument("--multilingual", action="store_true",
                        help="English, Spanish, Japanese and UDHR, temperature-sampled.")
    parser.add_argument("--alpha", type=float, default=MULTILINGUAL_ALPHA,
                        help="Temperature exponent over the sources (with --multilingual).")
    parser.add_argument("--budget_chars", type=int, default=MULTILINGUAL_BUDGET_CHARS,
                        help="Characters of sampled text (with --multilingual).")
    parser.add_argument("--character_coverage", type=float, default=None,
                        help="Default 1.0 (English), 0.9995 with --multilingual (rare "
                             "characters fall back to byte pieces).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.multilingual:
        lines, report = temperature_sample(multilingual_texts(), args.alpha, args.budget_chars,
                                           args.seed)
        for name, row in report.items():
            print(f"{name:5s} chars {row['chars']:>10,}  p {row['p']:.4f}  q {row['q']:.4f}  "
                  f"sampled {row['sampled_chars']:>10,}  x{row['repeats']:.2f}")
        blob = train_sentencepiece(lines, args.vocab_size,
                                   character_coverage=args.character_coverage or 0.9995,
                                   extra_symbols=tuple(LANGUAGE_TOKENS.values()))
        default = embedded.data_dir() / MULTILINGUAL_MODEL
    else:
        documents = sources.TextLineSource(embedded.english_files(), split="train").documents()
        blob = train_sentencepiece(documents, args.vocab_size,
                                   character_coverage=args.character_coverage or 1.0)
        default = embedded.data_dir() / embedded.VOCAB_MODEL
    out = pathlib.Path(args.output or default)
    _write(out, blob)
    print(f"wrote {out} ({args.vocab_size} pieces, sha256 {hashlib.sha256(blob).hexdigest()})")


if __name__ == "__main__":
    main()
