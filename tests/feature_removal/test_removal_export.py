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
    original = convert_cli.generation_config

    def without_length(hf_config):
        written = original(hf_config)
        if written is None:
            return None

        class Unlengthed(dict):  # export_hf's max_new_tokens is dropped as it is set
            def __setitem__(self, key, value):
                if key != "max_new_tokens":
                    super().__setitem__(key, value)
        return Unlengthed(written)
    monkeypatch.setattr(convert_cli, "generation_config", without_length)


def _generates(name):
    def check(request):
        exported = round_trips.export_case(name, request.getfixturevalue("tmp_path"))
        round_trips.test_greedy_generate_with_default_arguments_gives_infers_tokens(exported)
    return check


def _frames(name):
    def check(request):
        exported = round_trips.export_case(name, request.getfixturevalue("tmp_path"))
        round_trips.test_the_tokenizer_frames_a_prompt_as_the_runs_tasks_did(exported)
    return check


REMOVALS = [
    Removal("exported prompt template", "the export writes the tokenizer without a template "
            "or padding side", "a language model's export: `generate(**tokenizer(text))` "
            "with defaults gives `infer`'s tokens", _no_template, _generates("gpt2")),
    Removal("exported chat template", "a run trained on inputs exports no chat template",
            "an SFT run's export: `generate` with defaults on the prompt a user makes gives "
            "`infer`'s tokens", _no_chat_template, _generates("gpt2_sft")),
    Removal("decoder rows start with BOS", "a new decoder run starts its rows with 0, the "
            "pad id, as runs before issue 63 did", "the exported tokenizer's prompt starts "
            "with the run's start id <s> (3)", _rows_start_with_pad, _frames("gpt2")),
    Removal("exported decode length", "generation_config.json leaves out max_new_tokens",
            "a language model's export: `generate(**tokenizer(text))` with defaults gives "
            "`infer`'s tokens", _no_default_length, _generates("gpt2")),
]

globals().update(proving_tests(REMOVALS))
