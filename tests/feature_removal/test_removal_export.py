"""Removals of what makes a checkpoint pretrained here work in transformers with default
calls (issue 63): the exported tokenizer's template, the chat template of a run trained
on inputs, a new decoder run's start id that is not the pad id, and generate's default
length in ``generation_config.json``. Each check
trains, exports and decodes a fresh tiny run with the removal applied (the export is
what the removal changes)."""

import test_export_round_trips as round_trips
from removals import Removal, proving_tests

from t5x_like.convert import __main__ as convert_cli
from t5x_like.structures.decoder import DecoderStructure


def _no_template(monkeypatch):
    monkeypatch.setattr(convert_cli, "prompt_format", lambda spec, tokenizer, run=True: {})


def _no_chat_template(monkeypatch):
    monkeypatch.setattr(DecoderStructure, "chat_framing",
                        classmethod(lambda cls, spec, vocabulary: None))


def _rows_start_with_pad(monkeypatch):
    monkeypatch.setattr(DecoderStructure, "with_start_id",
                        classmethod(lambda cls, spec, vocabulary, saved_start=None: spec))


def _no_default_length(monkeypatch):
    monkeypatch.setattr(convert_cli, "run_generation_defaults", lambda spec: {})


def _fresh(name, check):
    """``check`` (a round-trip test) on case ``name`` trained and exported anew."""
    def verify(request):
        check(round_trips.export_case(name, request.getfixturevalue("tmp_path")))
    return verify


GENERATES = round_trips.test_greedy_generate_with_default_arguments_gives_infers_tokens
FRAMES = round_trips.test_the_tokenizer_frames_a_prompt_as_the_runs_tasks_did

REMOVALS = [
    Removal("exported prompt template", "the export writes the tokenizer without a template "
            "or padding side", "a language model's export: `generate(**tokenizer(text))` "
            "with defaults gives `infer`'s tokens", _no_template, _fresh("gpt2", GENERATES)),
    Removal("exported chat template", "a run trained on inputs exports no chat template",
            "an SFT run's export: `generate` with defaults on the prompt a user makes gives "
            "`infer`'s tokens", _no_chat_template, _fresh("gpt2_sft", GENERATES)),
    Removal("decoder rows start with BOS", "a new decoder run starts its rows with 0, the "
            "pad id, as runs before issue 63 did", "the exported tokenizer's prompt starts "
            "with the run's start id <s> (3)", _rows_start_with_pad, _fresh("gpt2", FRAMES)),
    Removal("exported decode length", "generation_config.json leaves out max_new_tokens",
            "a language model's export: `generate(**tokenizer(text))` with defaults gives "
            "`infer`'s tokens", _no_default_length, _fresh("gpt2", GENERATES)),
]

globals().update(proving_tests(REMOVALS))
