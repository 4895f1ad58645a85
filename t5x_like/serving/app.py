"""The OpenAI-compatible HTTP API over a ``Completer``: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions`` (the conversation rendered
with the tokenizer's own chat template), answered whole or streamed as server-sent
events (``stream: true``), with ``logprobs`` and ``echo`` so that a client can score text
(lm-evaluation-harness's ``local-completions`` model asks for exactly that).

A refused request is a 4xx with OpenAI's error body (``{"error": {"message": ...}}``,
one line naming the fix); the server goes on serving. Requests wait in worker threads
while the completer's engine decodes them together, so the event loop keeps accepting
requests.

A stream sends the text as the engine decodes it (``Completer.complete``'s ``stream``):
its first event leaves after the prefill and first step, not with the last token.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from t5x_like.errors import UserError
from t5x_like.serving import protocol
from t5x_like.serving.completions import Completer, Completion
from t5x_like.serving.protocol import RequestError


def make_app(completer: Completer, model_name: str, chat_template=None) -> FastAPI:
    """The app serving ``completer`` as ``model_name``; ``chat_template`` (a
    ``data.chat.ChatTemplate``, or None: chat requests are refused) renders
    conversations."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await run_in_threadpool(completer.stop)  # after the requests in flight: drained

    app = FastAPI(title="t5x_like", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.completer = completer  # what serves the requests (its engine's stats)
    created = int(time.time())

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": created, "owned_by": "t5x_like"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        asked = protocol.completion_request(protocol.json_body(await request.body()),
                                            model_name)
        if asked.stream and len(asked.prompts) > 1:
            raise RequestError("Streaming takes one prompt; send a request per prompt.",
                               "prompt")
        _one_stream(asked)
        prompts = [completer.encode(p) for p in asked.prompts]
        fitted = [completer.check_fits(p, asked.sampling) for p in prompts]
        ident = f"cmpl-{uuid.uuid4().hex}"
        if asked.stream:
            cancelled = threading.Event()
            return _events(_completion_chunks(completer, prompts[0], fitted[0], ident,
                                              model_name, cancelled), cancelled)
        answers = await run_in_threadpool(completer.complete_all,
                                          list(zip(prompts, fitted, strict=True)))
        choices = [{"index": i, "text": _echoed(completer, a, asked.sampling.echo) + a.text,
                    "logprobs": _completion_logprobs(a)
                    if asked.sampling.logprobs is not None else None,
                    "finish_reason": a.finish_reason} for i, a in enumerate(answers)]
        return {"id": ident, "object": "text_completion", "created": int(time.time()),
                "model": model_name, "choices": choices,
                "usage": _usage(answers, asked.sampling.n)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        asked = protocol.chat_request(protocol.json_body(await request.body()), model_name)
        if chat_template is None:
            raise RequestError(f"{model_name}'s tokenizer has no chat template; send the text "
                               "to /v1/completions instead.", "messages")
        try:
            text = chat_template.render(list(asked.messages), add_generation_prompt=True)
        except UserError as e:
            raise RequestError(f"The chat template cannot render these messages: {e}",
                               "messages") from None
        _one_stream(asked)
        prompt = completer.encode(text)
        sampling = completer.check_fits(prompt, asked.sampling)
        ident = f"chatcmpl-{uuid.uuid4().hex}"
        if asked.stream:
            cancelled = threading.Event()
            return _events(_chat_chunks(completer, prompt, sampling, ident, model_name,
                                        cancelled), cancelled)
        answers = await run_in_threadpool(completer.complete_all, [(prompt, sampling)])
        choices = [{"index": i, "finish_reason": a.finish_reason,
                    "message": {"role": "assistant", "content": a.text},
                    "logprobs": ({"content": _chat_logprobs(a)}
                                 if asked.sampling.logprobs is not None else None)}
                   for i, a in enumerate(answers)]
        return {"id": ident, "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "usage": _usage(answers, asked.sampling.n),
                "choices": choices}

    return app


# -- answers ---------------------------------------------------------------------------------
def _one_stream(asked) -> None:
    if asked.stream and asked.sampling.n > 1:
        raise RequestError("Streaming takes n=1; send a request per stream (a seed each "
                           "for different samples).", "n")


def _usage(answers: list[Completion], n: int = 1) -> dict:
    """Token counts; each prompt counts once, however many (``n``) completions it has."""
    prompt = sum(len(a.prompt) for a in answers[::n])
    completion = sum(len(a.tokens) for a in answers)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _echoed(completer: Completer, answer: Completion, echo: bool) -> str:
    return completer.vocabulary.decode(answer.prompt) if echo else ""


def _completion_logprobs(answer: Completion) -> dict:
    """The completions API's ``logprobs``: tokens, their log-probabilities, the top
    alternatives and each token's character offset in the returned text."""
    offsets, at = [], 0
    for piece in answer.token_texts:
        offsets.append(at)
        at += len(piece)
    return {"tokens": answer.token_texts, "token_logprobs": answer.token_logprobs,
            "top_logprobs": answer.top_logprobs, "text_offset": offsets}


def _chat_logprobs(answer: Completion) -> list[dict]:
    """The chat API's ``logprobs.content``: per new token its text, bytes, log-probability
    and top alternatives."""
    return [{"token": piece, "logprob": value, "bytes": list(piece.encode()),
             "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                              for t, v in (top or {}).items()]}
            for piece, value, top in zip(answer.token_texts, answer.token_logprobs,
                                         answer.top_logprobs, strict=True)]


# -- streams ---------------------------------------------------------------------------------
_END = object()


def _events(chunks: Iterator[dict], cancelled: threading.Event) -> StreamingResponse:
    """The chunks as server-sent events. Each is awaited on a worker thread, so a client
    that goes away cancels this generator while it waits for the next token: its
    ``finally`` sets ``cancelled``, and the engine ends the request at its next token
    (its slot and pages go to the next request) instead of decoding to ``max_tokens``."""
    async def lines():
        try:
            while (chunk := await run_in_threadpool(next, chunks, _END)) is not _END:
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            cancelled.set()
    return StreamingResponse(lines(), media_type="text/event-stream")


def _decoding(completer: Completer, prompt: list[int], sampling,
              cancelled: threading.Event) -> Iterator[str | Completion]:
    """The text pieces of ``prompt``'s completion as they are decoded, then the
    ``Completion``; the completion runs on a thread of its own meanwhile, and ends at its
    next token once ``cancelled`` is set."""
    pieces: queue.Queue = queue.Queue()

    def run():
        try:
            pieces.put(completer.complete(prompt, sampling, stream=pieces.put,
                                          cancelled=cancelled))
        except BaseException as error:  # the stream ends with it
            pieces.put(error)
    threading.Thread(target=run, daemon=True).start()
    while True:
        item = pieces.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if isinstance(item, Completion):
            return


def _completion_chunks(completer, prompt: list[int], sampling, ident: str, model: str,
                       cancelled: threading.Event):
    base = {"id": ident, "object": "text_completion", "created": int(time.time()),
            "model": model}

    def chunk(text, finish=None, **extra):
        return {**base, "choices": [{"index": 0, "text": text, "logprobs": None,
                                     "finish_reason": finish}], **extra}
    if sampling.echo:
        yield chunk(completer.vocabulary.decode(prompt))
    for item in _decoding(completer, prompt, sampling, cancelled):
        if isinstance(item, Completion):
            yield chunk("", item.finish_reason, usage=_usage([item]))
        elif item:
            yield chunk(item)


def _chat_chunks(completer, prompt: list[int], sampling, ident: str, model: str,
                 cancelled: threading.Event):
    base = {"id": ident, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}

    def chunk(delta, finish=None):
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish}]}
    yield chunk({"role": "assistant", "content": ""})
    for item in _decoding(completer, prompt, sampling, cancelled):
        if isinstance(item, Completion):
            yield chunk({}, item.finish_reason)
        elif item:
            yield chunk({"content": item})
