"""Trains the embedded SentencePiece vocabulary, deterministically.

    python -m t5x_like.data.train_vocab            # rewrites data/vocab/embedded_en_8k.model

Only the ``train`` split is read, so held-out text never shapes the tokenizer.
One thread, no sampling and no shuffling make two runs byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import pathlib

import sentencepiece as spm

from t5x_like.data import embedded, sources, vocabularies


def train_sentencepiece(documents: list[str], vocab_size: int, model_type: str = "unigram",
                        character_coverage: float = 1.0) -> bytes:
    """Returns the serialized model; pieces 0..3 are pad, eos, unk, bos."""
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
        user_defined_symbols=list(vocabularies.SPECIAL_PIECES),
        byte_fallback=True,              # no <unk> for unseen characters
        split_digits=True,
        max_sentence_length=1 << 16,     # keep long Austen paragraphs
        input_sentence_size=0,           # use every sentence: no sampling
        shuffle_input_sentence=False,
        num_threads=1,                   # float sums in a fixed order
        minloglevel=2,
    )
    return model.getvalue()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(embedded.data_dir() / embedded.VOCAB_MODEL))
    parser.add_argument("--vocab_size", type=int, default=embedded.SENTENCEPIECE_SIZE,
                        help="SentencePiece pieces; sentinels are added on top.")
    args = parser.parse_args(argv)
    documents = sources.TextLineSource(embedded.english_files(), split="train").documents()
    blob = train_sentencepiece(documents, args.vocab_size)
    out = pathlib.Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, out)
    print(f"wrote {out} ({args.vocab_size} pieces, sha256 {hashlib.sha256(blob).hexdigest()})")


if __name__ == "__main__":
    main()
