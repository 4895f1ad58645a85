"""Preference pairs for reward models and direct preference optimisation: JSONL rows of a
prompt and two responses to it, the ``chosen`` one preferred over the ``rejected``.

A row is TRL's preference format, plain or conversational:

- ``{"prompt": "...", "chosen": "...", "rejected": "..."}`` (text), or
- ``{"prompt": [messages], "chosen": [assistant message(s)], "rejected": [...]}``, the
  prompt's turns and each response's turns rendered with the tokenizer's chat template
  (``data/chat.py``); a conversational prompt may also be given as ``messages``.

An optional number ``margin`` says by how much the chosen response is better (reward
models subtract it, as TRL's ``RewardTrainer``). ``PreferenceSource`` refuses a row of
any other shape naming its file and line.

``PairFeatureConverter`` makes one model row per response, both starting with the same
prompt: ``chosen_tokens`` and ``rejected_tokens`` (the start id, the prompt's last
``inputs - 1`` tokens, the response's first ``targets`` tokens), with ``*_mask`` (1 on
real tokens) and ``*_response`` (1 on the response's tokens), and ``margin``. Pairs are
batched, never packed: the two rows of a pair stay in the same batch, on the same
device, and read the same prompt ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from t5x_like.data.chat import ROLES, template_of
from t5x_like.data.feature_converters import FeatureConverter, MissingFeatures
from t5x_like.data.preprocessors.base import Context, ExampleStep
from t5x_like.data.sources import JsonlSource
from t5x_like.errors import DataError

SIDES = ("chosen", "rejected")


def _messages(value, where: str, what: str, roles=ROLES) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{what} must be text or a non-empty list of "
                        "{'role': ..., 'content': ...} messages.", where=where, field=what.strip("'"))
    for number, message in enumerate(value, 1):
        if (not isinstance(message, dict) or not isinstance(message.get("content"), str)
                or message.get("role") not in roles):
            raise DataError(f"{what}'s message {number} is not a {{'role': one of "
                            f"{', '.join(roles)}, 'content': text}} object: {str(message)[:80]}",
                            where=where, field=what.strip("'"))
    return [{"role": m["role"], "content": m["content"]} for m in value]


def preference_pair(record: Mapping, where: str) -> dict:
    """A row as ``{"prompt": text | messages, "chosen": ..., "rejected": ..., "margin":
    float, "conversational": bool}``; any other shape is refused naming ``where``."""
    prompt = record.get("prompt", record.get("messages"))
    missing = [k for k in ("prompt", "chosen", "rejected")
               if (prompt if k == "prompt" else record.get(k)) is None]
    if missing:
        raise DataError(f"a preference row needs 'prompt', 'chosen' and 'rejected' (text, or "
                        f"lists of chat messages); it lacks {missing} (it has {sorted(record)}).",
                        where=where, field=missing[0])
    conversational = isinstance(prompt, list)
    pair = {"conversational": conversational}
    if conversational:
        pair["prompt"] = _messages(prompt, where, "'prompt'")
        for side in SIDES:
            value = record[side]
            if isinstance(value, str):  # a bare answer to a conversational prompt
                value = [{"role": "assistant", "content": value}]
            pair[side] = _messages(value, where, repr(side), ("assistant", "tool"))
    else:
        for key in ("prompt", *SIDES):
            if not isinstance(record[key], str):
                raise DataError(f"{key!r} is {type(record[key]).__name__}; with a text prompt, "
                                "'chosen' and 'rejected' are text too (or give the prompt as a "
                                "list of chat messages).", where=where, field=key)
            pair[key] = record[key]
    if record["chosen"] == record["rejected"]:
        raise DataError("'chosen' and 'rejected' are the same response, so there is no "
                        "preference to learn; drop the row.", where=where, field="rejected")
    margin = record.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not np.isfinite(margin):
        raise DataError(f"'margin' must be a finite number, got {margin!r}.", where=where,
                        field="margin")
    pair["margin"] = float(margin)
    return pair


@dataclasses.dataclass(frozen=True, eq=False)
class PreferenceSource(JsonlSource):
    """JSONL preference rows (``preference_pair``); every ``holdout_every``-th row is
    ``validation``."""

    def load_files(self, split, paths):
        return [preference_pair(record, where) for where, record in self._objects(split, paths)]


@dataclasses.dataclass(frozen=True)
class TokenizePair(ExampleStep):
    """``prompt``, ``chosen`` and ``rejected`` -> token ids. Text rows: each text by the
    feature's vocabulary, EOS after each response (so the model learns to stop).
    Conversational rows: the prompt rendered with the ``prompt`` vocabulary's chat
    template and its generation prompt, and each response as the characters its turns
    add to that rendering (end-of-turn marker included), tokenized without added special
    tokens, as chat SFT (``data/chat.py``) renders them."""

    uses_rng = False
    may_drop = False

    def check(self, ctx: Context) -> None:
        for key in ("prompt", *SIDES):
            ctx.vocabulary(key)

    def map(self, example, rng, ctx):
        out = {"margin": np.float32(example.get("margin", 0.0))}
        if example.get("conversational"):
            vocabulary = ctx.vocabulary("prompt")
            if not hasattr(vocabulary, "folder"):
                raise DataError(f"Task {ctx.task_name!r}: conversational preference rows are "
                                "rendered with a chat template, and the prompt vocabulary "
                                f"{vocabulary!r} is not a Hugging Face tokenizer folder.",
                                field="prompt", value=example["prompt"])
            template = template_of(vocabulary.folder)
            prompt = template.render(example["prompt"], add_generation_prompt=True)
            out["prompt"] = np.asarray(vocabulary.encode(prompt), np.int32)
            for side in SIDES:
                whole = template.render(example["prompt"] + example[side])
                if not whole.startswith(prompt):
                    raise DataError(f"Task {ctx.task_name!r}: the chat template renders the "
                                    "prompt differently inside the whole conversation, so the "
                                    "response cannot be told apart; pick a template whose "
                                    "renderings are prefixes of each other.")
                out[side] = np.asarray(vocabulary.encode(whole[len(prompt):]), np.int32)
            return out
        for key in ("prompt", *SIDES):
            vocabulary = ctx.vocabulary(key)
            ids = list(vocabulary.encode(str(example[key])))
            if key != "prompt" and ctx.output_features[key].add_eos and \
                    vocabulary.eos_id is not None:
                ids.append(int(vocabulary.eos_id))
            out[key] = np.asarray(ids, np.int32)
        return out


class PairFeatureConverter(FeatureConverter):
    """Preference pairs -> a chosen row and a rejected row each (see the module
    docstring); ``start_id`` is the model's first input (its BOS, 0 for this framework's
    own decoders). Lengths: ``inputs`` for the start id and the prompt, ``targets`` for
    a response; a row holds ``inputs + targets`` tokens."""

    REQUIRED = ("prompt", *SIDES)

    def __init__(self, start_id: int = 0):
        super().__init__(pack=False)
        self.start_id = int(start_id)

    def _check_lengths(self, lengths):
        for key in ("inputs", "targets"):
            if key not in lengths:
                raise ValueError(f"Preference pairs need task_feature_lengths[{key!r}] (the "
                                 f"prompt's and a response's); got {dict(lengths)}.")
        if int(lengths["inputs"]) < 2:
            raise ValueError("task_feature_lengths.inputs holds the start id and the prompt; "
                             "give it at least 2.")

    def convert_example(self, example, task_feature_lengths):
        self._check_lengths(task_feature_lengths)
        missing = [f for f in self.REQUIRED if f not in example]
        if missing:
            raise MissingFeatures(f"PairFeatureConverter needs task features "
                                  f"{list(self.REQUIRED)}; the example lacks {missing}. Read "
                                  "the task with PreferenceSource and TokenizePair.")
        prompt_length = int(task_feature_lengths["inputs"]) - 1
        response_length = int(task_feature_lengths["targets"])
        width = prompt_length + 1 + response_length
        prompt = np.asarray(example["prompt"], np.int32).reshape(-1)[-prompt_length:]
        out = {"margin": np.float32(example.get("margin", 0.0))}
        for side in SIDES:
            response = np.asarray(example[side], np.int32).reshape(-1)[:response_length]
            tokens = np.concatenate([[self.start_id], prompt, response]).astype(np.int32)
            row = np.zeros(width, np.int32)
            row[:tokens.size] = tokens
            mask = (np.arange(width) < tokens.size).astype(np.int32)
            start = 1 + prompt.size
            out[f"{side}_tokens"] = row
            out[f"{side}_mask"] = mask
            out[f"{side}_response"] = (mask * (np.arange(width) >= start)).astype(np.int32)
        return out

    def apply(self, ds, task_feature_lengths):
        self._check_lengths(task_feature_lengths)
        return ds.map(lambda ex: self.convert_example(ex, task_feature_lengths))

    def model_feature_lengths(self, task_feature_lengths):
        width = int(task_feature_lengths["inputs"]) + int(task_feature_lengths["targets"])
        return {f"{side}_{part}": width for side in SIDES
                for part in ("tokens", "mask", "response")}


__all__ = ["PairFeatureConverter", "PreferenceSource", "TokenizePair", "preference_pair"]
