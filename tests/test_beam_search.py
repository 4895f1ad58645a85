import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.models import decoding

EOS = 1


def markov_step_fn(table):
    """A 'model' whose next-token logits depend only on the previous token."""
    table = jnp.asarray(table, jnp.float32)

    def step_fn(tokens, cache):
        return table[tokens], cache
    return step_fn


def exhaustive_best(table, max_length, alpha):
    """Best over sequences ending in EOS, and over EOS-free ones cut at max_length."""
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(table, jnp.float32)))
    vocab = table.shape[0]
    non_eos = [t for t in range(vocab) if t != EOS]
    candidates = [list(body) + [EOS] for length in range(1, max_length + 1)
                  for body in itertools.product(non_eos, repeat=length - 1)]
    candidates += [list(seq) for seq in itertools.product(non_eos, repeat=max_length)]
    best, best_seq = -np.inf, None
    for seq in candidates:
        prev, total = 0, 0.0
        for token in seq:
            total += logp[prev, token]
            prev = token
        score = total / ((5.0 + len(seq)) / 6.0) ** alpha
        if score > best:
            best, best_seq = score, seq
    return best, best_seq


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_finds_the_exhaustive_optimum(alpha, seed):
    table = np.random.default_rng(seed).normal(0, 2.0, size=(5, 5))
    best, best_seq = exhaustive_best(table, 3, alpha)
    seqs, scores = decoding.beam_search(markov_step_fn(table), {}, batch_size=1, num_beams=64,
                                        max_decode_length=3, alpha=alpha, eos_id=EOS)
    np.testing.assert_allclose(float(scores[0, 0]), best, rtol=1e-5)
    assert np.asarray(seqs[0, 0]).tolist()[: len(best_seq)] == best_seq
    assert np.all(np.diff(np.asarray(scores[0])) <= 1e-6)  # best first


def test_beam_beats_greedy_when_the_likely_first_token_is_a_trap():
    # From the start (0): token 2 (p~.6) or token 3 (p~.4). After 2 every token is
    # unlikely; after 3, EOS is almost certain. Greedy takes 2; a beam of 2 finds 3, EOS.
    neg = -20.0
    table = np.full((5, 5), neg)
    table[0, 2], table[0, 3] = np.log(0.6), np.log(0.4)
    table[2, :] = np.log(0.2)
    table[3, EOS] = 0.0
    table[4, EOS] = 0.0
    seqs, _ = decoding.beam_search(markov_step_fn(table), {}, batch_size=1, num_beams=2,
                                   max_decode_length=4, alpha=0.0, eos_id=EOS)
    assert np.asarray(seqs[0, 0]).tolist()[:2] == [3, EOS]


def test_beams_of_different_batch_rows_stay_separate():
    table_a = np.random.default_rng(5).normal(0, 2.0, size=(5, 5))
    # Batch of two identical rows must give identical results, row by row.
    seqs, scores = decoding.beam_search(markov_step_fn(table_a), {}, batch_size=2, num_beams=4,
                                        max_decode_length=4, alpha=0.6, eos_id=EOS)
    np.testing.assert_array_equal(seqs[0], seqs[1])
    np.testing.assert_array_equal(scores[0], scores[1])


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_cache_rows_follow_their_beams(seed):
    # Second-order model: logits depend on the last two tokens, and the older one is
    # only in the cache. A cache row that did not follow its beam changes the scores.
    vocab, k, length = 6, 16, 3
    table = np.random.default_rng(seed).normal(0, 2.0, size=(vocab, vocab, vocab))
    table[:, :, EOS] = -40.0  # never finish: all paths have full length
    table[:, :, 0] = -40.0    # never emit the start id, so it cannot hide a wrong row

    def step_fn(tokens, cache):
        older = cache["previous"]
        logits = jnp.asarray(table, jnp.float32)[older, tokens]
        return logits, {"previous": tokens}

    cache = {"previous": jnp.zeros((k,), jnp.int32)}
    seqs, scores = decoding.beam_search(step_fn, cache, batch_size=1, num_beams=k,
                                        max_decode_length=length, alpha=0.0, eos_id=EOS)
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(table, jnp.float32)))
    paths = []
    for seq in itertools.product(range(2, vocab), repeat=length):
        older, prev, total = 0, 0, 0.0
        for token in seq:
            total += logp[older, prev, token]
            older, prev = prev, token
        paths.append((total, list(seq)))
    paths.sort(key=lambda path: -path[0])
    # 16 beams hold all 4**2 two-token prefixes, so the k best 3-token paths are exact.
    np.testing.assert_allclose(np.asarray(scores[0]), [p[0] for p in paths[:k]], rtol=1e-5)
    assert np.asarray(seqs[0]).tolist() == [p[1] for p in paths[:k]]


def test_negative_alpha_is_refused():
    with pytest.raises(ValueError, match="alpha=-1"):
        decoding.beam_search(markov_step_fn(np.zeros((3, 3))), {}, batch_size=1, num_beams=2,
                             max_decode_length=2, alpha=-1.0)
