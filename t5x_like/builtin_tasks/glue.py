"""GLUE and SuperGLUE from prepared TFDS datasets, in T5's text-to-text formats.

Importing registers (no TFDS I/O; sizes are read only when a mixture's rates are):

* ``glue_{cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli}_v002`` (TFDS ``glue/*:2.0.0``)
* ``super_glue_{boolq,cb,copa,multirc,record,rte,wic,wsc}_v102`` (``super_glue/*:1.0.2``)
* ``glue_v002_proportional`` and ``super_glue_v102_proportional``: rate = the task's
  number of examples, capped at 2**19 (``rate_num_examples``).

Formats are T5's (``t5.data.preprocessors.glue``/``stsb``/``wsc``/``record``): the
inputs are the benchmark name, then ``key: text`` for each text feature (sorted by
name unless T5 fixes an order), e.g. ``mnli hypothesis: ... premise: ...``; the
target is the label's TFDS ClassLabel name (``entailment``), ``<unk>`` for the
unlabelled test splits. Every example keeps ``inputs_pretokenized`` and
``targets_pretokenized`` and T5's ``idx`` keys. ``postprocess_fn`` turns a label word
back into its class id (-1 when it is none of them); the metrics are each
benchmark's official ones with T5's names. ``label_options`` lists the label words,
so the classification tasks can be rank-classified.

Where we differ from T5, on purpose:

* GLUE is TFDS ``2.0.0`` (T5 pinned 1.0.0; TFDS's release notes since list updated
  download URLs and, in 2.0.0, a new data source for QQP).
* ``super_glue_wsc_v102`` is T5's SuperGLUE-WSC *classification* format
  (``wsc text: # he # ... * Tom * ...`` -> ``True``/``False``, the ``wsc.fixed``
  config), the one ``t5.data.glue_utils`` defines. T5's own SuperGLUE runs replaced it
  by the generative ``wsc_simple`` variant plus DPR data; those are not here, so our
  ``super_glue_v102_proportional`` mixes this WSC task instead of
  ``super_glue_wsc_v102_simple_train`` and ``dpr_v001_simple``.
* ReCoRD: T5 writes one example per correct answer in every split and deduplicates
  the predictions per query at evaluation. We write one example per answer in
  ``train`` only; the other splits hold one example per query (target: its first
  answer) that carries all ``answers`` for the metric (SQuAD EM/F1, max over
  answers). The metric still deduplicates per (passage, query), so it scores the
  same either way.
* MultiRC's exact match groups answers by (paragraph, question) index, T5 by the
  question index alone (the same groups when question indices are global).
* STS-B targets are T5's: ``round(5 * label) / 5`` with round-half-to-even (as
  ``tf.round``) in float32, printed ``%.1f``; STS-B is scored against those rounded
  targets, as in T5. It has no ``label_options`` (a regression is decoded, as in T5;
  ``STSB_VALUES`` lists the 26 targets), nor has ReCoRD (its answers are free text).

``register_glue(vocabulary=..., data_dir=..., suffix=...)`` registers the same tasks
with another vocabulary (names end in ``suffix``). ``glue_average`` and
``super_glue_average`` compute the benchmark scores as T5's ``eval_utils`` does.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence

import grain
import numpy as np

from t5x_like import metrics
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data import preprocessors as pp
from t5x_like.data.dataset_providers import MixtureRegistry, TaskRegistry, rate_num_examples
from t5x_like.data.preprocessors.base import ExampleStep, StreamStep
from t5x_like.data.preprocessors.text import as_text
from t5x_like.data.sources import TfdsSource
from t5x_like.errors import DataError

GLUE_VERSION = "2.0.0"
SUPER_GLUE_VERSION = "1.0.2"
# Examples-proportional mixing caps each task's rate at this many examples (T5's K).
MAX_EXAMPLES_PER_TASK = 2 ** 19
UNKNOWN_LABEL = "<unk>"  # the target of unlabelled (test) examples, as in T5
BOOL_LABELS = ("False", "True")
# The 26 STS-B targets. Not label_options: STS-B is a regression, decoded as in T5.
STSB_VALUES = tuple(f"{i / 5:.1f}" for i in range(26))  # "0.0", "0.2", ..., "5.0"

DEFAULT_SPLITS = (("train", "train"), ("validation", "validation"), ("test", "test"))
MNLI_SPLITS = (("train", "train"), ("validation", "validation_matched"),
               ("validation_matched", "validation_matched"),
               ("validation_mismatched", "validation_mismatched"),
               ("test", "test_matched"), ("test_matched", "test_matched"),
               ("test_mismatched", "test_mismatched"))


# -- formats -----------------------------------------------------------------------------------

def label_word(label, label_names: Sequence[str]) -> str:
    """The ClassLabel name of ``label``; ``<unk>`` for -1 (unlabelled test examples)."""
    label = int(label)
    return UNKNOWN_LABEL if label == -1 else label_names[label]


def glue_text(example: Mapping, *, benchmark: str, label_names: Sequence[str],
              feature_names: Sequence[str]) -> dict:
    """T5's ``preprocessors.glue``: ``"<benchmark> key1: text1 key2: text2"`` -> label word.

    MultiRC's inputs lose their HTML (``<br>`` -> space, ``<b>``/``</b>`` removed) and
    its example keeps ``idx/paragraph``, ``idx/question``, ``idx/answer``; the others
    keep ``idx``.
    """
    parts = [benchmark]
    for key in feature_names:
        parts += [f"{key}:", as_text(example[key])]
    inputs = " ".join(parts)
    out = {}
    if benchmark == "multirc":
        inputs = re.sub(r"<(/)?b>", "", inputs.replace("<br>", " "))
        for key in ("paragraph", "question", "answer"):
            out[f"idx/{key}"] = int(example["idx"][key])
    else:
        out["idx"] = int(example["idx"])
    out["inputs"] = inputs
    out["targets"] = label_word(example["label"], label_names)
    return out


def stsb_target(label) -> str:
    """T5's STS-B target: the score rounded to the nearest 0.2 and printed ``%.1f``.

    As ``tf.as_string(tf.round(label * 5) / 5, precision=1)``: float32 arithmetic,
    halves rounded to even (2.5 -> 12.5 -> 12 -> ``"2.4"``).
    """
    value = np.float32(label)
    rounded = np.round(value * np.float32(5)) / np.float32(5)
    return f"{float(rounded):.1f}"


def stsb_text(example: Mapping) -> dict:
    inputs = (f"stsb sentence1: {as_text(example['sentence1'])} "
              f"sentence2: {as_text(example['sentence2'])}")
    return {"idx": int(example["idx"]), "inputs": inputs,
            "targets": stsb_target(example["label"])}


def _mark_span(text: str, span: str, index: int, mark: str) -> str:
    """Surrounds ``span``, found as word ``index`` of ``text``, by ``mark`` (T5's regex;
    unlike T5 the span text is escaped, so it never acts as a pattern)."""
    if index < 0:
        return text
    pattern = rf"^((?:\S+\s){{{index}}})({re.escape(span)})"
    return re.sub(pattern, rf"\g<1>{mark} \g<2> {mark}", text, count=1)


def wsc_text(example: Mapping) -> dict:
    """T5's ``preprocessors.wsc``: ``* noun *`` and ``# pronoun #`` marked in the text,
    ``"wsc text: ..."`` -> ``True`` when the pronoun refers to the noun."""
    span1_index, span2_index = int(example["span1_index"]), int(example["span2_index"])
    text = _mark_span(as_text(example["text"]), as_text(example["span1_text"]), span1_index, "*")
    # Marking span 1 added two words ("*" twice) before span 2 when it comes first.
    span2_index += 2 if span1_index < span2_index else 0
    text = _mark_span(text, as_text(example["span2_text"]), span2_index, "#")
    return {"idx": int(example["idx"]), "inputs": f"wsc text: {text}",
            "targets": label_word(example["label"], BOOL_LABELS)}


def _texts(values) -> list[str]:
    return [as_text(v) for v in np.asarray(values, dtype=object).reshape(-1)]


def record_inputs(example: Mapping) -> str:
    """``record query: ... entities: e1, e2 passage: ...`` with the ``@highlight``
    lines joined into sentences, as T5's ``preprocessors.record``."""
    passage = as_text(example["passage"])
    passage = re.sub(r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 ", passage)
    passage = re.sub(r"\n@highlight\n", ". ", passage)
    entities = ", ".join(_texts(example["entities"]))
    return f"record query: {as_text(example['query'])} entities: {entities} passage: {passage}"


def record_examples(example: Mapping, explode: bool) -> list[dict]:
    """One ReCoRD query -> examples: one per answer when ``explode`` (T5's training
    format), else one whose target is the first answer. Each carries all ``answers``."""
    answers = tuple(_texts(example["answers"]))
    base = {"idx/passage": int(example["idx"]["passage"]),
            "idx/query": int(example["idx"]["query"]),
            "inputs": record_inputs(example), "answers": answers}
    targets = (answers if explode else answers[:1]) or (UNKNOWN_LABEL,)
    return [dict(base, targets=target) for target in targets]


@dataclasses.dataclass(frozen=True)
class ToText(ExampleStep):
    """A raw TFDS record -> ``inputs``/``targets`` text with ``fn(example)``."""

    uses_rng = False
    may_drop = False

    fn: Callable[[Mapping], dict]

    def map(self, example, rng, ctx):
        return self.fn(example)


class _FlatMapIterator(grain.DatasetIterator):
    """``fn(example)`` -> several examples, emitted one by one.

    The state is the parent's state before the current record plus how many of its
    examples were emitted, so a restored iterator re-reads that record and goes on
    where the checkpointed one was.
    """

    def __init__(self, parent, fn):
        super().__init__(parent)
        self._fn = fn
        self._pending: list[dict] = []
        self._record_state = self._parent.get_state()
        self._emitted = 0
        self._skip = 0

    def __next__(self):
        while not self._pending:
            self._record_state = self._parent.get_state()
            self._pending = list(self._fn(next(self._parent)))[self._skip:]
            self._emitted, self._skip = self._skip, 0
        self._emitted += 1
        return self._pending.pop(0)

    def get_state(self):
        if not self._pending and not self._skip:  # between records
            return {"parent": self._parent.get_state(), "emitted": 0}
        return {"parent": self._record_state, "emitted": self._emitted or self._skip}

    def set_state(self, state):
        self._parent.set_state(state["parent"])
        self._record_state = state["parent"]
        self._pending, self._emitted, self._skip = [], 0, int(state["emitted"])


class _FlatMapDataset(grain.IterDataset):
    def __init__(self, parent, fn):
        super().__init__(parent)
        self._fn = fn

    def __iter__(self):
        return _FlatMapIterator(self._parent.__iter__(), self._fn)


@dataclasses.dataclass(frozen=True)
class RecordToText(StreamStep):
    """ReCoRD queries -> T5's text examples; one per answer in ``explode_splits``."""

    explode_splits: tuple[str, ...] = ("train",)

    def __call__(self, ds, ctx, seed):
        explode = ctx.split in self.explode_splits
        return _FlatMapDataset(ds, functools.partial(record_examples, explode=explode))


# -- postprocessors ------------------------------------------------------------------------------

def string_label_to_class_id(text, example=None, is_target=False, *,
                             label_names: Sequence[str], default: int = -1) -> int:
    """The index of the label word in ``label_names``; ``default`` (-1) for anything else."""
    text = as_text(text)
    return label_names.index(text) if text in label_names else default


def string_to_float(text, example=None, is_target=False, *, default: float = -1.0) -> float:
    """STS-B: the decoded number, ``default`` (-1.0) when it does not parse."""
    try:
        return float(as_text(text))
    except ValueError:
        return default


def multirc_postprocess(text, example=None, is_target=False) -> dict:
    """``{"value": class id}``; targets add ``"group"``: the (paragraph, question) ids."""
    result = {"value": string_label_to_class_id(text, label_names=BOOL_LABELS)}
    if is_target:
        if example is None:
            raise ValueError("MultiRC targets need their example (its idx/paragraph and "
                             "idx/question group the answers of a question).")
        result["group"] = (int(example["idx/paragraph"]), int(example["idx/question"]))
    return result


def record_postprocess(text, example=None, is_target=False) -> dict:
    """Predictions: ``{"value": text}``; targets: all the query's answers and its group."""
    if not is_target:
        return {"value": as_text(text)}
    if example is None:
        raise ValueError("ReCoRD targets need their example (its answers and idx/passage, "
                         "idx/query).")
    return {"value": list(_texts(example["answers"])),
            "group": (int(example["idx/passage"]), int(example["idx/query"]))}


# -- MultiRC and ReCoRD metrics (T5's, over the postprocessed dicts) ---------------------------

def multirc_f1_over_all_answers(targets, predictions) -> dict:
    """F1 of ``True`` over every answer option (``f1_score_with_invalid``): ``{"f1"}``."""
    return metrics.f1_score_with_invalid([t["value"] for t in targets],
                                         [p["value"] for p in predictions])


def multirc_exact_match(targets, predictions) -> dict:
    """Percent of questions with every answer option right (T5's ``mean_group_metric(
    all_match)``): ``{"exact_match"}``."""
    groups = collections.defaultdict(list)
    for target, prediction in zip(targets, predictions, strict=True):
        groups[target["group"]].append(target["value"] == prediction["value"])
    scores = [100.0 * float(all(same)) for same in groups.values()]
    return {"exact_match": float(np.mean(scores)) if scores else 0.0}


def record_squad(targets, predictions) -> dict:
    """SQuAD EM and F1 (max over the answers) on one prediction per (passage, query),
    T5's ``deduplicate_metric(squad)``: ``{"em", "f1"}``."""
    seen, answers, predicted = set(), [], []
    for target, prediction in zip(targets, predictions, strict=True):
        if target["group"] in seen:
            continue
        seen.add(target["group"])
        if not target["value"]:
            raise DataError(f"ReCoRD query {target['group']} has no answers (the test split "
                            "is unlabelled); evaluate on validation.")
        answers.append(target["value"])
        predicted.append(prediction["value"])
    return metrics.squad(answers, predicted)


# -- the benchmarks --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One GLUE/SuperGLUE dataset: its TFDS config, T5 format, labels and metrics."""

    collection: str  # "glue" or "super_glue"
    config: str  # TFDS builder config
    short_name: str  # in the task name: glue_{short_name}_v002
    display: str
    features: tuple[str, ...] = ()  # text features in T5's order (for glue_text)
    labels: tuple[str, ...] = ()  # TFDS ClassLabel names; the rank-classification options
    metric_fns: tuple = ()
    splits: tuple[tuple[str, str], ...] = DEFAULT_SPLITS
    fn: Callable | None = None  # a format other than glue_text
    postprocess_fn: Callable | None = None

    @property
    def task_name(self) -> str:
        version = "v002" if self.collection == "glue" else "v102"
        return f"{self.collection}_{self.short_name}_{version}"

    @property
    def tfds_name(self) -> str:
        version = GLUE_VERSION if self.collection == "glue" else SUPER_GLUE_VERSION
        return f"{self.collection}/{self.config}:{version}"

    def format_step(self):
        if self.config == "record":
            return RecordToText()
        if self.fn is not None:
            return ToText(self.fn)
        return ToText(functools.partial(glue_text, benchmark=self.short_name,
                                        label_names=self.labels, feature_names=self.features))

    def postprocessor(self):
        if self.postprocess_fn is not None:
            return self.postprocess_fn
        return functools.partial(string_label_to_class_id, label_names=self.labels)


def _metric_names(fns) -> str:
    return ", ".join(getattr(f, "__name__", str(f)) for f in fns)


_binary_f1 = (metrics.f1_score_with_invalid, metrics.accuracy)

GLUE = (
    Benchmark("glue", "cola", "cola", "CoLA", ("sentence",), ("unacceptable", "acceptable"),
              (metrics.matthews_corrcoef,)),
    Benchmark("glue", "sst2", "sst2", "SST-2", ("sentence",), ("negative", "positive"),
              (metrics.accuracy,)),
    Benchmark("glue", "mrpc", "mrpc", "MRPC", ("sentence1", "sentence2"),
              ("not_equivalent", "equivalent"), _binary_f1),
    Benchmark("glue", "qqp", "qqp", "QQP", ("question1", "question2"),
              ("not_duplicate", "duplicate"), _binary_f1),
    Benchmark("glue", "stsb", "stsb", "STS-B", ("sentence1", "sentence2"), (),
              (metrics.pearson_corrcoef, metrics.spearman_corrcoef), fn=stsb_text,
              postprocess_fn=string_to_float),
    Benchmark("glue", "mnli", "mnli", "MNLI", ("hypothesis", "premise"),
              ("entailment", "neutral", "contradiction"), (metrics.accuracy,), MNLI_SPLITS),
    Benchmark("glue", "qnli", "qnli", "QNLI", ("question", "sentence"),
              ("entailment", "not_entailment"), (metrics.accuracy,)),
    Benchmark("glue", "rte", "rte", "RTE", ("sentence1", "sentence2"),
              ("entailment", "not_entailment"), (metrics.accuracy,)),
    Benchmark("glue", "wnli", "wnli", "WNLI", ("sentence1", "sentence2"),
              ("not_entailment", "entailment"), (metrics.accuracy,)),
)

SUPER_GLUE = (
    Benchmark("super_glue", "boolq", "boolq", "BoolQ", ("passage", "question"), BOOL_LABELS,
              (metrics.accuracy,)),
    Benchmark("super_glue", "cb", "cb", "CB", ("hypothesis", "premise"),
              ("entailment", "contradiction", "neutral"),
              (metrics.mean_multiclass_f1(3), metrics.accuracy)),
    Benchmark("super_glue", "copa", "copa", "COPA", ("choice1", "choice2", "premise", "question"),
              ("choice1", "choice2"), (metrics.accuracy,)),
    Benchmark("super_glue", "multirc", "multirc", "MultiRC", ("question", "answer", "paragraph"),
              BOOL_LABELS, (multirc_f1_over_all_answers, multirc_exact_match),
              postprocess_fn=multirc_postprocess),
    Benchmark("super_glue", "record", "record", "ReCoRD", metric_fns=(record_squad,),
              postprocess_fn=record_postprocess),
    Benchmark("super_glue", "rte", "rte", "RTE", ("hypothesis", "premise"),
              ("entailment", "not_entailment"), (metrics.accuracy,)),
    # T5 orders WiC's features and leaves out the word's character offsets.
    Benchmark("super_glue", "wic", "wic", "WiC", ("sentence1", "sentence2", "word"), BOOL_LABELS,
              (metrics.accuracy,)),
    Benchmark("super_glue", "wsc.fixed", "wsc", "WSC", ("text",), BOOL_LABELS,
              (metrics.accuracy,), fn=wsc_text),
)

BENCHMARKS = {b.task_name: b for b in GLUE + SUPER_GLUE}
# T5 leaves WNLI out of its GLUE mixture (it trains on WSC/DPR instead).
GLUE_MIXTURE_TASKS = tuple(b.task_name for b in GLUE if b.short_name != "wnli")
SUPER_GLUE_MIXTURE_TASKS = tuple(b.task_name for b in SUPER_GLUE)


def _description(b: Benchmark) -> str:
    if b.config == "record":
        fmt = ("'record query: ... entities: a, b passage: ...' -> an answer (one example per "
               "answer in train; one per query, carrying all answers, elsewhere)")
    elif b.short_name == "stsb":
        fmt = "'stsb sentence1: ... sentence2: ...' -> the score rounded to 0.2 ('3.4')"
    elif b.short_name == "wsc":
        fmt = "'wsc text: ... * noun * ... # pronoun # ...' -> False|True"
    else:
        fmt = (f"'{b.short_name} " + " ".join(f"{k}: ..." for k in b.features)
               + "' -> " + "|".join(b.labels))
    return (f"{'GLUE' if b.collection == 'glue' else 'SuperGLUE'} {b.display} "
            f"(TFDS {b.tfds_name}) in T5's format: {fmt}. Metrics: {_metric_names(b.metric_fns)}.")


def register_glue(vocabulary=None, data_dir: str | None = None, suffix: str = "",
                  max_examples: int | None = MAX_EXAMPLES_PER_TASK) -> list[str]:
    """Registers every GLUE and SuperGLUE task (``<task name><suffix>``) and the two
    proportional mixtures; returns the task names.

    ``vocabulary``: of inputs and targets (default: the embedded 8k SentencePiece
    model); ``data_dir``: where the TFDS datasets are prepared (default TFDS's).
    Registering reads nothing: a mixture reads the task sizes when its rates are asked
    for, capped at ``max_examples`` (T5's 2**19).
    """
    names = []
    for b in GLUE + SUPER_GLUE:
        source = TfdsSource(b.tfds_name, data_dir=data_dir, split_map=b.splits,
                            builder_module=f"tensorflow_datasets.text.{b.collection}")
        steps = [b.format_step(), pp.Tokenize(copy_pretokenized=True), pp.AppendEos(),
                 pp.Truncate()]
        TaskRegistry.add(b.task_name + suffix, source, steps,
                         tasks.features("inputs", "targets", vocabulary=vocabulary),
                         postprocess_fn=b.postprocessor(), metric_fns=b.metric_fns,
                         description=_description(b), label_options=b.labels)
        names.append(b.task_name + suffix)
    for mixture, members, what in (
            ("glue_v002_proportional", GLUE_MIXTURE_TASKS, "GLUE (without WNLI, as T5)"),
            ("super_glue_v102_proportional", SUPER_GLUE_MIXTURE_TASKS, "SuperGLUE")):
        MixtureRegistry.add(
            mixture + suffix,
            [(t + suffix, rate_num_examples(t + suffix, maximum=max_examples)) for t in members],
            description=f"{what} tasks mixed in proportion to their number of examples, each "
                        f"capped at {max_examples} (T5's examples-proportional mixing).")
    return names


# -- benchmark scores ----------------------------------------------------------------------------

# T5's ``eval_utils.METRIC_NAMES``: a benchmark's score is the mean over its groups of the
# mean of the group's metrics. Entries: (group, ((task aliases, metric), ...)); the first
# alias found in ``metrics_by_task`` is used.
_MNLI_MATCHED = ("glue_mnli_matched_v002", "glue_mnli_v002/validation_matched", "glue_mnli_v002")
_MNLI_MISMATCHED = ("glue_mnli_mismatched_v002", "glue_mnli_v002/validation_mismatched")
GLUE_SCORE_GROUPS = (
    ("CoLA", ((("glue_cola_v002",), "matthews_corrcoef"),)),
    ("SST-2", ((("glue_sst2_v002",), "accuracy"),)),
    ("MRPC", ((("glue_mrpc_v002",), "f1"), (("glue_mrpc_v002",), "accuracy"))),
    ("STS-B", ((("glue_stsb_v002",), "pearson_corrcoef"),
               (("glue_stsb_v002",), "spearman_corrcoef"))),
    ("QQP", ((("glue_qqp_v002",), "f1"), (("glue_qqp_v002",), "accuracy"))),
    ("MNLI", ((_MNLI_MATCHED, "accuracy"), (_MNLI_MISMATCHED, "accuracy"))),
    ("QNLI", ((("glue_qnli_v002",), "accuracy"),)),
    ("RTE", ((("glue_rte_v002",), "accuracy"),)),
)
SUPER_GLUE_SCORE_GROUPS = (
    ("BoolQ", ((("super_glue_boolq_v102",), "accuracy"),)),
    ("CB", ((("super_glue_cb_v102",), "mean_3class_f1"), (("super_glue_cb_v102",), "accuracy"))),
    ("COPA", ((("super_glue_copa_v102",), "accuracy"),)),
    ("MultiRC", ((("super_glue_multirc_v102",), "f1"),
                 (("super_glue_multirc_v102",), "exact_match"))),
    ("ReCoRD", ((("super_glue_record_v102",), "f1"), (("super_glue_record_v102",), "em"))),
    ("RTE", ((("super_glue_rte_v102",), "accuracy"),)),
    ("WiC", ((("super_glue_wic_v102",), "accuracy"),)),
    ("WSC", ((("super_glue_wsc_v102",), "accuracy"),)),
)


def _with_suffix(alias: str, suffix: str) -> str:
    task, _, split = alias.partition("/")
    return task + suffix + (f"/{split}" if split else "")


def _benchmark_average(metrics_by_task: Mapping[str, Mapping], groups, suffix: str,
                       benchmark: str) -> float:
    group_means, missing = [], []
    for group, entries in groups:
        values = []
        for aliases, metric in entries:
            aliases = [_with_suffix(a, suffix) for a in aliases]
            found = next((metrics_by_task[a][metric] for a in aliases
                          if metric in metrics_by_task.get(a, {})), None)
            if found is None:
                missing.append(f"{group}: {metric!r} of {' or '.join(map(repr, aliases))}")
            else:
                values.append(float(found))
        if values:
            group_means.append(float(np.mean(values)))
    if missing:
        raise KeyError(f"The {benchmark} average needs every benchmark's metrics; missing "
                       + "; ".join(missing) + ".")
    return float(np.mean(group_means))


def glue_average(metrics_by_task: Mapping[str, Mapping], suffix: str = "") -> float:
    """The GLUE score as T5 computes it (``eval_utils.compute_avg_glue``).

    ``metrics_by_task``: ``{task name: {metric: value}}`` on the validation splits.
    The score is the mean over 8 datasets of the mean of each dataset's metrics:
    CoLA MCC; SST-2 accuracy; MRPC and QQP (F1 + accuracy) / 2; STS-B (Pearson +
    Spearman) / 2; MNLI (matched + mismatched accuracy) / 2; QNLI and RTE accuracy.
    WNLI is left out, as in T5. MNLI matched is read from ``glue_mnli_matched_v002``
    (T5's task name), ``glue_mnli_v002/validation_matched`` or ``glue_mnli_v002`` (its
    ``validation`` split is matched); mismatched from ``glue_mnli_mismatched_v002`` or
    ``glue_mnli_v002/validation_mismatched``. A missing metric raises ``KeyError``.
    """
    return _benchmark_average(metrics_by_task, GLUE_SCORE_GROUPS, suffix, "GLUE")


def super_glue_average(metrics_by_task: Mapping[str, Mapping], suffix: str = "") -> float:
    """The SuperGLUE score as T5 computes it: the mean over BoolQ, CB ((F1 + accuracy) /
    2), COPA, MultiRC ((F1 + EM) / 2), ReCoRD ((F1 + EM) / 2), RTE, WiC and WSC (our
    ``super_glue_wsc_v102`` accuracy; T5 used its ``wsc_simple`` task)."""
    return _benchmark_average(metrics_by_task, SUPER_GLUE_SCORE_GROUPS, suffix, "SuperGLUE")


def _register() -> None:
    if "glue_cola_v002" in TaskRegistry.names():
        return
    register_glue()


_register()
