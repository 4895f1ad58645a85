"""Completions of one loaded decoder: a request's prompt tokens in, its new tokens, text,
finish reason and log-probabilities out, as the OpenAI API reports them.

Requests decode together through the continuous-batching engine (``generation.engine``:
a paged cache, slots taken and left between steps), each from its own seed (a fresh one
when it gives none), so what a request gets never depends on what else the server is
answering: greedy tokens are the model's argmax chain. Text streams as tokens are chosen;
a stop sequence ends the request at the step that completes it, and text that could
still turn into one is held back until it cannot.

A text prompt is read as the harness reads a context: framed as the checkpoint's
tokenizer frames a text (``LoadedModel.prefix``: a decoder run's start id, an imported
tokenizer's own template, Llama's BOS; GPT-2's and Qwen2's add nothing); token ids are
read as given; an empty prompt starts from the BOS, else EOS (lm-eval's prefix token).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Callable

import numpy as np

from t5x_like.evaluation import few_shot, loaded_lm
from t5x_like.generation.engine import Engine, Handle, Request
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
    """Answers completion requests with ``loaded`` (a ``loaded_lm.LoadedModel``) through
    an engine of ``slots`` rows over pages of ``page_size`` positions, whose loop runs
    from the start on a thread of its own until ``stop`` drains it."""

    def __init__(self, loaded: loaded_lm.LoadedModel, *, slots: int = 8, page_size: int = 16):
        self.loaded = loaded
        self.vocabulary = loaded.vocabulary
        self.window = loaded.max_length
        self.eos = int(self.vocabulary.eos_id)
        self.empty_start = few_shot.empty_context_id(self.vocabulary)
        self.engine = Engine(loaded.runner.structure.model, loaded.params,
                             max_length=self.window, slots=slots, page_size=page_size,
                             context=loaded.runner.context)
        self.engine.start()

    def stop(self) -> None:
        """Returns once every request already taken has been answered."""
        self.engine.stop()

    # -- tokens in ------------------------------------------------------------------------
    def encode(self, prompt: str | tuple[int, ...]) -> list[int]:
        if isinstance(prompt, str):
            return [*self.loaded.prefix, *self.vocabulary.encode(prompt)]
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

    # -- requests -----------------------------------------------------------------------
    def complete(self, prompt: list[int], sampling: Sampling,
                 stream: Callable[[str], None] | None = None,
                 cancelled: threading.Event | None = None) -> Completion:
        """``prompt``'s completion (``sampling`` checked by ``check_fits``); ``stream``
        receives the text in pieces as it is decoded (their sum is the answer's text).
        Once ``cancelled`` is set (the client went away), the request ends at the next
        token and its slot and pages go to the next request."""
        return self._finish(self._start(prompt, sampling, stream, cancelled))

    def complete_all(self, asked: list[tuple[list[int], Sampling]]) -> list[Completion]:
        """Every ``(prompt, sampling)``'s completion, and ``sampling.n`` of each (the j-th
        sampled from ``seed + j``), in that order: all submitted before any is waited
        for, so they decode together and a prompt's copies read its pages."""
        started = [self._start(prompt, dataclasses.replace(
            sampling, n=1, seed=None if sampling.seed is None else sampling.seed + j))
            for prompt, sampling in asked for j in range(sampling.n)]
        return [self._finish(s) for s in started]

    def _start(self, prompt: list[int], sampling: Sampling,
               stream: Callable[[str], None] | None = None,
               cancelled: threading.Event | None = None):
        start = prompt or [self.empty_start]
        watch = _StopWatch(self, sampling, stream, cancelled)
        handle = self._submit(start, sampling, watch) if sampling.max_tokens else None
        return prompt, start, sampling, watch, handle

    def _finish(self, started) -> Completion:
        prompt, start, sampling, watch, handle = started
        new = handle.wait().tokens if handle is not None else []
        tokens, text, finish = self._cut(new, sampling)
        watch.flush(text)
        out = Completion(list(prompt), tokens, text, finish)
        if sampling.logprobs is not None:
            self._add_logprobs(out, start, sampling)
        return out

    def _submit(self, prompt: list[int], sampling: Sampling, watch: _StopWatch) -> Handle:
        # Unseeded, a sampled request draws a fresh seed (as OpenAI's does); seeded, the
        # same request gives the same tokens.
        seed = secrets.randbits(31) if sampling.seed is None else sampling.seed
        request = Request(tuple(prompt), sampling.max_tokens,
                          temperature=sampling.temperature,
                          top_k=sampling.top_k if sampling.temperature else 0,
                          top_p=sampling.top_p if sampling.temperature else 1.0,
                          seed=seed, stop_ids=(self.eos,))
        return self.engine.submit(request, watch.on_token)

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
                continue  # the token an empty prompt starts from is not the prompt's
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



class _StopWatch:
    """Follows a request's tokens as the engine chooses them: ends it at the step whose
    token completes a stop sequence or once ``cancelled`` is set, and passes ``stream`` the text that can no longer
    change (held back: a character still incomplete, and a tail that could become a stop
    sequence)."""

    def __init__(self, completer: Completer, sampling: Sampling,
                 stream: Callable[[str], None] | None,
                 cancelled: threading.Event | None = None):
        self.completer, self.stop, self.stream = completer, sampling.stop, stream
        self.cancelled = cancelled
        self.tokens: list[int] = []
        self.sent = 0
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def on_token(self, token: int, logprob: float) -> bool:
        if token == self.completer.eos or (self.cancelled is not None
                                           and self.cancelled.is_set()):
            return False
        self.tokens.append(token)
        text = self.completer.vocabulary.decode(self.tokens)
        if any(s in text for s in self.stop):
            return False
        if self.stream is not None:
            safe = len(text) - self.hold
            while safe > self.sent and text[safe - 1] == "\ufffd":
                safe -= 1  # part of a character the next token completes
            if safe > self.sent:
                self.stream(text[self.sent:safe])
                self.sent = safe
        return True

    def flush(self, text: str) -> None:
        """The rest of the answer's ``text`` (cut at a stop sequence) to the stream."""
        if self.stream is not None and len(text) > self.sent:
            self.stream(text[self.sent:])
            self.sent = len(text)
