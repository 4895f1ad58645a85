"""Benchmark evaluation (seqio's ``Evaluator``): tasks -> model outputs -> metrics.

Each task of a mixture is evaluated in the mode its metadata asks for:

- ``predict``: decode text (``Structure.predict_batch``), postprocess it and the
  target text, then ``metric_fns(targets, predictions)``;
- ``rank``: rank classification: every option (the task's ``label_options``, or an
  example's own ``options``) is scored as the target and the most likely one is the
  prediction (T5X's rank classification), then ``metric_fns``;
- ``score``: each example's summed log-likelihood of its targets, then
  ``score_metric_fns(targets, scores)``;
- ``lm_eval`` (decoders, ``num_shots`` set): lm-evaluation-harness multiple choice
  over k-shot prompts, reporting ``acc`` and ``acc_norm`` (``few_shot.py``);
- ``head`` (a model fine-tuned with ``config.head``): the head's labels, tags, values
  or answer spans as text (``models.head_structure``), then ``metric_fns``.

The model runs on the training mesh and rules: params keep their shardings and each
batch is a global array. Every process reads the same examples (their texts are what
the metrics compare, as in seqio), but converts into model rows only the rows its own
devices hold (``LazyRows``); the outputs are replicated, so a multi-process
evaluation computes exactly what one process does. The metric functions run once, on
process 0, which alone writes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from t5x_like import metrics
from t5x_like.data import dataset_providers as dp
from t5x_like.data.preference import SIDES
from t5x_like.data.preprocessors.text import as_text
from t5x_like.engine import partitioning
from t5x_like.engine.trainer import _MeshAndRules
from t5x_like.errors import UserError
from t5x_like.evaluation import few_shot
from t5x_like.generation import engine as engine_lib
from t5x_like.system import progress

MODES = ("auto", "predict", "rank", "score")


@dataclasses.dataclass
class EvalSettings:
    split: str = "validation"
    max_examples: int = 0             # per task; 0 = all
    batch_size: int = 32
    max_decode_length: int = 0        # 0: the targets length
    num_beams: int = 1
    alpha: float = 0.6
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    sampler: str = "static"           # or "engine": continuous batching (decoders)
    mode: str = "auto"
    num_shots: int | None = None      # decoders: lm-evaluation-harness multiple choice
    few_shot_seed: int = few_shot.DEFAULT_SEED


@dataclasses.dataclass
class TaskResult:
    task: str
    mode: str
    metrics: dict[str, float]
    records: list[dict]               # per example: inputs, targets, prediction or score


def leaf_tasks(name: str, vocabulary=None) -> list:
    """The tasks of a task or mixture name, with a suggestion for an unknown name;
    ``vocabulary`` re-tokenizes them (``--vocabulary``)."""
    try:
        provider = dp.get_task_or_mixture(name)
    except KeyError as e:
        raise UserError(e.args[0]) from None
    return sorted((dp.with_vocabulary(t, vocabulary) for t in provider.tasks),
                  key=lambda t: t.name)


def check_metrics_installed(tasks) -> None:
    """Before any model work: every package the tasks' metrics import is installed."""
    for task in tasks:
        missing = metrics.missing_packages(task.metric_fns + task.score_metric_fns)
        if missing:
            raise UserError(f"The metrics of task {task.name!r} need {', '.join(missing)}, which is "
                            f"not installed; install the project again: {metrics.INSTALL}")


def _text(value) -> str:
    return as_text(value)


class ModelRunner:
    """The model side of evaluation: jitted score and predict steps on the mesh, and
    rows batched into global arrays (``infer`` uses it without tasks or metrics)."""

    def __init__(self, structure, mesh, rules, param_shardings,
                 task_feature_lengths: Mapping[str, int], settings: EvalSettings,
                 pipeline_settings=None):
        """``pipeline_settings``: the training run's schedule over a ``stage`` axis (a
        circular schedule's parameter layout depends on it)."""
        self.structure = structure
        self.mesh = mesh
        self.context = lambda: _MeshAndRules(mesh, rules, pipeline_settings=pipeline_settings)
        self.lengths = dict(task_feature_lengths)
        self.settings = settings
        data_parallel = math.prod(mesh.shape[a] for a in partitioning.batch_axes(rules)
                                  if a in mesh.shape)
        if settings.batch_size % data_parallel:
            raise UserError(f"Eval batch size {settings.batch_size} does not divide over the "
                            f"{data_parallel} data-parallel devices; use a multiple of "
                            f"{data_parallel}.")
        structure.check_sampler(settings.sampler, settings.num_beams)
        if settings.sampler == "engine" and jax.process_count() > 1:
            raise UserError(f"--sampler=engine decodes on one process; this evaluation has "
                            f"{jax.process_count()}. Use --sampler=static.")
        self.engine: engine_lib.Engine | None = None  # --sampler=engine: made at first use
        self._engine_params = None  # the params the engine holds now
        self.batch_sharding = partitioning.batch_sharding(mesh, rules)
        self._replicated = partitioning.replicated(mesh)
        self._param_shardings = param_shardings
        self._score = jax.jit(structure.score_batch,
                              in_shardings=(param_shardings, self.batch_sharding),
                              out_shardings=self._replicated)
        self._continuation = jax.jit(structure.continuation_scores,
                                     in_shardings=(param_shardings, self.batch_sharding),
                                     out_shardings=self._replicated)
        self._predict = {}
        self._token_scores = jax.jit(structure.token_scores,
                                     in_shardings=(param_shardings, self.batch_sharding),
                                     out_shardings=self._replicated)
        self.rows_made = 0  # rows this process converted (its share, multi-process)
        # Progress of each batch loop: silent inside training; the eval command shows it.
        self.meter = progress.Silent
        self.meter_label = ""

    def _meter(self, doing: str, rows: Sequence) -> progress.Meter | progress.Silent:
        label = f"{self.meter_label} {doing}" if self.meter_label else doing
        return self.meter(label, len(rows), "rows")

    # -- running the model ------------------------------------------------------------------
    def _global(self, rows: Sequence[dict], start: int) -> tuple[dict, int]:
        """The batch of ``rows[start:start + batch_size]`` as global arrays (padded with
        copies of its first row), and how many rows are real. A process makes only the
        rows its devices hold (``make_array_from_callback`` asks for those slices), so
        with ``LazyRows`` each process of a multi-process evaluation converts its share."""
        size = self.settings.batch_size
        count = min(size, len(rows) - start)
        made: dict[int, dict] = {}

        def row(j: int) -> dict:
            i = start + (j if j < count else 0)
            if i not in made:
                made[i] = rows[i]
            return made[i]

        def array(key: str, shape: tuple, dtype):
            def piece(index):
                stacked = np.stack([row(j)[key] for j in range(size)[index[0]]]).astype(dtype)
                return stacked[(slice(None),) + tuple(index[1:])]
            return jax.make_array_from_callback((size, *shape), self.batch_sharding, piece)

        first = row(0)
        batch = {k: array(k, np.shape(v), np.asarray(v).dtype) for k, v in first.items()}
        self.rows_made += len(made)
        return batch, count

    def _per_row(self, step, params, rows: Sequence[dict]) -> np.ndarray:
        """``step(params, batch)``'s one number per row, batch by batch (the padding rows
        of the last batch dropped)."""
        out = []
        with self._meter("scoring", rows) as meter:
            for start in range(0, len(rows), self.settings.batch_size):
                batch, count = self._global(rows, start)
                with self.context():
                    values = step(params, batch)
                out.append(np.asarray(jax.device_get(values))[:count])
                meter.advance(count)
        return np.concatenate(out) if out else np.zeros((0,), np.float32)

    def score_rows(self, params, rows: Sequence[dict]) -> np.ndarray:
        return self._per_row(self._score, params, rows)

    def reward_rows(self, params, rows: Sequence[dict]) -> np.ndarray:
        """A reward model's reward of each ``{"tokens", "mask"}`` row."""
        if not hasattr(self, "_rewards"):
            self._rewards = jax.jit(
                lambda p, b: self.structure.rewards(p, b["tokens"], b["mask"]),
                in_shardings=(self._param_shardings, self.batch_sharding),
                out_shardings=self._replicated)
        return self._per_row(self._rewards, params, rows)

    def continuation_rows(self, params, rows: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """``(summed log-likelihoods, is_greedy)`` of each row's weighted targets (the
        lm-evaluation-harness backend's ``loglikelihood``)."""
        scores, greedy = [], []
        with self._meter("scoring", rows) as meter:
            for start in range(0, len(rows), self.settings.batch_size):
                batch, count = self._global(rows, start)
                with self.context():
                    out = jax.device_get(self._continuation(params, batch))
                scores.append(np.asarray(out[0])[:count])
                greedy.append(np.asarray(out[1])[:count])
                meter.advance(count)
        if not scores:
            return np.zeros((0,), np.float32), np.zeros((0,), bool)
        return np.concatenate(scores), np.concatenate(greedy)

    def token_rows(self, params, rows: Sequence[dict]) -> tuple[np.ndarray, ...]:
        """Per position of each row: the target's log-probability, and the ``TOP_TOKENS``
        most likely tokens with theirs (``[rows, length]``, ``[rows, length, TOP_TOKENS]``
        twice): what a completion's ``logprobs`` report."""
        parts = []
        for start in range(0, len(rows), self.settings.batch_size):
            batch, count = self._global(rows, start)
            with self.context():
                out = jax.device_get(self._token_scores(params, batch))
            parts.append([np.asarray(x)[:count] for x in out])
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))

    def predict_rows(self, params, rows: Sequence[dict], max_decode_length: int,
                     seed: int | None = None, **decode) -> np.ndarray:
        """Generated tokens ``[rows, max_decode_length]``; ``decode`` overrides the
        settings' decoding options (e.g. ``temperature``), ``seed`` their seed (a served
        request samples from its own)."""
        s = self.settings
        if s.sampler == "engine" and max_decode_length:
            return self._engine_rows(params, rows, max_decode_length,
                                     s.seed if seed is None else seed, decode)
        options = dict(max_decode_length=max_decode_length, num_beams=s.num_beams, alpha=s.alpha,
                       temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        options.update(decode)
        key = tuple(sorted(options.items()))
        if key not in self._predict:
            def predict(params, batch, rng):
                return self.structure.predict_batch(params, batch, rng=rng, **options)
            self._predict[key] = jax.jit(
                predict, in_shardings=(self._param_shardings, self.batch_sharding, None),
                out_shardings=self._replicated)
        out = []
        with self._meter("generating", rows) as meter:
            for index, start in enumerate(range(0, len(rows), s.batch_size)):
                rng = jax.random.fold_in(jax.random.key(s.seed if seed is None else seed),
                                         index)
                batch, count = self._global(rows, start)
                with self.context():
                    tokens = self._predict[key](params, batch, rng)
                out.append(np.asarray(jax.device_get(tokens))[:count])
                meter.advance(count)
        return np.concatenate(out) if out else np.zeros((0, max_decode_length), np.int32)

    def _engine_rows(self, params, rows: Sequence[dict], max_decode_length: int, seed: int,
                     decode: dict) -> np.ndarray:
        """``predict_rows`` by the continuous-batching engine (``--sampler=engine``): a
        request a row, ``batch_size`` decoded together, a finished row's slot taken by the
        next one; row i sampled from ``seed + i``, so its tokens depend on neither its
        neighbours nor the batch size (greedy: ``predict_batch``'s tokens)."""
        if not rows:
            return np.zeros((0, max_decode_length), np.int32)
        s = self.settings
        options = dict(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        options.update({k: v for k, v in decode.items() if k in options})
        model, decoder_params, eos_id = self.structure.engine_decoder(params)
        batch = {key: np.stack([np.asarray(row[key]) for row in rows]) for key in rows[0]}
        prompts = self.structure.engine_prompts(batch)
        width = max(len(prompt) for prompt in prompts)
        needed = engine_lib.generation_length(model, width, max_decode_length)
        if self.engine is None or self.engine.max_length < needed:
            self.engine = engine_lib.Engine(model, decoder_params, max_length=needed,
                                            slots=s.batch_size, context=self.context)
            self._engine_params = params
        elif params is not self._engine_params:
            self.engine.params = decoder_params
            self.engine.clear_prefix_cache()  # its pages hold the last params' keys
            self._engine_params = params
        with self._meter("generating", rows) as meter:
            shown = [0]

            def advance(finished: int) -> None:
                meter.advance(finished - shown[0])
                shown[0] = finished
            return engine_lib.complete(
                self.engine, prompts, max_decode_length, seeds=seed + np.arange(len(prompts)),
                stop_ids=(int(eos_id),), on_step=advance, **options)


class LazyRows(Sequence):
    """Rows made when asked for (``make(i)``): the runner asks only for the rows this
    process's devices hold, so feature conversion is shared out between processes."""

    def __init__(self, count: int, make):
        self._count, self._make = count, make

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._make(i) for i in range(self._count)[index]]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        return self._make(index % self._count)


class Evaluator(ModelRunner):
    """Evaluates the tasks of ``name`` with a ``Structure`` whose params live on ``mesh``."""

    def __init__(self, structure, mesh, rules, param_shardings, name: str,
                 task_feature_lengths: Mapping[str, int], settings: EvalSettings,
                 vocabulary=None, pipeline_settings=None):
        if settings.mode not in MODES:
            raise UserError(f"--mode={settings.mode!r}; choose one of {MODES}.")
        self.tasks = leaf_tasks(name, vocabulary)
        for task in self.tasks:
            if not task.has_metrics and not task.label_options and not _scores_pairs(structure):
                raise UserError(
                    f"Task {task.name!r} has no metric_fns or score_metric_fns, so there is "
                    "nothing to report. Register it with metric_fns=[...] (see "
                    "t5x_like.metrics) or evaluate a benchmark task such as "
                    "embedded_bench.")
        structure.check_evaluated_tasks(name, self.tasks)
        super().__init__(structure, mesh, rules, param_shardings, task_feature_lengths, settings,
                         pipeline_settings)
        # Every process gets every output (they are replicated); the metric functions,
        # which may be costly (BLEU, ROUGE), run once, on the process that writes.
        self.computes_metrics = jax.process_index() == 0

    # -- examples -------------------------------------------------------------------------
    def examples(self, task) -> list[dict]:
        split = self.settings.split
        if split not in task.splits:
            raise UserError(f"Task {task.name!r} has no split {split!r}; it has "
                            f"{list(task.splits)}. Pass --split=one of those.")
        ds = task.get_dataset(split, self.lengths, shuffle=False, num_epochs=1)
        limit = self.settings.max_examples or None
        examples = list(itertools.islice(iter(ds), limit))
        if not examples:
            raise UserError(f"Task {task.name!r} split {split!r} is empty after preprocessing; "
                            "nothing to evaluate. Check the task's source and lengths.")
        for key in ("inputs_pretokenized", "targets_pretokenized"):
            if key not in examples[0] and key.split("_")[0] in task.output_features:
                raise UserError(f"Task {task.name!r} keeps no {key!r}: evaluation compares text. "
                                "Tokenize with pp.Tokenize(copy_pretokenized=True).")
        return examples

    def mode_for(self, task, examples) -> str:
        s = self.settings
        if self.structure.evaluation_mode:  # a head's labels, a reward model's pairs
            return self.structure.evaluation_mode
        has_options = bool(task.label_options) or "options" in examples[0]
        if s.num_shots is not None and has_options and self.structure.scores_choices_as_lm_eval:
            return "lm_eval"
        if s.mode != "auto":
            if s.mode == "rank" and not has_options:
                raise UserError(f"--mode=rank needs label_options or per-example options; task "
                                f"{task.name!r} has neither.")
            return s.mode
        if has_options and (task.metric_fns or not task.score_metric_fns):
            return "rank"
        if task.metric_fns:
            return "predict"
        return "score"

    # -- evaluation -----------------------------------------------------------------------
    def evaluate_task(self, params, task) -> TaskResult:
        self.meter_label = task.name
        examples = self.examples(task)
        mode = self.mode_for(task, examples)
        if mode == "lm_eval":
            return self._lm_eval(params, task, examples)
        if mode == "pairs":
            return self._pairs(params, task, examples)
        converter = self.structure.feature_converter(self.lengths, pack=False)
        vocabulary = task.output_features["targets"].vocabulary
        targets_text = [_text(ex.get("targets_pretokenized", "")) for ex in examples]
        inputs_text = [_text(ex.get("inputs_pretokenized", "")) for ex in examples]
        records = [{"inputs": i, "targets": t} for i, t in zip(inputs_text, targets_text, strict=False)]
        if mode == "score":
            scores = self.score_rows(params, self._rows(converter, examples))
            _check_finite(task.name, scores)
            for record, score in zip(records, scores, strict=False):
                record["score"] = float(score)
            metrics = {}
            for fn in task.score_metric_fns if self.computes_metrics else ():
                metrics.update(fn(targets_text, scores.tolist()))
            return TaskResult(task.name, mode, metrics, records)
        if mode == "rank":
            predictions = self._rank(params, task, examples, converter, vocabulary, records)
        elif mode == "head":
            converter = self.structure.feature_converter(self.lengths, strict=False)
            rows = [converter.convert_example(ex, self.lengths) for ex in examples]
            predictions = self.structure.label_texts(self.predict_rows(params, rows, 0), rows)
        else:
            length = self.settings.max_decode_length or self.lengths["targets"]
            prompts = [_with_eos_target(ex, vocabulary) for ex in examples]
            tokens = self.predict_rows(params, self._rows(converter, prompts), length)
            predictions = [_decode(vocabulary, row) for row in tokens]
        for record, prediction in zip(records, predictions, strict=False):
            record["prediction"] = prediction
        targets = [task.postprocess(t, example=ex, is_target=True)
                   for t, ex in zip(targets_text, examples, strict=False)]
        predicted = [task.postprocess(p, example=ex, is_target=False)
                     for p, ex in zip(predictions, examples, strict=False)]
        metrics = {}
        for fn in task.metric_fns if self.computes_metrics else ():
            metrics.update(fn(targets, predicted))
        if task.score_metric_fns and mode != "head":
            scores = self.score_rows(params, self._rows(converter, examples))
            _check_finite(task.name, scores)
            for fn in task.score_metric_fns if self.computes_metrics else ():
                metrics.update(fn(targets_text, scores.tolist()))
        return TaskResult(task.name, mode, metrics, records)

    def _rank(self, params, task, examples, converter, vocabulary, records) -> list[str]:
        pairs, option_lists = [], []
        length = self.lengths["targets"]
        for ex in examples:
            options = [_text(o) for o in ex["options"]] if "options" in ex else list(
                task.label_options)
            option_lists.append(options)
            pairs += [(ex, option) for option in options]

        def option_row(i: int) -> dict:
            ex, option = pairs[i]
            tokens = list(vocabulary.encode(option))[:length - 1] + [vocabulary.eos_id]
            return converter.convert_example(dict(ex, targets=np.asarray(tokens, np.int32)),
                                             self.lengths)
        scores = self.score_rows(params, LazyRows(len(pairs), option_row))
        _check_finite(task.name, scores)
        predictions, offset = [], 0
        for index, options in enumerate(option_lists):
            option_scores = scores[offset:offset + len(options)]
            offset += len(options)
            predictions.append(options[int(np.argmax(option_scores))])
            records[index].update(options=options,
                                  option_scores=[float(x) for x in option_scores])
        return predictions

    def _lm_eval(self, params, task, examples) -> TaskResult:
        """lm-evaluation-harness multiple choice over k-shot prompts (decoders)."""
        vocabulary = task.output_features["targets"].vocabulary
        sampler = few_shot.FewShotSampler(self._demonstrations(task), self.settings.num_shots,
                                          self.settings.few_shot_seed)
        width = sum(self.lengths.values())
        requests, choice_lists, records = [], [], []
        for ex in examples:
            context = sampler.prompt(_text(ex["inputs_pretokenized"]))
            choices = ([_text(o) for o in ex["options"]] if "options" in ex
                       else list(task.label_options))
            choice_lists.append(choices)
            requests += [(context, choice) for choice in choices]
            records.append({"inputs": context, "targets": _text(ex["targets_pretokenized"])})

        prefix = text_prefix(self.structure, vocabulary)

        def request_row(i: int) -> dict:
            return few_shot.request_row(
                *few_shot.loglikelihood_request(vocabulary, *requests[i], prefix), width)
        scores = self.score_rows(params, LazyRows(len(requests), request_row))
        _check_finite(task.name, scores)
        correct, correct_norm, offset = [], [], 0
        for record, choices in zip(records, choice_lists, strict=False):
            choice_scores = scores[offset:offset + len(choices)]
            offset += len(choices)
            best, best_norm = few_shot.choose(choice_scores, choices)
            record.update(prediction=choices[best], prediction_norm=choices[best_norm],
                          options=choices, option_scores=[float(x) for x in choice_scores])
            correct.append(choices[best] == record["targets"])
            correct_norm.append(choices[best_norm] == record["targets"])
        metrics = {"acc": float(np.mean(correct)), "acc_norm": float(np.mean(correct_norm))}
        return TaskResult(task.name, "lm_eval", metrics, records)

    def _demonstrations(self, task) -> list[few_shot.Demonstration]:
        if self.settings.num_shots == 0:
            return []
        if "train" not in task.splits:
            raise UserError(f"Few-shot prompts draw demonstrations from the train split; task "
                            f"{task.name!r} has only {list(task.splits)}. Use --num_shots=0.")
        ds = task.get_dataset("train", self.lengths, shuffle=False, num_epochs=1)
        return [few_shot.Demonstration(_text(ex["inputs_pretokenized"]),
                                       _text(ex["targets_pretokenized"])) for ex in ds]

    def _rows(self, converter, examples: Sequence[dict]) -> LazyRows:
        return LazyRows(len(examples),
                        lambda i: converter.convert_example(examples[i], self.lengths))

    def evaluate(self, params) -> list[TaskResult]:
        return [self.evaluate_task(params, task) for task in self.tasks]

    def _pairs(self, params, task, examples) -> TaskResult:
        """A reward model on preference pairs (``structures/preference.py``): how often it
        scores the chosen response above the rejected one (``accuracy``) and by how much
        (``margin``); each pair's two rewards are its record."""
        converter = self.structure.feature_converter(self.lengths)
        try:
            rows = [converter.convert_example(ex, self.lengths) for ex in examples]
        except KeyError as e:
            raise UserError(f"Task {task.name!r}: {e.args[0]}") from None
        rewards = {side: self.reward_rows(params, [
            {"tokens": r[f"{side}_tokens"], "mask": r[f"{side}_mask"]} for r in rows])
            for side in SIDES}
        chosen, rejected = rewards["chosen"], rewards["rejected"]
        metrics = {"accuracy": float(np.mean(chosen > rejected)),
                   "margin": float(np.mean(chosen - rejected))}
        records = [{"chosen_reward": float(c), "rejected_reward": float(r)}
                   for c, r in zip(chosen, rejected, strict=True)]
        return TaskResult(task.name, "pairs", metrics, records)


def _scores_pairs(structure) -> bool:
    """A reward model: it scores texts, and evaluates on preference pairs."""
    return structure.evaluation_mode == "pairs"


def _with_eos_target(example, vocabulary) -> dict:
    """Prediction needs no target, but a decoder's prompt ends where the targets begin:
    keep the row's layout with a one-token (EOS) target."""
    return dict(example, targets=np.asarray([vocabulary.eos_id], np.int32))


def text_prefix(structure, vocabulary) -> tuple[int, ...]:
    """What a text starts with once the checkpoint's tokenizer frames it, as its export
    does (and lm-eval's ``hf`` model, by default): an imported tokenizer's own template
    (Llama's BOS, GPT-2's nothing), else the structure's (a decoder run's start id)."""
    own = getattr(vocabulary, "template_prefix", None)
    return tuple(own) if own is not None else tuple(structure.text_prefix())


def _decode(vocabulary, tokens) -> str:
    ids = []
    for token in np.asarray(tokens).tolist():
        if token == vocabulary.eos_id:
            break
        if token != getattr(vocabulary, "pad_id", 0):
            ids.append(token)
    return vocabulary.decode(ids)


def _check_finite(task_name: str, scores: np.ndarray) -> None:
    if not np.all(np.isfinite(scores)):
        bad = int(np.argmax(~np.isfinite(scores)))
        raise UserError(f"Task {task_name!r}: a log-likelihood is not finite (row {bad}: "
                        f"{scores[bad]}). The checkpoint has diverged or its params are damaged; "
                        "evaluate an earlier step.")


def average(results: Sequence[TaskResult]) -> float | None:
    """The mixture's average: the mean over tasks of each task's mean metric (GLUE-style)."""
    per_task = [float(np.mean(list(r.metrics.values()))) for r in results if r.metrics]
    return float(np.mean(per_task)) if per_task else None


def as_records(results: Sequence[TaskResult], step: int) -> list[dict[str, Any]]:
    """``metrics.jsonl`` lines: one per task, ``{"step", "task", "<metric>": value, ...}``."""
    return [{"step": int(step), "task": r.task, **{k: float(v) for k, v in r.metrics.items()}}
            for r in results]
