"""Completions of one loaded decoder: a request's prompt tokens in, its new tokens, text,
finish reason and log-probabilities out, as the OpenAI API reports them.

Each request decodes on its own (one at a time: the model is held by a lock), so what it
gets never depends on what else the server is answering: greedy tokens are the model's
argmax chain, and a sampled request draws from its own seed (a fresh one when it gives
none). The lengths a program is
compiled for are bucketed (``loaded_lm.bucket``: prompt widths and new-token counts), so
a server compiles a few programs, not one per request.

The prompt is read as the harness reads a context: its tokens as given, no BOS added; an
empty prompt starts from EOS (lm-eval's prefix token).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading

import numpy as np

from t5x_like.evaluation import few_shot, loaded_lm
from t5x_like.serving.protocol import RequestError, Sampling

# How EOS reads among a completion's log-probabilities (a vocabulary decodes it to nothing).
EOS_TEXT = "</s>"


@dataclasses.dataclass
class Completion:
    """One answered prompt: ``prompt`` and ``tokens`` (the new ones, cut at EOS or a stop
    sequence), ``text`` (the new tokens' text, cut before the stop sequence), why it
    ended (``stop``: EOS or a stop sequence; ``length``: ``max_tokens``), and with
    ``logprobs`` asked, each reported token's text, log-probability and alternatives
    (the prompt's first, with ``echo``)."""

    prompt: list[int]
    tokens: list[int]
    text: str
    finish_reason: str
    token_texts: list[str] = dataclasses.field(default_factory=list)
    token_logprobs: list[float | None] = dataclasses.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = dataclasses.field(default_factory=list)


class Completer:
    """Answers completion requests with ``loaded`` (a ``loaded_lm.LoadedModel``)."""

    def __init__(self, loaded: loaded_lm.LoadedModel):
        self.loaded = loaded
        self.vocabulary = loaded.vocabulary
        self.window = loaded.max_length
        self.eos = int(self.vocabulary.eos_id)
        self._lock = threading.Lock()

    # -- tokens in ------------------------------------------------------------------------
    def encode(self, prompt: str | tuple[int, ...]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.vocabulary.encode(prompt))
        size = int(self.vocabulary.vocab_size)
        if max(prompt) >= size:
            raise RequestError(f"The prompt holds token id {max(prompt)}; this model's "
                               f"vocabulary has {size} ids (0 to {size - 1}).", "prompt")
        return list(prompt)

    def check_fits(self, prompt: list[int], sampling: Sampling) -> Sampling:
        """``sampling`` with ``max_tokens`` filled in (-1: the rest of the context), or a
        refusal when the prompt and the new tokens exceed the context: never cut
        silently."""
        room = self.window - max(len(prompt), 1)
        max_tokens = room if sampling.max_tokens < 0 else sampling.max_tokens
        if room < 0 or max_tokens > room:
            raise RequestError(
                f"This model's context is {self.window} tokens; the prompt has {len(prompt)} "
                f"and max_tokens is {max_tokens}: shorten the prompt or lower max_tokens.",
                "max_tokens" if room >= 0 else "prompt", code="context_length_exceeded")
        return dataclasses.replace(sampling, max_tokens=max_tokens)

    # -- one request ----------------------------------------------------------------------
    def complete(self, prompt: list[int], sampling: Sampling) -> Completion:
        """``prompt``'s completion (``sampling`` checked by ``check_fits``)."""
        with self._lock:
            start = prompt or [self.eos]
            new = self._generate(start, sampling) if sampling.max_tokens else []
            tokens, text, finish = self._cut(new, sampling)
            out = Completion(list(prompt), tokens, text, finish)
            if sampling.logprobs is not None:
                self._add_logprobs(out, start, sampling)
            return out

    def _generate(self, prompt: list[int], sampling: Sampling) -> list[int]:
        runner, loaded = self.loaded.runner, self.loaded
        steps = loaded_lm.bucket(sampling.max_tokens, self.window - len(prompt))
        width = loaded_lm.bucket(len(prompt), self.window - steps)
        decode = {"num_beams": 1, "temperature": sampling.temperature}
        if sampling.temperature:
            decode.update(top_k=sampling.top_k, top_p=sampling.top_p)
        # Unseeded, a sampled request draws a fresh seed (as OpenAI's does); seeded, the
        # same request gives the same tokens.
        seed = secrets.randbits(31) if sampling.seed is None else sampling.seed
        row = few_shot.prompt_row(prompt, width)
        generated = runner.predict_rows(loaded.params, [row], steps, seed=seed, **decode)[0]
        return np.asarray(generated).tolist()[:sampling.max_tokens]

    def _cut(self, new: list[int], sampling: Sampling) -> tuple[list[int], str, str]:
        """The new tokens up to EOS or the first stop sequence, their text, and why the
        completion ended."""
        finish = "length"
        if self.eos in new:
            new, finish = new[:new.index(self.eos)], "stop"
        text = self.vocabulary.decode(new)
        hits = [text.find(s) for s in sampling.stop if s in text]
        if not hits:
            return new, text, finish
        end = min(hits)
        kept = next(k for k in range(len(new) + 1) if len(self.vocabulary.decode(new[:k])) > end
                    or k == len(new))
        return new[:kept], text[:end], "stop"

    def _add_logprobs(self, out: Completion, start: list[int], sampling: Sampling) -> None:
        """Each reported token's log-probability under the model (not the sampling
        temperature) and its ``sampling.logprobs`` most likely alternatives: the new
        tokens, after the prompt's with ``echo`` (its first token has none)."""
        tokens = start + out.tokens
        scored = len(tokens) - 1
        values = np.zeros((0,)), np.zeros((0, 0), np.int64), np.zeros((0, 0))
        if scored:
            width = loaded_lm.bucket(scored, self.window)
            row = few_shot.request_row(tokens[:1], tokens[1:], width)
            values = [v[0][:scored] for v in self.loaded.runner.token_rows(self.loaded.params,
                                                                            [row])]
        logprob, top_ids, top_values = values
        first = 0 if sampling.echo else len(start)
        for i in range(first, len(tokens)):
            if sampling.echo and not out.prompt and i == 0:
                continue  # the EOS an empty prompt starts from is not the prompt's
            out.token_texts.append(self.piece(tokens[i]))
            if i == 0:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(float(logprob[i - 1]))
            alternatives = {}
            for token, value in zip(top_ids[i - 1][:sampling.logprobs],
                                    top_values[i - 1][:sampling.logprobs], strict=True):
                alternatives.setdefault(self.piece(int(token)), float(value))
            out.top_logprobs.append(alternatives)

    def piece(self, token: int) -> str:
        """One token's text; EOS, which decoding drops, reads ``EOS_TEXT``."""
        return EOS_TEXT if token == self.eos else self.vocabulary.decode([token])

    def stream_pieces(self, tokens: list[int], text: str) -> list[str]:
        """``text`` in one piece per token: each token's share of the decoded text (a
        character that spans tokens arrives with the token that completes it)."""
        pieces, shown = [], 0
        for k in range(1, len(tokens) + 1):
            upto = min(len(self.vocabulary.decode(tokens[:k])), len(text))
            pieces.append(text[shown:upto])
            shown = upto
        if shown < len(text):
            pieces.append(text[shown:])
        return pieces
