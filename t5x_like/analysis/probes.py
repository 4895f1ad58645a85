"""Linear probes: how linearly one layer's word vectors encode a label (UPOS here), as in
Tenney et al. (2019), "BERT Rediscovers the Classical NLP Pipeline", and Liu et al.
(2019), "Linguistic Knowledge and Transferability of Contextual Representations".

A probe is multinomial logistic regression on standardized features (scikit-learn,
fixed seed), trained on one split's words and scored on another's. Two baselines
frame the numbers: the majority tag, and each word form's most frequent training tag
(what a lookup table of the vocabulary alone achieves; layer 0 should be near it).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

# Imports inside functions: scikit-learn loads only when a probe is fitted.


def probe_accuracy(train_x: np.ndarray, train_y: Sequence, test_x: np.ndarray, test_y: Sequence,
                   *, seed: int = 0, max_iter: int = 300, C: float = 1.0) -> float:
    """Test accuracy of a logistic-regression probe trained on ``train_x``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(),
                          LogisticRegression(C=C, max_iter=max_iter, random_state=seed))
    with warnings.catch_warnings():
        # A probe stopped at max_iter is still a linear probe; its score is what counts.
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe.fit(np.asarray(train_x, np.float32), np.asarray(train_y))
    return float((probe.predict(np.asarray(test_x, np.float32)) == np.asarray(test_y)).mean())


def probe_by_layer(train_x: np.ndarray, train_y: Sequence, test_x: np.ndarray,
                   test_y: Sequence, **options) -> list[float]:
    """``train_x``/``test_x``: ``[N, n_layers, d]``; accuracy per layer."""
    return [probe_accuracy(train_x[:, k], train_y, test_x[:, k], test_y, **options)
            for k in range(train_x.shape[1])]


def majority_baseline(train_y: Sequence, test_y: Sequence) -> float:
    tag = Counter(train_y).most_common(1)[0][0]
    return float(np.mean(np.asarray(test_y) == tag))


def word_form_baseline(train_words: Sequence[str], train_y: Sequence, test_words: Sequence[str],
                       test_y: Sequence) -> float:
    """Each test word gets its form's most frequent training tag (unseen forms: the
    majority tag)."""
    by_form: dict[str, Counter] = defaultdict(Counter)
    for word, tag in zip(train_words, train_y, strict=False):
        by_form[word][tag] += 1
    fallback = Counter(train_y).most_common(1)[0][0]
    guesses = [by_form[w].most_common(1)[0][0] if w in by_form else fallback for w in test_words]
    return float(np.mean(np.asarray(guesses) == np.asarray(test_y)))
