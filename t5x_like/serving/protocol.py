"""The OpenAI API's request bodies, read and checked: what a completion or chat request
asks for, or a ``RequestError`` naming the field to fix (the server answers it with a
4xx and OpenAI's error body, and keeps serving).

Fields the API defines and this server does not act on (``user``, ``presence_penalty``
at 0, ``stream_options``, ...) are accepted and ignored, as OpenAI-compatible servers do;
a field whose value would change the answer in a way this server cannot give (``best_of``
> 1, a penalty other than 0, ``logit_bias``) is refused, never ignored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

# OpenAI's limits: up to 4 stop sequences, up to 5 alternatives per token for completions
# (20 for chat; this server reports at most 5, the structures' TOP_TOKENS).
MAX_STOP = 4
MAX_LOGPROBS = 5
# Completions per prompt (``n``): each is a request of its own in the engine, reading the
# prompt's shared pages.
MAX_N = 16
ROLES = ("system", "user", "assistant", "tool", "developer")


class RequestError(Exception):
    """A request the server refuses: one line naming the fix, the HTTP status (400 a
    bad field, 404 an unknown model) and the field (``param``) at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict:
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How one request decodes: ``max_tokens`` new tokens at most (0: none, only the
    prompt's log-probabilities with ``echo``), greedy at ``temperature`` 0, else sampled
    from ``seed``'s stream (the same request and seed give the same tokens), cut at the
    first of ``stop``; ``logprobs``: None, or how many alternatives each token reports
    (0: the token's own log-probability alone); ``echo``: the prompt comes back first;
    ``n``: completions of each prompt (the j-th sampled from ``seed + j``)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    echo: bool = False
    n: int = 1


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """``/v1/completions``: one or more prompts (text, or token ids)."""

    prompts: tuple[str | tuple[int, ...], ...]
    sampling: Sampling
    stream: bool


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """``/v1/chat/completions``: one conversation, answered as the assistant."""

    messages: tuple[dict, ...]
    sampling: Sampling
    stream: bool


def json_body(raw: bytes) -> dict:
    """The request's JSON object, or a ``RequestError`` saying what it is instead."""
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"The request body is not valid JSON ({getattr(e, 'msg', e)}); "
                           "send a JSON object.") from None
    if not isinstance(body, dict):
        raise RequestError(f"The request body is a JSON {type(body).__name__}; send a JSON "
                           "object with 'model' and 'prompt' (or 'messages').")
    return body


def check_model(body: Mapping, served: str) -> None:
    model = body.get("model")
    if model is None:
        raise RequestError(f"'model' is required; this server serves {served!r}.", "model")
    if model != served:
        raise RequestError(f"The model {model!r} does not exist here; this server serves "
                           f"{served!r} (GET /v1/models).", "model", 404, "model_not_found")


def completion_request(body: Mapping, served: str) -> CompletionRequest:
    check_model(body, served)
    prompts = _prompts(body.get("prompt"))
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _integer(body, "logprobs", 0, MAX_LOGPROBS)
    sampling = _sampling(body, default_max_tokens=16, logprobs=logprobs,
                         echo=_flag(body, "echo"))
    _only_one(body, "best_of", "leave it out")
    return CompletionRequest(prompts, sampling, _flag(body, "stream"))


def chat_request(body: Mapping, served: str) -> ChatRequest:
    check_model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {'role': ..., 'content': "
                           "...} objects.", "messages")
    checked = []
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message:
            raise RequestError(f"message {number} is not a {{'role': ..., 'content': ...}} "
                               "object.", "messages")
        if message["role"] not in ROLES:
            raise RequestError(f"message {number} has role {message['role']!r}; the roles are "
                               f"{', '.join(ROLES)}.", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: the text ones, joined
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise RequestError(f"message {number} has a content part that is not text; "
                                   "this model reads text only.", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise RequestError(f"message {number}'s content is not text.", "messages")
        role = "system" if message["role"] == "developer" else message["role"]
        checked.append({"role": role, "content": content})
    top = None
    if _flag(body, "logprobs"):
        top = _integer(body, "top_logprobs", 0, MAX_LOGPROBS) if body.get(
            "top_logprobs") is not None else 0
    elif body.get("top_logprobs") is not None:
        raise RequestError("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    sampling = _sampling(body, default_max_tokens=None, logprobs=top, echo=False,
                         max_tokens_key=limit)
    return ChatRequest(tuple(checked), sampling, _flag(body, "stream"))


# -- fields ---------------------------------------------------------------------------------
def _prompts(prompt) -> tuple[str | tuple[int, ...], ...]:
    """A prompt as the API allows it: a string, a list of strings, a list of token ids,
    or a list of lists of token ids."""
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(_is_id(t) for t in prompt):
            return (tuple(prompt),)
        if all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in prompt):
            return tuple(tuple(p) for p in prompt)
    raise RequestError("'prompt' must be a string, a list of strings, a list of token ids or "
                       "a list of lists of token ids (none empty).", "prompt")


def _is_id(value) -> bool:
    return _is_int(value) and value >= 0


def _sampling(body: Mapping, default_max_tokens: int | None, logprobs: int | None,
              echo: bool, max_tokens_key: str = "max_tokens") -> Sampling:
    """``default_max_tokens`` None: the rest of the context (the engine fills it in)."""
    if body.get(max_tokens_key) is None:
        max_tokens = -1 if default_max_tokens is None else default_max_tokens
    else:
        max_tokens = _integer(body, max_tokens_key, 0, None)
    temperature = _number(body, "temperature", 0.0, 2.0, default=1.0)
    top_p = _number(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise RequestError("'top_p' must be above 0 (1 keeps every token).", "top_p")
    top_k = _integer(body, "top_k", -1, None) if body.get("top_k") is not None else 0
    seed = _integer(body, "seed", None, None) if body.get("seed") is not None else None
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise RequestError("'stop' must be a string or a list of strings.", "stop")
    if len(stop) > MAX_STOP or any(not s for s in stop):
        raise RequestError(f"'stop' takes at most {MAX_STOP} sequences, none empty.", "stop")
    n = _integer(body, "n", 1, MAX_N) if body.get("n") is not None else 1
    for penalty in ("presence_penalty", "frequency_penalty"):
        if body.get(penalty) not in (None, 0, 0.0):
            raise RequestError(f"'{penalty}' is not supported; leave it out or at 0.", penalty)
    if body.get("logit_bias"):
        raise RequestError("'logit_bias' is not supported; leave it out.", "logit_bias")
    return Sampling(max_tokens, temperature, top_p, max(top_k, 0), seed, stop, logprobs, echo, n)


def _only_one(body: Mapping, name: str, fix: str) -> None:
    """Refuses a count above 1 (one answer per request is all this server gives)."""
    if body.get(name) not in (None, 1):
        raise RequestError(f"'{name}' must be 1 here; {fix}.", name)


def _flag(body: Mapping, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false, got {value!r}.", name)
    return value


def _integer(body: Mapping, name: str, low: int | None, high: int | None) -> int:
    value = body.get(name)
    if not _is_int(value) or (low is not None and value < low) or (
            high is not None and value > high):
        bounds = (f" from {low} to {high}" if high is not None else
                  f" of at least {low}" if low is not None else "")
        raise RequestError(f"'{name}' must be an integer{bounds}, got {value!r}.", name)
    return int(value)


def _number(body: Mapping, name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not (_is_int(value) or isinstance(value, float)) or not low <= value <= high:
        raise RequestError(f"'{name}' must be a number from {low:g} to {high:g}, got "
                           f"{value!r}.", name)
    return float(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
