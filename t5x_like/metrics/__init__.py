"""Metric functions with seqio's signature: ``fn(targets, predictions) -> {name: value}``.

Thin wrappers over maintained libraries (scikit-learn, scipy, sacrebleu,
rouge-score), with the names and the 0-100 scale of ``t5.evaluation.metrics``
so numbers compare with T5's papers and seqio runs. Score metrics
(``fn(targets, scores)``) follow at the end. The libraries are imported on
first use; the project's base install brings them.
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import re
import string
from collections.abc import Callable, Sequence

import numpy as np

from t5x_like.errors import install_hint

MetricFn = Callable[[Sequence, Sequence], dict]


PACKAGES = {"sklearn": "scikit-learn", "scipy": "scipy", "sacrebleu": "sacrebleu",
            "rouge_score": "rouge-score"}
INSTALL = install_hint()


def _need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        package = PACKAGES.get(module.split(".")[0], module.split(".")[0])
        raise ImportError(f"This metric needs {package}, which the project's install brings: "
                          f"{INSTALL}") from None


def _requires(*modules: str):
    """Marks a metric with the modules it imports, so evaluation can check them before
    any model work (``missing_packages``)."""
    def mark(fn):
        fn.requires = modules
        return fn
    return mark


def missing_packages(metric_fns) -> list[str]:
    """The pip packages ``metric_fns`` need that are not installed (by ``_requires``)."""
    missing = []
    for fn in metric_fns:
        for module in getattr(fn, "requires", ()):
            package = PACKAGES.get(module, module)
            if importlib.util.find_spec(module) is None and package not in missing:
                missing.append(package)
    return missing


# -- classification ----------------------------------------------------------------------------

@_requires("sklearn")
def accuracy(targets, predictions) -> dict:
    metrics = _need("sklearn.metrics")
    return {"accuracy": 100.0 * metrics.accuracy_score(list(targets), list(predictions))}


def _binary_with_invalid(targets, predictions):
    """T5's rule for unparseable predictions (-1): anything but 0 or 1 counts as wrong.

    Validity is judged before any cast, so 0.5 is invalid (not truncated to 0).
    """
    targets = np.asarray(list(targets), dtype=np.int64)
    predictions = np.asarray(list(predictions))
    invalid = ~np.isin(predictions, [0, 1])
    predictions = np.where(invalid, 1 - targets, predictions).astype(np.int64)
    return targets, predictions


@_requires("sklearn")
def f1_score_with_invalid(targets, predictions) -> dict:
    """Binary F1 of class 1; predictions outside {0, 1} are counted as wrong (T5)."""
    metrics = _need("sklearn.metrics")
    targets, predictions = _binary_with_invalid(targets, predictions)
    return {"f1": 100.0 * metrics.f1_score(targets, predictions, zero_division=0.0)}


def mean_multiclass_f1(num_classes: int) -> MetricFn:
    """Macro F1 over ``num_classes`` labels (T5's ``mean_{n}class_f1``); labels are ints."""

    @_requires("sklearn")
    def metric_fn(targets, predictions) -> dict:
        metrics = _need("sklearn.metrics")
        return {f"mean_{num_classes}class_f1": 100.0 * metrics.f1_score(
            list(targets), list(predictions), labels=list(range(num_classes)), average="macro",
            zero_division=0.0)}
    metric_fn.__name__ = f"mean_{num_classes}class_f1"
    return metric_fn


@_requires("sklearn")
def macro_f1(targets, predictions) -> dict:
    """Macro F1 over the labels that occur in the targets (any hashable labels)."""
    metrics = _need("sklearn.metrics")
    labels = sorted(set(targets), key=str)
    return {"macro_f1": 100.0 * metrics.f1_score(list(targets), list(predictions), labels=labels,
                                                 average="macro", zero_division=0.0)}


@_requires("sklearn")
def matthews_corrcoef(targets, predictions) -> dict:
    metrics = _need("sklearn.metrics")
    return {"matthews_corrcoef": 100.0 * metrics.matthews_corrcoef(list(targets),
                                                                   list(predictions))}


@_requires("scipy")
def pearson_corrcoef(targets, predictions) -> dict:
    stats = _need("scipy.stats")
    return {"pearson_corrcoef": 100.0 * float(stats.pearsonr(
        np.asarray(targets, float), np.asarray(predictions, float))[0])}


@_requires("scipy")
def spearman_corrcoef(targets, predictions) -> dict:
    stats = _need("scipy.stats")
    return {"spearman_corrcoef": 100.0 * float(stats.spearmanr(
        np.asarray(targets, float), np.asarray(predictions, float))[0])}


def sequence_accuracy(targets, predictions) -> dict:
    """Percent of predictions equal to their target string."""
    same = [t == p for t, p in zip(targets, predictions, strict=True)]
    return {"sequence_accuracy": 100.0 * float(np.mean(same)) if same else 0.0}


def token_accuracy(targets, predictions) -> dict:
    """Percent of target tokens (whitespace-separated, e.g. POS tags) predicted at their
    position; a prediction that is too short counts the missing tokens as wrong."""
    correct = total = 0
    for target, prediction in zip(targets, predictions, strict=True):
        target_tokens = target.split() if isinstance(target, str) else list(target)
        predicted = prediction.split() if isinstance(prediction, str) else list(prediction)
        total += len(target_tokens)
        correct += sum(t == p for t, p in zip(target_tokens, predicted, strict=False))
    return {"token_accuracy": 100.0 * correct / max(total, 1)}


# -- generation --------------------------------------------------------------------------------

def _reference_streams(targets) -> list[list]:
    """Per-example references (a string or a list of them) -> sacrebleu's reference
    streams; an example with fewer references gets ``None`` (sacrebleu skips it) rather
    than the other examples' extra references being dropped."""
    targets = [[t] if isinstance(t, str) else list(t) for t in targets]
    return [list(r) for r in itertools.zip_longest(*targets, fillvalue=None)]


@_requires("sacrebleu")
def bleu(targets, predictions, tokenize: str = "intl") -> dict:
    """Corpus BLEU with sacrebleu, T5's settings (``intl`` tokenizer, exp smoothing)."""
    sacrebleu = _need("sacrebleu")
    result = sacrebleu.corpus_bleu(list(predictions), _reference_streams(targets),
                                   smooth_method="exp", smooth_value=0.0, force=False,
                                   lowercase=False, tokenize=tokenize, use_effective_order=False)
    return {"bleu": float(result.score)}


@_requires("sacrebleu")
def chrf(targets, predictions) -> dict:
    sacrebleu = _need("sacrebleu")
    return {"chrf": float(sacrebleu.corpus_chrf(list(predictions),
                                                _reference_streams(targets)).score)}


@_requires("rouge_score")
def rouge(targets, predictions, score_keys=("rouge1", "rouge2", "rougeLsum")) -> dict:
    """F-measures averaged over examples (rougeLsum splits on newlines), as T5's ``rouge``.

    T5 reports the median of 1000 bootstrap resamples of that mean (rouge-score's
    ``BootstrapAggregator`` ``mid``, unseeded); this is the mean itself, deterministic
    and within that resampling noise of T5's number.
    """
    rouge_scorer = _need("rouge_score.rouge_scorer")
    scorer = rouge_scorer.RougeScorer(list(score_keys))

    def with_newlines(text: str) -> str:  # rougeLsum reads summary sentences from lines
        return text.replace(" . ", " .\n")

    totals = collections.defaultdict(float)
    count = 0
    for target, prediction in zip(targets, predictions, strict=True):
        scores = scorer.score(with_newlines(target), with_newlines(prediction))
        for key in score_keys:
            totals[key] += scores[key].fmeasure
        count += 1
    return {key: 100.0 * totals[key] / max(count, 1) for key in score_keys}


# -- SQuAD-style exact match and F1 --------------------------------------------------------------

def normalize_squad(answer: str) -> str:
    """SQuAD v1.1's answer normalisation: lower case, no punctuation, articles or extra spaces."""
    answer = answer.lower()
    answer = "".join(ch for ch in answer if ch not in set(string.punctuation))
    answer = re.sub(r"\b(a|an|the)\b", " ", answer)
    return " ".join(answer.split())


def _token_f1(target: str, prediction: str) -> float:
    target_tokens, predicted = target.split(), prediction.split()
    common = collections.Counter(target_tokens) & collections.Counter(predicted)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(target_tokens)
    return 2 * precision * recall / (precision + recall)


def squad(targets, predictions) -> dict:
    """Exact match and token F1 against the best of each example's answers (0-100)."""
    em = f1 = 0.0
    count = 0
    for answers, prediction in zip(targets, predictions, strict=True):
        answers = [answers] if isinstance(answers, str) else list(answers)
        prediction = normalize_squad(prediction)
        answers = [normalize_squad(a) for a in answers]
        em += max(float(a == prediction) for a in answers)
        f1 += max(_token_f1(a, prediction) for a in answers)
        count += 1
    return {"em": 100.0 * em / max(count, 1), "f1": 100.0 * f1 / max(count, 1)}


# -- score metrics: fn(targets, scores) -------------------------------------------------------

def mean_log_likelihood(targets, scores) -> dict:
    """Mean summed log-likelihood of the targets (what ``score`` mode returns per example)."""
    scores = np.asarray(scores, float)
    return {"mean_log_likelihood": float(scores.mean()) if scores.size else 0.0}
