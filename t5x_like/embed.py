"""Contextual embeddings from every layer of a checkpoint, per token, per word and pooled.

    python -m t5x_like.embed --checkpoint=runs/pt_bert --input_file=sentences.txt \\
        --layers=all --output=runs/pt_bert_embeddings

``--input_file``: ``.txt`` (one text per non-blank line) or ``.jsonl`` (one object per
line with a ``text`` string, or a ``words`` list for pre-split text such as UD
treebanks; an optional ``id``). Words are the text split on whitespace; each word's
subword tokens are known exactly (``analysis.alignment``).

``--layers``: ``all``, ``last`` or a comma list such as ``0,2,-1``. Layer 0 is the
embedding output, layer k the output of block k (before any final norm). Encoders
read ``[CLS] text [SEP]``, decoders ``EOS text``; encoder-decoders (T5, BART) give
their encoder's layers, of ``text EOS``; ELECTRA its discriminator's.

``--output`` gets (``analysis.embedding_files``):

    meta.json                 checkpoint, step, family, stack, layers, d_model, framing, counts
    index.jsonl               per text: id, text, words, token_ids, pieces, text_span,
                              word_spans, token_start, word_start, truncated
    layer_<k>.tokens.npy      [N_tokens, d] all positions of all inputs, in input order
    pooled_mean.npy           [N_texts, n_layers, d] mean over the text's own tokens
    pooled_first.npy          [N_texts, n_layers, d] position 0: [CLS] for BERT; for a
                              decoder the EOS before the text, the same for every text
    pooled_last.npy           [N_texts, n_layers, d] the text's last token: for a decoder
                              the only one that has read the whole text
    words_first.npy           [N_words, n_layers, d] each word's first subword
    words_mean.npy            [N_words, n_layers, d] mean of each word's subwords

``--random_init`` embeds with fresh parameters of the checkpoint's config (the
untrained control of the geometry analyses, docs/embeddings.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from t5x_like import cli_flags, errors
from t5x_like.errors import UserError
from t5x_like.system import storage

# Imports inside functions: keep JAX out of the command's start-up: a mistake in the config or
# the flags is reported before JAX loads.

LAYERS_HELP = "all, last, or a comma list of layer numbers (0 = embeddings, -1 = last)"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m t5x_like.embed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True,
                        help="Training workdir, checkpoint step folder or pretrained folder.")
    parser.add_argument("--input_file", required=True, help=".txt or .jsonl")
    parser.add_argument("--output", required=True, help="Folder for the arrays and index.")
    parser.add_argument("--layers", default="all", help=LAYERS_HELP)
    parser.add_argument("--step", type=int, default=None, help="Default: the newest.")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    parser.add_argument("--no_tokens", action="store_true",
                        help="Skip the per-token layer_<k>.tokens.npy arrays (pooled and "
                             "word arrays only).")
    parser.add_argument("--max_texts", type=int, default=0, help="0: all.")
    parser.add_argument("--random_init", action="store_true",
                        help="Fresh parameters of the checkpoint's config (untrained control).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of --random_init.")
    parser.add_argument("--vocabulary", default="",
                        help="Tokenizer: default the checkpoint's own; or a tokenizer folder, "
                             "tokenizer.json or .model path.")
    parser.add_argument("--overwrite", action="store_true",
                        help="Write into a non-empty --output folder.")
    return parser.parse_args(argv)


def read_inputs(path: str):
    """``TextInput``s of a .txt or .jsonl file, refused with the line at fault."""
    from t5x_like.analysis.extraction import TextInput

    file = storage.path(path)
    if not file.is_file():
        raise UserError(f"--input_file={path}: no such file. Pass a .txt file (one text per "
                        "line) or a .jsonl file ({\"text\": ...} or {\"words\": [...]} per line).")
    suffix = pathlib.PurePath(str(path)).suffix
    if suffix not in (".txt", ".jsonl"):
        raise UserError(f"--input_file={path}: expected a .txt or .jsonl file, got {suffix or 'no'} "
                        "extension; rename it to say which.")
    items = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if suffix == ".txt":
            items.append(TextInput(number, line, tuple(line.split())))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number} is not JSON ({e.msg}); write one object per line, "
                            'e.g. {"text": "The cat sat."}.') from None
        items.append(_jsonl_input(record, path, number))
    if not items:
        raise UserError(f"--input_file={path} holds no texts.")
    return items


def _jsonl_input(record, path: str, number: int):
    from t5x_like.analysis.extraction import TextInput

    text_id = record.get("id", number) if isinstance(record, dict) else number
    if isinstance(record, dict) and isinstance(record.get("text"), str) and record["text"].split():
        return TextInput(text_id, record["text"], tuple(record["text"].split()))
    words = record.get("words") if isinstance(record, dict) else None
    if (isinstance(words, list) and words
            and all(isinstance(w, str) and w and not any(c.isspace() for c in w) for w in words)):
        return TextInput(text_id, " ".join(words), tuple(words))
    raise UserError(f'{path}:{number} needs a non-empty "text" string or a "words" list of '
                    'non-empty strings without spaces, e.g. {"text": "The cat sat."} or '
                    '{"words": ["The", "cat", "sat", "."]}.')


def parse_layers(value: str) -> str | list[int]:
    """``all``/``last`` as given, else the list of numbers (checked against the model later)."""
    value = value.strip()
    if value in ("all", "last"):
        return value
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        raise UserError(f"--layers={value}: expected {LAYERS_HELP}.") from None
    return numbers


def resolve_layers(asked: str | list[int], num_layers: int) -> list[int]:
    if asked == "all":
        return list(range(num_layers + 1))
    if asked == "last":
        return [num_layers]
    out = []
    for k in asked:
        if not -(num_layers + 1) <= k <= num_layers:
            raise UserError(f"--layers: layer {k} does not exist; this model has layers "
                            f"0..{num_layers} (0 = embeddings, -1 = last).")
        k = k % (num_layers + 1)
        if k not in out:
            out.append(k)
    return out


def check_output(path: str, overwrite: bool) -> None:
    if storage.is_remote(path):
        raise UserError(f"--output={path}: arrays are written as memory maps, which need a "
                        "local folder; write here, then copy the folder to the bucket.")
    cli_flags.check_writable_folder(path, "--output")
    folder = storage.path(path)
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise UserError(f"--output={path} is not empty; choose a new folder or pass --overwrite.")


@errors.command_line("embed")
def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.batch_size < 1:
        raise UserError(f"--batch_size={args.batch_size}: pass a positive number.")
    asked_layers = parse_layers(args.layers)
    items = read_inputs(args.input_file)[:args.max_texts or None]
    check_output(args.output, args.overwrite)

    from t5x_like.analysis import extraction, hidden_states

    model = hidden_states.load(args.checkpoint, step=args.step, random_init=args.random_init,
                               vocabulary=args.vocabulary or None, seed=args.seed)
    layers = resolve_layers(asked_layers, model.num_layers)
    started = time.time()
    meta = extraction.embed_to_folder(model, items, args.output, layers=layers,
                                      batch_size=args.batch_size, dtype=args.dtype,
                                      tokens=not args.no_tokens)
    print(f"embed: {meta['n_texts']} texts, {meta['n_tokens']} tokens, {meta['n_words']} words; "
          f"layers {layers} of the {model.stack} (d={model.d_model}) -> {args.output} "
          f"in {time.time() - started:.1f}s"
          + (f"; {meta['truncated_texts']} texts cut to {model.max_length} tokens"
             if meta["truncated_texts"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
