"""Removals of what the OpenAI-compatible server promises: greedy answers that are the
model's, log-probabilities at the right positions, the tokenizer's chat template, seeded
sampling, stop sequences, answers that do not depend on other requests, and requests
that end when their client goes away. The server
runs in this process (a thread), so each monkeypatch reaches the requests it answers."""

import itertools

from removals import Removal, existing, proving_tests
from test_serving import served  # noqa: F401  (the fixture the checks read)

from t5x_like.serving import completions
from t5x_like.serving.completions import Completer


def _logprobs_one_position_late(monkeypatch):
    """Each token reports the log-probability the model gave the token after it."""
    original = Completer._add_logprobs

    def shifted(self, out, start, sampling):
        original(self, out, start, sampling)
        out.token_logprobs[:] = [*out.token_logprobs[1:], out.token_logprobs[-1]]
    monkeypatch.setattr(Completer, "_add_logprobs", shifted)


def _no_chat_template(monkeypatch):
    """Conversations are rendered as ``role: content`` lines, whatever the tokenizer's
    template."""
    from t5x_like.data import chat

    def plain(self, messages, add_generation_prompt=False):
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + (
            "assistant: " if add_generation_prompt else "")
    monkeypatch.setattr(chat.ChatTemplate, "render", plain)


def _seed_ignored(monkeypatch):
    """A sampled request draws a fresh seed whatever it asks for."""
    fresh = itertools.count(1000)
    monkeypatch.setattr(completions.secrets, "randbits", lambda bits: next(fresh))
    original = Completer._submit

    def unseeded(self, prompt, sampling, *watch):
        import dataclasses
        return original(self, prompt, dataclasses.replace(sampling, seed=None), *watch)
    monkeypatch.setattr(Completer, "_submit", unseeded)


def _stop_ignored(monkeypatch):
    """Stop sequences are not looked for."""
    original = Completer._start

    def uncut(self, prompt, sampling, *stream):
        import dataclasses
        return original(self, prompt, dataclasses.replace(sampling, stop=()), *stream)
    monkeypatch.setattr(Completer, "_start", uncut)


def _one_batch_for_all(monkeypatch):
    """Requests share one sampling stream: a request's tokens depend on how many were
    sampled before it."""
    shared = itertools.count()
    original = Completer._submit

    def shared_stream(self, prompt, sampling, *watch):
        import dataclasses
        if sampling.temperature:
            sampling = dataclasses.replace(sampling, seed=next(shared))
        return original(self, prompt, sampling, *watch)
    monkeypatch.setattr(Completer, "_submit", shared_stream)


def _prompt_cut_to_its_last_token(monkeypatch):
    """Generation reads only the prompt's last token."""
    original = Completer._submit
    monkeypatch.setattr(Completer, "_submit",
                        lambda self, prompt, *rest: original(self, prompt[-1:], *rest))


def _cancel_ignored(monkeypatch):
    """A request whose client went away decodes on to its ``max_tokens``."""
    original = Completer._start
    monkeypatch.setattr(Completer, "_start", lambda self, prompt, sampling, stream=None,
                        cancelled=None: original(self, prompt, sampling, stream))


GREEDY = existing("test_serving.py::test_greedy_completions_are_transformers_generate",
                  prompt="Paris. And of Spain? Madrid,")
LOGPROBS = existing("test_serving.py::test_echo_and_logprobs_are_transformers_log_probabilities")
CHAT = existing("test_serving.py::test_chat_renders_the_tokenizers_template_as_transformers_does")
SAMPLED = existing("test_serving.py::test_a_sampled_request_is_its_seeds_and_stop_sequences_cut_it")
CONCURRENT = existing("test_serving.py::test_concurrent_clients_each_get_their_own_answer")
ABANDONED = existing("test_serving.py::test_a_stream_its_client_abandons_stops_decoding")

REMOVALS = [
    Removal("served greedy completions", "generation reads only the prompt's last token",
            "greedy completions equal transformers' `generate` of an imported Qwen2",
            _prompt_cut_to_its_last_token, GREEDY[1], holds_in=GREEDY[0]),
    Removal("served log-probabilities", "each token reports the next token's log-probability",
            "echoed prompt log-probabilities equal transformers' log-softmax",
            _logprobs_one_position_late, LOGPROBS[1], holds_in=LOGPROBS[0]),
    Removal("served chat template", "conversations are rendered as `role: content` lines",
            "a chat answer equals `generate` after transformers' `apply_chat_template`",
            _no_chat_template, CHAT[1], holds_in=CHAT[0]),
    Removal("served seeds", "a sampled request draws a fresh seed whatever it asks",
            "the same seed twice gives the same text", _seed_ignored, SAMPLED[1],
            holds_in=SAMPLED[0]),
    Removal("served stop sequences", "stop sequences are not looked for",
            "a completion ends before its stop sequence", _stop_ignored, SAMPLED[1],
            holds_in=SAMPLED[0]),
    Removal("served requests apart", "sampled requests share one sampling stream",
            "64 concurrent requests each answer as when sent alone", _one_batch_for_all,
            CONCURRENT[1], holds_in=CONCURRENT[0]),
    Removal("served cancellation on disconnect", "a request whose client went away decodes "
            "on to its max_tokens", "a stream closed after its first piece ends the "
            "engine's request within 50 of the 100 steps it decodes whole", _cancel_ignored,
            ABANDONED[1], holds_in=ABANDONED[0]),
]

globals().update(proving_tests(REMOVALS))
