"""Generate text from a checkpoint for a task's examples or a JSONL file of inputs.

    python -m t5x_like.infer --checkpoint=runs/ft_t5 --input_file=questions.jsonl --output_file=answers.jsonl

``--input_file`` has one JSON object per line with an ``inputs`` string; ``--task``
reads that task's ``--split`` instead (its targets are written beside each prediction).
The newest checkpoint of a workdir is used. Decoding flags as in ``eval``: greedy by
default, ``--num_beams``, or sampling with ``--temperature``/``--top_k``/``--top_p``.

A reward model (``preference.objective=reward_model``) scores texts instead: each line of
``--input_file`` holds a ``prompt`` and a ``response``, and the output its ``reward``.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from t5x_like import cli_flags, errors, resolving
from t5x_like.checkpoints import param_sources
from t5x_like.config import split_overrides
from t5x_like.errors import UserError
from t5x_like.system import storage

# Imports inside functions: keep JAX out of the command's start-up: a mistake in the config or
# the flags is reported before JAX loads.


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m t5x_like.infer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_flags.add_module_flag(parser)
    parser.add_argument("--checkpoint", required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--task")
    what.add_argument("--input_file")
    parser.add_argument("--output_file", required=True)
    parser.add_argument("--split", default="validation")
    parser.add_argument("--max_examples", type=int, default=0)
    parser.add_argument("--config")
    parser.add_argument("--batch_size", type=int, default=0)
    parser.add_argument("--inputs_length", type=int, default=0)
    cli_flags.add_vocabulary_flag(parser)
    cli_flags.add_decoding_flags(parser.add_argument_group("decoding"))
    rest, overrides = split_overrides(argv)
    return parser.parse_args(rest), overrides


def _input_lines(path: str, example: str = ""):
    """``(line number, record)`` of each non-empty line of ``--input_file``; a line that
    is not JSON is refused naming it (``example``: what a line looks like, said then)."""
    file = storage.path(path)
    if not file.is_file():
        raise UserError(f"--input_file={path}: no such file.")
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number} is not JSON ({e.msg}){example}.") from None


def read_inputs(path: str) -> list[str]:
    texts = []
    for number, record in _input_lines(path, '; write one object per line, e.g. {"inputs": '
                                              '"translate English to Spanish: Hello"}'):
        if not isinstance(record, dict) or not isinstance(record.get("inputs"), str):
            raise UserError(f'{path}:{number} needs an "inputs" string, e.g. {{"inputs": "..."}}.')
        texts.append(record["inputs"])
    if not texts:
        raise UserError(f"{path} holds no inputs.")
    return texts


def read_responses(path: str) -> list[tuple[str, str]]:
    """``(prompt, response)`` of each line of a reward model's ``--input_file``."""
    pairs = []
    for number, record in _input_lines(path):
        if not (isinstance(record, dict) and isinstance(record.get("prompt"), str)
                and isinstance(record.get("response"), str)):
            raise UserError(f'{path}:{number}: a reward model scores {{"prompt": "...", '
                            '"response": "..."}} lines.')
        pairs.append((record["prompt"], record["response"]))
    if not pairs:
        raise UserError(f"{path} holds no lines to score.")
    return pairs


def score_rewards(args, config, source, step, vocabulary) -> list[dict]:
    """A reward model's score of each ``prompt``/``response`` line of ``--input_file``, the
    response ended with EOS as its training pairs were."""
    from t5x_like import structures
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.evaluation import evaluator
    if not args.input_file:
        raise UserError("A reward model scores texts: pass --input_file with one "
                        '{"prompt": ..., "response": ...} per line.')
    pairs = read_responses(args.input_file)[:args.max_examples or None]
    structure = structures.for_config(config)
    lengths = dict(config.task_feature_lengths)
    eos = [] if vocabulary.eos_id is None else [int(vocabulary.eos_id)]
    rows = [structure.scoring_rows(list(vocabulary.encode(p)),
                                   list(vocabulary.encode(r)) + eos, lengths) for p, r in pairs]
    _, trainer = trainer_lib.build_on_devices(config)
    runner = evaluator.ModelRunner(
        structure, trainer.mesh, trainer.rules, trainer.state_shardings.params, lengths,
        evaluator.EvalSettings(batch_size=args.batch_size or config.batch_size),
        trainer.pipeline_settings)
    rewards = runner.reward_rows(source.restore_params(step, trainer), rows)
    return [{"prompt": p, "response": r, "reward": float(value)}
            for (p, r), value in zip(pairs, rewards, strict=True)]


def run(args, overrides) -> int:
    import jax

    from t5x_like import structures
    from t5x_like.builtin_tasks import pretraining as builtin
    from t5x_like.checkpoints import int8_weights
    from t5x_like.data.dataset_providers import with_vocabulary
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.evaluation import evaluator

    source = param_sources.resolve(args.checkpoint)
    steps = source.steps()
    if not steps:
        raise UserError(f"{source.path} holds no complete checkpoint.")
    step = steps[-1]
    resolved = resolving.resolve_checkpoint(source, step, args.config, overrides, args.vocabulary)
    config, trained, asked = (resolved.spec, resolved.trained_vocabulary,
                              resolved.asked_vocabulary)
    if structures.for_config(config).evaluation_mode == "pairs":  # a reward model
        vocabulary = asked or trained or builtin.embedded_vocabulary()
        records = score_rewards(args, config, source, step, vocabulary)
        if jax.process_index() == 0:
            out = storage.path(args.output_file)
            out.parent.mkdir(parents=True, exist_ok=True)
            storage.write_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                              for r in records))
            print(f"wrote {len(records)} rewards to {out} (checkpoint step {step})", flush=True)
        return 0
    structures.structure_class(config.model.family).check_decoding(config, args.num_beams)
    structures.structure_class(config.model.family).check_sampler(args.sampler, args.num_beams)
    lengths = dict(config.task_feature_lengths)
    if args.inputs_length:
        lengths["inputs"] = args.inputs_length
    if "inputs" not in lengths:
        raise UserError("The checkpoint's task has no inputs length; pass --inputs_length=N.")
    max_decode_length = args.max_decode_length or lengths.get("targets", 64)
    lengths.setdefault("targets", max_decode_length)
    if structures.structure_class(config.model.family).generates_after_prompt:
        lengths["targets"] = max_decode_length  # the row is the prompt, then what is generated

    if args.task:
        task = with_vocabulary(evaluator.leaf_tasks(args.task)[0], asked)
        resolving.check_vocabulary(config, task, trained, asked)
        vocabulary = task.output_features["targets"].vocabulary
        examples = list(task.get_dataset(args.split, lengths, shuffle=False, num_epochs=1))
        if args.max_examples:
            examples = examples[:args.max_examples]
        inputs_text = [str(ex.get("inputs_pretokenized", "")) for ex in examples]
        targets_text = [str(ex.get("targets_pretokenized", "")) for ex in examples]
    else:  # free text: the tokenizer asked for, else the checkpoint's own
        vocabulary = asked or trained or builtin.embedded_vocabulary()
        resolving.check_fits(config, vocabulary, "--input_file")
        inputs_text = read_inputs(args.input_file)[:args.max_examples or None]
        targets_text = None
        examples = []
        # The prompt as the run's tasks built one (an exported tokenizer's template adds
        # the same ids): text and EOS, or a language model's text to continue.
        _, suffix = structures.for_config(config).prompt_framing(config, vocabulary)
        for text in inputs_text:
            tokens = list(vocabulary.encode(text))[:lengths["inputs"] - len(suffix)] + suffix
            examples.append({"inputs": np.asarray(tokens, np.int32), "inputs_pretokenized": text})

    _, trainer = trainer_lib.build_on_devices(config)
    weights = int8_weights.weights_for(config, structures.for_config(config), trainer)
    params = weights.restore(source, step, trainer)
    settings = evaluator.EvalSettings(
        batch_size=args.batch_size or config.batch_size, max_decode_length=max_decode_length,
        num_beams=args.num_beams, alpha=args.alpha, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, sampler=args.sampler)
    structure = weights.structure
    runner = evaluator.ModelRunner(structure, trainer.mesh, trainer.rules, weights.shardings,
                                   lengths, settings, trainer.pipeline_settings)
    # The structure says what a row is and what its output reads as: generated text, or a
    # fine-tuned head's label, value, tag or span.
    rows = structure.infer_rows(examples, lengths, vocabulary.eos_id)
    outputs = runner.predict_rows(params, rows, max_decode_length if structure.writes_text else 0)
    predictions = structure.output_texts(outputs, rows,
                                         lambda tokens: evaluator._decode(vocabulary, tokens))
    if jax.process_index() == 0:
        out = storage.path(args.output_file)
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for index, (text, prediction) in enumerate(zip(inputs_text, predictions, strict=False)):
            record = {"inputs": text, "prediction": prediction}
            if targets_text is not None:
                record["targets"] = targets_text[index]
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
        storage.write_atomic(out, "".join(lines))
        print(f"wrote {len(predictions)} predictions to {out} (checkpoint step {step})",
              flush=True)
    return 0


@errors.command_line("infer")
def main(argv=None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    cli_flags.import_modules(args.module)
    return run(args, overrides)


if __name__ == "__main__":
    sys.exit(main())
