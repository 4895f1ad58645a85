"""Continuous batching for decoder-only models over a paged key/value cache.

A fixed number of slots decode together, one token per step, in jitted programs of
fixed shapes that run a window of a few steps each (the tokens fed back on the device).
Between windows finished requests leave their slot and waiting ones take it (continuous
batching): a short request does not wait for the longest one of its batch, and a new
one does not wait for a batch to end. Each request's cache is a list of
pages of one pool (``pages.PagePool``, ``attention.PagedBias``): what it holds, not
``max_length`` per slot, and full pages of a prompt another request already prefilled
are read, not computed again (GRPO's completions of one prompt prefill it once).

New requests are prefilled together, prompt rows padded to a bucketed width, before the
next decoding step; a request that shares a prompt with one prefilled in the same round
waits for the next round, to read its pages. Each request is sampled under its own
settings and seed (``sampling.choose``), so its tokens do not depend on its neighbours:
greedy tokens are those of ``decoding.generate_padded`` on the request alone.

Pages are reserved when a request is admitted, for its prompt and ``max_tokens`` (a
request that stops early returns the rest with its slot), so a running request never
waits for memory; a request the free pages do not cover waits at the head of the queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import numpy as np

from t5x_like.generation import sampling
from t5x_like.generation.pages import SCRATCH_PAGE, PagePool
from t5x_like.models import decoding


@dataclasses.dataclass(frozen=True)
class Request:
    """A prompt (token ids, at least one) and how to continue it: ``max_tokens`` new
    tokens at most, stopping after any of ``stop_ids`` (kept as the last token);
    temperature 0 is greedy, else sampling with ``top_k`` (0: off) and ``top_p`` from
    ``seed`` (any integer: it is taken modulo 2**31). ``logprobs``: each new token's
    log-probability under the model is kept (``Generated.logprobs``; a pass over the
    vocabulary in every step some running request asks it; ``on_token`` hears NaN
    otherwise)."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_ids: tuple[int, ...] = ()
    logprobs: bool = False


@dataclasses.dataclass
class Generated:
    """A request's new ``tokens`` (with a stop id last where one ended it), each one's
    log-probability under the model (where the request asked them), and why it ended:
    ``stop`` (a stop id, or the caller's ``on_token``) or ``length``."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish_reason: str = ""


class Handle:
    """A submitted request: ``wait()`` blocks until it has ended and returns its
    ``Generated``. ``on_token(token, logprob) -> bool`` (given to ``submit``) sees each
    new token as it is chosen, on the engine's thread; returning False ends the request."""

    def __init__(self, request: Request, on_token: Callable[[int, float], bool] | None):
        self.request, self.on_token = request, on_token
        self.result = Generated()
        self._done = threading.Event()
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Generated:
        if not self._done.wait(timeout):
            raise TimeoutError("the request has not ended")
        if self.error is not None:
            raise self.error
        return self.result


@dataclasses.dataclass
class _Running:
    handle: Handle
    pages: list[int]  # the row's pages in order, shared prefix pages first
    shared: int  # how many of them another request wrote
    position: int = 0  # where the next fed token goes
    last: int = 0  # the token chosen last, fed at the next step


@dataclasses.dataclass
class Stats:
    """What the engine has done: decoding steps, the calls that ran them (a window of
    steps each), prefill calls, prompt tokens run and prompt tokens read from shared
    pages instead."""

    steps: int = 0
    calls: int = 0
    prefills: int = 0
    prefill_tokens: int = 0
    shared_tokens: int = 0


# What the engine raises for a model that reads no paged cache (``decoding.check_paged``).
UnpagedModel = decoding.UnpagedModel
# A prompt's length plus its new tokens, refused (``ValueError``) past the model's positions:
# the ``max_length`` an engine for such requests needs.
generation_length = decoding.generation_length


def bucket(n: int, smallest: int, largest: int) -> int:
    """The power of two times ``smallest`` that holds ``n``, at most ``largest``."""
    width = smallest
    while width < n:
        width *= 2
    return min(width, largest)


class Engine:
    """Serves ``Request``s with ``model`` (a decoder-only module whose ``__call__`` takes
    ``page_table``) and ``params``: ``run`` for a list, ``submit`` from any thread with
    ``start`` (a background loop) or ``step`` by hand.

    ``max_length``: the longest sequence, prompt and new tokens, a request may need.
    ``slots``: requests decoded together. ``pages``: the pool (default: every slot at
    ``max_length``, plus the scratch page). ``steps_per_call``: the most decoding steps
    one jitted call runs (a power of two; ``_window``). ``context``: entered around every
    jitted call (the mesh and logical axis rules of sharded parameters)."""

    def __init__(self, model: nn.Module, params, *, max_length: int, slots: int = 8,
                 page_size: int = 16, pages: int | None = None, steps_per_call: int = 8,
                 context: Callable[[], contextlib.AbstractContextManager] | None = None):
        decoding.check_paged(model)
        if steps_per_call < 1 or steps_per_call & (steps_per_call - 1):
            raise ValueError(f"steps_per_call={steps_per_call}: give a power of two.")
        self.model = model
        self.slots, self.page_size = slots, page_size
        self.steps_per_call = steps_per_call
        self.pages_per_row = -(-max_length // page_size)
        self.max_length = max_length
        self.cache_pages = pages or slots * self.pages_per_row + 1
        self.pool = PagePool(self.cache_pages, page_size)
        self.context = context or contextlib.nullcontext
        # On CPU the dense kernels are kept transposed while decoding few rows
        # (``decoding._loop_params``: XLA:CPU's matmul reads them twice as fast so), a copy
        # made once per params; each step turns them back inside its program, where the
        # transpose folds into the dot. Elsewhere the params are read as they are.
        with self.context():
            self._transposed = decoding.transposes_kernels(slots)
            self._restore = decoding._loop_params({}, slots)[1]
        self._stored = jax.jit(lambda p: decoding._loop_params(p, slots)[0])
        self.params = params
        self.stats = Stats()
        self.cache = self._empty_cache()
        self._rows: list[_Running | None] = [None] * slots
        self._waiting: deque[Handle] = deque()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

        def prefill(stored, cache, tokens, positions, table, last, settings):
            logits, cache = decoding.paged_prefill(model, self._restore(stored), cache, tokens,
                                                   positions, table, page_size, last)
            return sampling.choose(logits, *settings), cache

        def decode(stored, cache, tokens, positions, table, settings, steps):
            # ``steps`` tokens a row, each fed back on the device as the next step's input.
            temperature, top_k, top_p, seeds, counters, wanted = settings

            def choose(logits, k):  # the token fed next, and what the host reads
                chosen, logprobs = sampling.choose(logits, temperature, top_k, top_p, seeds,
                                                   counters + k, wanted)
                return chosen, (chosen, logprobs)
            # A table of as many pages as the longest row needs (bucketed: ``_table``).
            return decoding.paged_window(model, stored, cache, tokens, positions, table,
                                         page_size, steps, choose, self.max_length - 1,
                                         restore=self._restore)

        self._prefill = jax.jit(prefill, donate_argnums=1)
        self._decode = jax.jit(decode, donate_argnums=1, static_argnums=6)

    @property
    def params(self):
        """The params requests are decoded with; setting them (a policy after an update)
        takes effect from the next step."""
        return self._params_given

    @params.setter
    def params(self, params) -> None:
        self._params_given = params
        if not self._transposed:
            self._params = params
            return
        with self.context():
            self._params = self._stored(params)

    # -- requests in --------------------------------------------------------------------
    def check(self, request: Request) -> None:
        if not request.prompt:
            raise ValueError("A request needs at least one prompt token.")
        if request.max_tokens < 0:
            raise ValueError(f"max_tokens={request.max_tokens}: give 0 or more.")
        total = len(request.prompt) + request.max_tokens
        if total > self.max_length:
            raise ValueError(f"prompt ({len(request.prompt)}) + max_tokens "
                             f"({request.max_tokens}) = {total} exceeds the engine's "
                             f"max_length {self.max_length}.")
        if self.pool.pages_for(self._positions(request)) > self.pool.pages - 1:
            raise ValueError(f"A request of {total} tokens needs more pages than the pool "
                             f"of {self.pool.pages - 1} holds.")

    def submit(self, request: Request,
               on_token: Callable[[int, float], bool] | None = None) -> Handle:
        self.check(request)
        handle = Handle(request, on_token)
        if request.max_tokens == 0:
            handle.result.finish_reason = "length"
            handle._done.set()
            return handle
        with self._lock:
            self._waiting.append(handle)
            self._lock.notify_all()
        return handle

    def run(self, requests: Sequence[Request]) -> list[Generated]:
        """Every request's result, in order (stepping here; not with ``start``)."""
        handles = [self.submit(r) for r in requests]
        while self.busy():
            self.step()
        return [h.wait() for h in handles]

    def busy(self) -> bool:
        with self._lock:
            return self._has_work()

    def clear_prefix_cache(self) -> None:
        """Forgets every prompt page nobody holds (an idle engine starts over: a benchmark's
        timed pass prefills what its warm-up pass did) and zeroes ``stats``."""
        with self._lock:
            if self._has_work():
                raise RuntimeError("clear_prefix_cache needs an idle engine")
            self.pool = PagePool(self.pool.pages, self.page_size)
            self.stats = Stats()

    # -- a background loop (a server) -------------------------------------------------
    def start(self) -> None:
        """Steps on a thread of its own while there is work; ``stop`` ends it once the
        requests already submitted have ended. Running already: nothing changes."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="generation-engine",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._has_work():
                    self._lock.wait()
                if self._stopping and not self._has_work():
                    return
            try:
                self.step()
            except Exception as error:  # noqa: BLE001  every waiting caller hears of it,
                self._fail_all(error)  # and the loop serves the requests that come next

    def _empty_cache(self):
        """The pools' keys and values, zeroed: ``cache_pages`` pages of ``page_size``
        positions for every attention layer (``decoding.init_page_pool``)."""
        with self.context():
            return decoding.init_page_pool(self.model, self.cache_pages, self.page_size)

    def _has_work(self) -> bool:
        return bool(self._waiting) or any(r is not None for r in self._rows)

    def _fail_all(self, error: BaseException) -> None:
        """Ends every request with ``error`` and starts over from an empty cache and pool
        (the failed step may have consumed the donated cache)."""
        with self._lock:
            handles = [r.handle for r in self._rows if r is not None] + list(self._waiting)
            self._rows = [None] * self.slots
            self._waiting.clear()
            self.pool = PagePool(self.pool.pages, self.page_size)
            self.cache = self._empty_cache()
        for handle in handles:
            handle.error = error
            handle._done.set()

    # -- one step ---------------------------------------------------------------------
    def step(self) -> None:
        """Admits what fits (prefilling it), then decodes a window of tokens (``_window``)
        for every running request, retiring each where it ended."""
        while self._admit_round():
            pass
        running = [(i, r) for i, r in enumerate(self._rows) if r is not None]
        if not running:
            return
        steps = self._window([r for _, r in running])
        with self.context():
            (chosen, logprobs), self.cache = self._decode(self._params, self.cache,
                                                          *self.step_inputs(steps), steps)
        chosen, logprobs = np.asarray(chosen).T, np.asarray(logprobs).T  # [slots, steps]
        self.stats.steps += steps
        self.stats.calls += 1
        for k in range(steps):
            for i, row in running:
                if self._rows[i] is row:  # not ended earlier in the window
                    row.position += 1
                    self._take(i, row, int(chosen[i, k]), float(logprobs[i, k]))

    def _window(self, running: list[_Running]) -> int:
        """How many steps the next call decodes: the largest power of two up to
        ``steps_per_call`` that the longest running request still needs. One call a
        window saves a step's dispatch and host round trip per token; what a window
        decodes past a request's end is thrown away, and a slot freed inside a window
        waits for its end (measured on ``benchmarks/serving.py``, bounding the window by
        the shortest request instead, so that a waiting one never waits, ran more short
        calls and was slower at 8 and 64 streams)."""
        left = max(r.handle.request.max_tokens - len(r.handle.result.tokens) for r in running)
        steps = 1
        while steps * 2 <= min(left, self.steps_per_call):
            steps *= 2
        return steps

    def step_inputs(self, steps: int = 1):
        """The decoding call's inputs for the rows running now: each one's last token, its
        position and page table (wide enough for ``steps`` more positions), and its
        sampling settings (idle slots: scratch pages). Positions past a row's own pages
        (a window run past its end) fall in the scratch page."""
        tokens = np.zeros((self.slots,), np.int32)
        positions = np.zeros((self.slots,), np.int32)
        running = [(i, r) for i, r in enumerate(self._rows) if r is not None]
        table = self._table(self.slots, max((r.position + steps for _, r in running),
                                            default=1))
        for i, row in running:
            tokens[i], positions[i] = row.last, row.position
            table[i, :len(row.pages)] = row.pages[:table.shape[1]]
        settings = self._settings([r.handle for _, r in running], [i for i, _ in running],
                                  self.slots)
        return tokens, positions, table, settings

    def _admit_round(self) -> bool:
        """Prefills the waiting requests that fit now, as one batch; False if none did.
        A request whose prompt starts like one admitted this round waits a round."""
        free = [i for i, r in enumerate(self._rows) if r is None]
        admitted: list[tuple[int, _Running]] = []
        leading: set[tuple[int, ...]] = set()
        with self._lock:
            while self._waiting and len(admitted) < len(free):
                request = self._waiting[0].request
                first_page = tuple(request.prompt[:self.page_size])
                if len(request.prompt) > self.page_size and first_page in leading:
                    break
                shared = self.pool.shared_prefix(request.prompt)
                own = self.pool.pages_for(self._positions(request)) - len(shared)
                self.pool.hold(shared)  # before allocating: they are not to be handed out
                if own > self.pool.free:
                    self.pool.release(shared)
                    break
                row = _Running(self._waiting.popleft(), shared + self.pool.allocate(own),
                               len(shared))
                admitted.append((free[len(admitted)], row))
                leading.add(first_page)
        if admitted:
            self._prefill_rows(admitted)
        return bool(admitted)

    def _prefill_rows(self, admitted: list[tuple[int, _Running]]) -> None:
        starts = [row.shared * self.page_size for _, row in admitted]
        lengths = [len(row.handle.request.prompt) - s for (_, row), s in zip(admitted, starts,
                                                                             strict=True)]
        count = bucket(len(admitted), 1, self.slots)
        width = bucket(max(lengths), self.page_size, self.pages_per_row * self.page_size)
        tokens = np.zeros((count, width), np.int32)
        # Padding continues each row's positions (clipped to the last): what it writes
        # lands past the prompt, in pages the row's own tokens overwrite before anything
        # reads them, or in the scratch page.
        positions = np.minimum(np.arange(width)[None, :].repeat(count, 0), self.max_length - 1)
        table = self._table(count, max(s + n for s, n in zip(starts, lengths, strict=True)))
        last = np.zeros((count,), np.int32)
        for j, ((_, row), start, length) in enumerate(zip(admitted, starts, lengths,
                                                          strict=True)):
            tokens[j, :length] = row.handle.request.prompt[start:]
            positions[j] = np.minimum(np.arange(start, start + width), self.max_length - 1)
            table[j, :len(row.pages)] = row.pages[:table.shape[1]]
            last[j] = length - 1
        settings = self._settings([row.handle for _, row in admitted], range(len(admitted)),
                                  count)
        with self.context():
            (chosen, logprobs), self.cache = self._prefill(
                self._params, self.cache, tokens, positions, table, last, settings)
        chosen, logprobs = np.asarray(chosen), np.asarray(logprobs)
        self.stats.prefills += 1
        for j, ((slot, row), start, length) in enumerate(zip(admitted, starts, lengths,
                                                             strict=True)):
            prompt = row.handle.request.prompt
            self.pool.index_prompt(prompt, row.pages)
            self.stats.prefill_tokens += length
            self.stats.shared_tokens += start
            row.position = len(prompt)
            self._rows[slot] = row
            self._take(slot, row, int(chosen[j]), float(logprobs[j]))

    def _take(self, slot: int, row: _Running, token: int, logprob: float) -> None:
        """Records ``row``'s new token and retires the row if it ended."""
        handle, request = row.handle, row.handle.request
        result = handle.result
        result.tokens.append(token)
        if request.logprobs:
            result.logprobs.append(logprob)
        wanted = handle.on_token(token, logprob) if handle.on_token is not None else True
        if token in request.stop_ids or wanted is False:
            result.finish_reason = "stop"
        elif len(result.tokens) >= request.max_tokens:
            result.finish_reason = "length"
        else:
            row.last = token
            return
        self._rows[slot] = None
        self.pool.release(row.pages)
        handle._done.set()

    def _table(self, rows: int, positions: int) -> np.ndarray:
        """An empty page table (scratch pages) of ``rows`` rows, wide enough for
        ``positions`` positions: a power of two of pages, at most a row's whole table, so
        a few widths compile and a step reads no more than twice what its rows hold."""
        width = bucket(-(-positions // self.page_size), 1, self.pages_per_row)
        return np.full((rows, width), SCRATCH_PAGE, np.int32)

    def _positions(self, request: Request) -> int:
        """Positions a request writes: its prompt and every new token but the last."""
        return len(request.prompt) + request.max_tokens - 1

    @staticmethod
    def _settings(handles: Sequence[Handle], rows: Sequence[int], count: int):
        """The sampling settings of ``count`` rows, ``handles[k]``'s in row ``rows[k]``
        (greedy elsewhere): temperatures, top-k, top-p, seeds, each row's token count
        so far (its next token's counter), and whether it keeps log-probabilities."""
        temperature = np.zeros((count,), np.float32)
        top_k = np.zeros((count,), np.int32)
        top_p = np.ones((count,), np.float32)
        seeds = np.zeros((count,), np.int32)
        counters = np.zeros((count,), np.int32)
        logprobs = np.zeros((count,), bool)
        for handle, i in zip(handles, rows, strict=True):
            r = handle.request
            temperature[i], top_k[i], top_p[i] = r.temperature, r.top_k, r.top_p
            seeds[i], counters[i] = r.seed % 2**31, len(handle.result.tokens)
            logprobs[i] = r.logprobs
        return temperature, top_k, top_p, seeds, counters, logprobs


def complete(engine: Engine, prompts: Sequence[Sequence[int]], max_tokens: int, *,
             seeds: Sequence[int], stop_ids: tuple[int, ...] = (), temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0,
             on_step: Callable[[int], None] | None = None) -> np.ndarray:
    """``[len(prompts), max_tokens]``: each prompt's new tokens, a stop id kept where one
    ended it and zeros after (the layout of ``decoding.generate_padded``'s output), decoded
    by ``engine`` stepping here: one request a prompt, the i-th sampled from ``seeds[i]``.
    ``on_step(finished)`` hears, after each step, how many requests have ended."""
    handles = [engine.submit(Request(tuple(int(t) for t in prompt), max_tokens,
                                     temperature=temperature, top_k=top_k, top_p=top_p,
                                     seed=int(seed), stop_ids=tuple(stop_ids)))
               for prompt, seed in zip(prompts, seeds, strict=True)]
    while engine.busy():
        engine.step()
        if on_step is not None:
            on_step(sum(h.done for h in handles))
    out = np.zeros((len(handles), max_tokens), np.int32)
    for i, handle in enumerate(handles):
        tokens = handle.wait().tokens
        out[i, :len(tokens)] = tokens
    return out
