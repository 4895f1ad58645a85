"""GPT-3-style k-shot prompts and lm-evaluation-harness's log-likelihood requests.

The conventions are lm-evaluation-harness's, so our decoder numbers compare with
the ones users already trust:

- a demonstration is ``context + " " + answer``; demonstrations are joined by a
  blank line and followed by one before the example's own context;
- demonstrations come from the train split through ``random.Random(seed)``
  (seed 1234 as the harness's default), drawn in order over the evaluated
  examples, so the same seed gives the same prompts;
- a choice's continuation is ``" " + choice``; its tokens are those of
  ``enc(context + " " + choice)`` that follow ``enc(context)`` (SentencePiece
  merges across the boundary), conditioned on ``enc(context)``; an empty context
  is replaced by EOS;
- ``acc`` picks the choice with the highest summed log-probability, ``acc_norm``
  the highest sum divided by the choice's length in characters.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

FEW_SHOT_DELIMITER = "\n\n"
TARGET_DELIMITER = " "
DEFAULT_SEED = 1234


@dataclasses.dataclass(frozen=True)
class Demonstration:
    context: str
    answer: str

    def text(self) -> str:
        return self.context + TARGET_DELIMITER + self.answer


class FewShotSampler:
    """Draws ``k`` demonstrations per evaluated example from a fixed pool."""

    def __init__(self, pool: Sequence[Demonstration], num_shots: int, seed: int = DEFAULT_SEED):
        if num_shots < 0:
            raise ValueError(f"num_shots={num_shots} must be >= 0.")
        if num_shots > len(pool):
            raise ValueError(f"num_shots={num_shots} but the train split holds only {len(pool)} "
                             "demonstrations; lower --num_shots.")
        self.pool = list(pool)
        self.num_shots = num_shots
        self._rng = random.Random(seed)

    def prompt(self, context: str) -> str:
        """The k demonstrations, then ``context``; the next draw continues the sequence."""
        if self.num_shots == 0:
            return context
        shots = self._rng.sample(self.pool, self.num_shots)
        return (FEW_SHOT_DELIMITER.join(s.text() for s in shots) + FEW_SHOT_DELIMITER
                + context)


def split_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    """Moves trailing whitespace of the context onto the continuation (the harness does)."""
    stripped = context.rstrip()
    return stripped, context[len(stripped):] + continuation


def empty_context_id(vocabulary) -> int:
    """What an empty context is scored (or a prompt continued) after: the vocabulary's
    BOS, else its EOS, as lm-eval's ``hf`` model chooses its prefix token."""
    bos = getattr(vocabulary, "bos_id", None)
    return int(bos) if bos is not None and bos >= 0 else int(vocabulary.eos_id)


def loglikelihood_request(vocabulary, context: str, choice: str, prefix: Sequence[int] = ()
                          ) -> tuple[list[int], list[int]]:
    """``(context tokens, continuation tokens)`` for scoring ``choice`` after ``context``,
    as lm-eval's ``hf`` model encodes them: each text framed by the tokenizer's template
    (``prefix``, e.g. a decoder run's start id); an empty context is the vocabulary's BOS,
    else its EOS."""
    context, continuation = split_trailing_space(context, TARGET_DELIMITER + choice)
    if not context:
        return [empty_context_id(vocabulary)], [*prefix, *vocabulary.encode(continuation)]
    whole = [*prefix, *vocabulary.encode(context + continuation)]
    context_tokens = [*prefix, *vocabulary.encode(context)]
    return context_tokens, whole[len(context_tokens):]


def request_row(context_tokens: Sequence[int], continuation_tokens: Sequence[int], width: int
                ) -> dict[str, np.ndarray]:
    """A decoder batch row scoring the continuation: inputs are all tokens but the last,
    targets all but the first, weights on the continuation; cut from the left to fit
    ``width`` as the harness does."""
    tokens = (list(context_tokens) + list(continuation_tokens))[-(width + 1):]
    n = len(continuation_tokens)
    if n == 0:
        raise ValueError("A choice encodes to no tokens after its context; it cannot be scored.")
    if n > width:
        raise ValueError(f"A continuation of {n} tokens does not fit the scoring width {width}; "
                         "raise task_feature_lengths.")
    inputs, targets = tokens[:-1], tokens[1:]
    row = {"decoder_input_tokens": np.zeros(width, np.int32),
           "decoder_target_tokens": np.zeros(width, np.int32),
           "decoder_loss_weights": np.zeros(width, np.float32),
           # Attention must not treat token id 0 as padding: positions say what is real.
           "decoder_segment_ids": np.zeros(width, np.int32),
           "decoder_positions": np.zeros(width, np.int32)}
    length = len(inputs)
    row["decoder_input_tokens"][:length] = inputs
    row["decoder_target_tokens"][:length] = targets
    row["decoder_loss_weights"][length - n:length] = 1.0
    row["decoder_segment_ids"][:length] = 1
    row["decoder_positions"][:length] = np.arange(length)
    return row


def prompt_row(prompt_tokens: Sequence[int], width: int) -> dict[str, np.ndarray]:
    """A decoder batch row whose generation continues ``prompt_tokens`` (at most
    ``width``): a decoder's prompt is its input tokens up to the first weighted
    position, so the one weight sits on the prompt's last token (the target there is
    what is generated; the row holds a placeholder)."""
    length = len(prompt_tokens)
    if not 0 < length <= width:
        raise ValueError(f"A prompt of {length} tokens does not fit width {width}.")
    row = request_row(prompt_tokens, [0], width + 1)  # inputs: the whole prompt
    row = {k: v[:width] for k, v in row.items()}
    return row


def choose(scores: Sequence[float], choices: Sequence[str]) -> tuple[int, int]:
    """``(acc choice, acc_norm choice)``: argmax of the sums and of sums per character."""
    scores = np.asarray(scores, np.float64)
    lengths = np.asarray([max(len(c), 1) for c in choices], np.float64)
    return int(np.argmax(scores)), int(np.argmax(scores / lengths))
