"""Every metric in ``t5x_like.metrics`` equals the library it wraps, called directly
(x100), on fixed inputs; T5's rules (invalid predictions, SQuAD normalisation) by hand."""

import inspect

import numpy as np
import pytest
import sacrebleu
import sklearn.metrics as sklearn_metrics
from rouge_score import rouge_scorer
from scipy import stats

from t5x_like import metrics

RNG = np.random.default_rng(0)
BINARY_TARGETS = RNG.integers(0, 2, 60).tolist()
BINARY_PREDICTIONS = [t if RNG.random() < 0.7 else 1 - t for t in BINARY_TARGETS]
CLASS_TARGETS = RNG.integers(0, 3, 60).tolist()
CLASS_PREDICTIONS = [t if RNG.random() < 0.6 else int(RNG.integers(-1, 3)) for t in CLASS_TARGETS]
SCORES_A = RNG.normal(size=40)
SCORES_B = SCORES_A + RNG.normal(scale=0.8, size=40)
SCORES_B[:5] = SCORES_B[5:10]  # ties, for Spearman's ranks

REFERENCES = ["the cat sat on the mat .", "a quick brown fox jumps over the lazy dog",
              "it is raining today in the city . bring an umbrella .", "hello world"]
HYPOTHESES = ["the cat is on the mat .", "the quick brown fox jumped over a lazy dog",
              "it rains in the city today . take an umbrella .", "goodbye world"]

TESTED = {"accuracy", "f1_score_with_invalid", "mean_multiclass_f1", "macro_f1",
          "matthews_corrcoef", "pearson_corrcoef", "spearman_corrcoef", "sequence_accuracy",
          "token_accuracy", "bleu", "chrf", "rouge", "normalize_squad", "squad",
          "mean_log_likelihood", "missing_packages"}


def test_every_public_metric_is_tested_here():
    public = {name for name, fn in inspect.getmembers(metrics, inspect.isfunction)
              if fn.__module__ == metrics.__name__ and not name.startswith("_")}
    assert public == TESTED


def test_classification_metrics_equal_sklearn():
    assert metrics.accuracy(BINARY_TARGETS, BINARY_PREDICTIONS) == pytest.approx(
        {"accuracy": 100 * sklearn_metrics.accuracy_score(BINARY_TARGETS, BINARY_PREDICTIONS)})
    assert metrics.accuracy(["a", "b", "c"], ["a", "b", "x"])["accuracy"] == pytest.approx(200 / 3)
    assert metrics.f1_score_with_invalid(BINARY_TARGETS, BINARY_PREDICTIONS) == pytest.approx(
        {"f1": 100 * sklearn_metrics.f1_score(BINARY_TARGETS, BINARY_PREDICTIONS)})
    assert metrics.matthews_corrcoef(CLASS_TARGETS, CLASS_PREDICTIONS) == pytest.approx(
        {"matthews_corrcoef": 100 * sklearn_metrics.matthews_corrcoef(CLASS_TARGETS,
                                                                      CLASS_PREDICTIONS)})
    mean_f1 = metrics.mean_multiclass_f1(3)
    assert mean_f1.__name__ == "mean_3class_f1"
    assert mean_f1(CLASS_TARGETS, CLASS_PREDICTIONS) == pytest.approx({
        "mean_3class_f1": 100 * sklearn_metrics.f1_score(
            CLASS_TARGETS, CLASS_PREDICTIONS, labels=[0, 1, 2], average="macro")})
    words = {-1: "?", 0: "entailment", 1: "neutral", 2: "contradiction"}
    targets = [words[t] for t in CLASS_TARGETS]
    predictions = [words[p] for p in CLASS_PREDICTIONS]
    assert metrics.macro_f1(targets, predictions) == pytest.approx({
        "macro_f1": 100 * sklearn_metrics.f1_score(
            targets, predictions, labels=sorted(set(targets)), average="macro")})


def test_f1_score_with_invalid_counts_invalid_predictions_as_wrong():
    targets = [0, 1, 1, 0, 1, 0]
    predictions = [0, 1, -1, -1, 0.5, 1]
    # Invalid -> the opposite of the target: [0, 1, 0, 1, 0, 1]: tp 1, fp 2, fn 2.
    assert metrics.f1_score_with_invalid(targets, predictions)["f1"] == pytest.approx(
        100 * sklearn_metrics.f1_score(targets, [0, 1, 0, 1, 0, 1]))
    assert metrics.f1_score_with_invalid(targets, predictions)["f1"] == pytest.approx(100 / 3)
    assert metrics.f1_score_with_invalid([1, 1], [-1, None])["f1"] == 0.0
    assert metrics.f1_score_with_invalid([0, 1], [0, 1])["f1"] == 100.0
    assert metrics.f1_score_with_invalid([0, 0], [-1, -1])["f1"] == 0.0  # no positives at all


def test_correlations_equal_scipy():
    assert metrics.pearson_corrcoef(SCORES_A, SCORES_B)["pearson_corrcoef"] == pytest.approx(
        100 * stats.pearsonr(SCORES_A, SCORES_B)[0])
    assert metrics.spearman_corrcoef(list(SCORES_A), list(SCORES_B))["spearman_corrcoef"] == (
        pytest.approx(100 * stats.spearmanr(SCORES_A, SCORES_B)[0]))
    assert metrics.pearson_corrcoef([1, 2, 3], [2, 4, 6])["pearson_corrcoef"] == pytest.approx(100)
    assert metrics.spearman_corrcoef([1, 2, 3], [9, 4, 1])["spearman_corrcoef"] == pytest.approx(
        -100)


def test_sequence_and_token_accuracy():
    assert metrics.sequence_accuracy(["a b", "c", "d"], ["a b", "c ", "d"]) == pytest.approx(
        {"sequence_accuracy": 200 / 3})
    assert metrics.sequence_accuracy([], []) == {"sequence_accuracy": 0.0}
    # 3 + 2 target tags; right: DT NN (2 of 3, the missing VB is wrong), then 1 of 2.
    targets = ["DT NN VB", "PRP VB"]
    predictions = ["DT NN", "PRP NN JJ"]
    assert metrics.token_accuracy(targets, predictions) == pytest.approx(
        {"token_accuracy": 100 * 3 / 5})
    assert metrics.token_accuracy([["B", "I", "O"]], [["B", "O", "O"]]) == pytest.approx(
        {"token_accuracy": 200 / 3})


def test_bleu_and_chrf_equal_sacrebleu():
    want = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], smooth_method="exp", smooth_value=0.0,
                                 force=False, lowercase=False, tokenize="intl",
                                 use_effective_order=False).score
    assert metrics.bleu(REFERENCES, HYPOTHESES)["bleu"] == pytest.approx(want)
    assert metrics.bleu(REFERENCES, REFERENCES)["bleu"] == pytest.approx(100)
    assert metrics.chrf(REFERENCES, HYPOTHESES)["chrf"] == pytest.approx(
        sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    # Several references per example, not the same number for each.
    multi = [[REFERENCES[0], HYPOTHESES[0]], [REFERENCES[1]], [REFERENCES[2], "x y z"],
             [REFERENCES[3]]]
    streams = [[m[0] for m in multi], [m[1] if len(m) > 1 else None for m in multi]]
    assert metrics.bleu(multi, HYPOTHESES)["bleu"] == pytest.approx(sacrebleu.corpus_bleu(
        HYPOTHESES, streams, smooth_method="exp", smooth_value=0.0, tokenize="intl").score)
    assert metrics.chrf(multi, HYPOTHESES)["chrf"] == pytest.approx(
        sacrebleu.corpus_chrf(HYPOTHESES, streams).score)
    assert metrics.bleu(multi, HYPOTHESES)["bleu"] > metrics.bleu(REFERENCES, HYPOTHESES)["bleu"]


def test_rouge_is_the_mean_f_measure_of_rouge_score():
    keys = ("rouge1", "rouge2", "rougeLsum")
    scorer = rouge_scorer.RougeScorer(list(keys))
    scores = [scorer.score(t.replace(" . ", " .\n"), p.replace(" . ", " .\n"))
              for t, p in zip(REFERENCES, HYPOTHESES, strict=False)]
    want = {k: 100 * float(np.mean([s[k].fmeasure for s in scores])) for k in keys}
    assert metrics.rouge(REFERENCES, HYPOTHESES) == pytest.approx(want)
    assert metrics.rouge(REFERENCES, HYPOTHESES, score_keys=("rougeL",)) == pytest.approx(
        {"rougeL": 100 * float(np.mean([rouge_scorer.RougeScorer(["rougeL"]).score(t, p)[
            "rougeL"].fmeasure for t, p in zip(REFERENCES, HYPOTHESES, strict=False)]))})
    # rougeLsum reads sentences from lines: " . " starts a new one.
    two_sentences = metrics.rouge(["b c . a"], ["a . b c"], score_keys=("rougeL", "rougeLsum"))
    assert two_sentences["rougeLsum"] > two_sentences["rougeL"]


@pytest.mark.parametrize("answers, prediction, em, f1", [
    (["The Eiffel Tower"], "eiffel tower", 100.0, 100.0),  # case and articles
    (["Paris"], "Paris, France.", 0.0, 100 * 2 / 3),  # precision 1/2, recall 1
    (["Barack Obama", "Obama"], "obama", 100.0, 100.0),  # the best answer counts
    (["New York City"], "york", 0.0, 50.0),  # precision 1, recall 1/3
    (["1,000 people"], "1000 people", 100.0, 100.0),  # punctuation is dropped, not spaced
    (["red"], "blue", 0.0, 0.0),
    ("a cat", "the cat!", 100.0, 100.0),  # one answer as a plain string
])
def test_squad_em_and_f1_by_hand(answers, prediction, em, f1):
    assert metrics.squad([answers], [prediction]) == pytest.approx({"em": em, "f1": f1})


def test_squad_averages_over_examples_and_normalizes_like_squad_v1():
    assert metrics.normalize_squad("  The  Cat's hat, an  apple!") == "cats hat apple"
    got = metrics.squad([["Paris"], ["red"], ["New York City"]], ["paris", "blue", "york"])
    assert got == pytest.approx({"em": 100 / 3, "f1": (100 + 0 + 50) / 3})


def test_mean_log_likelihood():
    assert metrics.mean_log_likelihood([None] * 3, [-1.0, -2.0, -6.0]) == pytest.approx(
        {"mean_log_likelihood": -3.0})
    assert metrics.mean_log_likelihood([], []) == {"mean_log_likelihood": 0.0}


def test_missing_packages_names_what_a_metric_imports(monkeypatch):
    import importlib.util
    fns = [metrics.accuracy, metrics.bleu, metrics.rouge, metrics.mean_multiclass_f1(3),
           metrics.sequence_accuracy]
    assert metrics.missing_packages(fns) == []  # the base install brings them
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name in ("sklearn", "rouge_score") else real(name))
    assert metrics.missing_packages(fns) == ["scikit-learn", "rouge-score"]
