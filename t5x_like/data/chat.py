"""Conversations for supervised fine-tuning of decoders: JSONL rows of ``messages``,
rendered with the checkpoint tokenizer's chat template, with the loss on the
assistant's tokens only.

A row is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (roles ``system``,
``user``, ``assistant``, ``tool``; at least one assistant turn), or a plain pair
``{"prompt": ..., "response": ...}``, which is a user turn and an assistant turn.
``ConversationSource`` reads them and refuses a row without either shape, or with an
unknown role, naming its file and line.

The template is the tokenizer folder's own (``chat_template`` in
``tokenizer_config.json``, or ``chat_template.jinja`` beside it), rendered by
transformers' ``render_jinja_template`` with the tokenizer's special tokens, which is
what ``apply_chat_template`` renders; the text is then tokenized without added special
tokens, as ``apply_chat_template(tokenize=True)`` does, so the ids are the ones the
model saw in its own chat fine-tuning.

Which tokens are the assistant's: for each assistant turn ``i``, the conversation up
to it rendered with the generation prompt (``messages[:i]``, ``add_generation_prompt``)
and the conversation through it (``messages[:i + 1]``) are prefixes of the whole
rendering; the characters between them are the turn (its content and the template's
end-of-turn marker, so the model learns to stop). A token is the assistant's when its
characters overlap those. A template whose renderings are not prefixes of each other
(one that rewrites earlier turns) is refused: its mask could not be placed.

A conversation longer than the window loses whole turns from its end until it fits,
never part of a turn; one whose first assistant turn already ends beyond the window is
refused. Nothing is split across examples. Encoder-decoders read the same rows as
input/target pairs (``ConversationToPairs``).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from t5x_like import errors
from t5x_like.data.hf_tokenizers import read_json, token_text
from t5x_like.data.preprocessors.base import Context, ExampleStep
from t5x_like.data.sources import JsonlSource
from t5x_like.errors import DataError

# Imports inside functions: transformers loads only when a chat template is rendered.

ROLES = ("system", "user", "assistant", "tool")
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


def conversation(record: Mapping, where: str) -> list[dict]:
    """The messages of a row (a prompt/response pair becomes two turns); refuses a row
    of any other shape, naming ``where`` (file:line)."""
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError("'messages' must be a non-empty list of {'role': ..., 'content': "
                            "...} objects.", where=where, field="messages")
        for number, message in enumerate(messages, 1):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise DataError(f"message {number} is not a {{'role': ..., 'content': ...}} "
                                f"object: {str(message)[:80]}", where=where, field="messages")
            if message["role"] not in ROLES:
                raise DataError(f"message {number} has role {message['role']!r}; the roles "
                                f"are {', '.join(ROLES)}.", where=where, field="role")
            if not isinstance(message["content"], str):
                raise DataError(f"message {number}'s content is not text.", where=where,
                                field="content")
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError("no assistant message, so nothing to learn from.", where=where,
                            field="messages")
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if "prompt" in record and "response" in record:
        return [{"role": "user", "content": str(record["prompt"])},
                {"role": "assistant", "content": str(record["response"])}]
    raise DataError(f"a conversation row needs 'messages' (a list of role/content objects) or "
                    f"'prompt' and 'response'; it has {sorted(record)}.", where=where)


@dataclasses.dataclass(frozen=True, eq=False)
class ConversationSource(JsonlSource):
    """JSONL conversations (``messages``, or ``prompt``/``response`` pairs); each
    record becomes ``{"messages": [...]}``. Every ``holdout_every``-th row is
    ``validation``."""

    def load_files(self, split, paths):
        return [{"messages": conversation(record, where)} for where, record in self._objects(split, paths)]


class ChatTemplate:
    """A tokenizer folder's chat template, rendered as transformers renders it."""

    def __init__(self, folder):
        folder = pathlib.Path(folder)
        config = read_json(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = {t.get("name"): t.get("template") for t in template}.get("default")
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        if not template:
            raise DataError(f"The tokenizer in {folder} has no chat template (no "
                            "'chat_template' in tokenizer_config.json, no "
                            "chat_template.jinja); use a chat model's tokenizer folder.")
        self.template = template
        specials = {**read_json(folder / "special_tokens_map.json"), **config}
        self.special_tokens = {name: token_text(specials[name]) for name in SPECIAL_TOKEN_NAMES
                               if token_text(specials.get(name)) is not None}

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = False) -> str:
        try:
            from transformers.utils.chat_template_utils import render_jinja_template
        except ImportError:
            raise errors.UserError("Chat templates are rendered by transformers: "
                                   f"{errors.install_hint('hf')}.") from None
        rendered, _ = render_jinja_template(
            conversations=[list(messages)], chat_template=self.template,
            add_generation_prompt=add_generation_prompt, **self.special_tokens)
        return rendered[0]

    def assistant_spans(self, messages: Sequence[Mapping]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans of its assistant turns."""
        text = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[:i + 1])
            if not (through.startswith(before) and text.startswith(through)):
                raise DataError("The chat template renders a conversation's beginning "
                                "differently from the whole (it rewrites earlier turns), so "
                                "the assistant's tokens cannot be placed; pick a template "
                                "whose renderings are prefixes of each other.")
            spans.append((len(before), len(through)))
        return text, spans


def assistant_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
                   ) -> np.ndarray:
    """1 for each token whose characters overlap an assistant span."""
    mask = np.zeros(len(offsets), np.int32)
    for t, (start, end) in enumerate(offsets):
        mask[t] = any(start < span_end and end > span_start and end > start
                      for span_start, span_end in spans)
    return mask


@dataclasses.dataclass(frozen=True)
class RenderChat(ExampleStep):
    """``messages`` -> ``targets`` (token ids of the rendered conversation) and
    ``loss_mask`` (1 on the assistant's tokens), in the ``targets`` vocabulary, which
    must be a Hugging Face tokenizer folder with a chat template. Keeps
    ``targets_pretokenized``, the rendered text."""

    uses_rng = False
    may_drop = False

    def check(self, ctx: Context) -> None:
        vocabulary = ctx.vocabulary("targets")
        if not hasattr(vocabulary, "encode_with_offsets"):
            raise ValueError(f"Task {ctx.task_name!r}: RenderChat needs a Hugging Face "
                             "tokenizer folder as the targets vocabulary (one with a chat "
                             f"template); it has {vocabulary!r}.")
        template_of(vocabulary.folder)
        ctx.length("targets")

    def map(self, example, rng, ctx):
        vocabulary = ctx.vocabulary("targets")
        template = template_of(vocabulary.folder)
        window = ctx.length("targets")
        messages = list(example["messages"])
        whole, all_spans = template.assistant_spans(messages)
        # Whole turns from the end until it fits: the conversation through its k-th
        # assistant turn renders as the whole one's text up to that turn's end (the
        # prefix property assistant_spans checks), so nothing is rendered again.
        for turns in range(len(all_spans), 0, -1):
            spans = all_spans[:turns]
            text = whole[:spans[-1][1]]
            ids, offsets = vocabulary.encode_with_offsets(text)
            if len(ids) <= window:
                break
        else:
            raise DataError(f"Task {ctx.task_name!r}: a conversation's first assistant turn "
                            f"ends at token {len(ids)}, beyond the window of {window} "
                            f"(targets length); raise it or shorten the conversation "
                            f"starting {messages[0]['content'][:60]!r}.", field="messages",
                            value=example["messages"])
        return {**example, "targets": np.asarray(ids, np.int32),
                "loss_mask": assistant_mask(offsets, spans), "targets_pretokenized": text}


@dataclasses.dataclass(frozen=True)
class ConversationToPairs(ExampleStep):
    """Encoder-decoders read the same rows as input/target pairs: the conversation
    before its last assistant turn as ``inputs``, one ``role: content`` line per turn,
    and that turn as ``targets``. A history longer than the ``inputs`` length loses its
    earliest turns (a system message stays), so the latest question is always read;
    tokenize after this step (``Tokenize``, ``AppendEos``, ``Truncate``)."""

    uses_rng = False
    may_drop = False

    def map(self, example, rng, ctx):
        messages = list(example["messages"])
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        history = messages[:last]
        system = [m for m in history[:1] if m["role"] == "system"]
        turns = history[len(system):]
        vocabulary, window = ctx.vocabulary("inputs"), ctx.length("inputs")
        while True:
            inputs = "\n".join(f"{m['role']}: {m['content']}" for m in system + turns)
            if len(turns) <= 1 or len(vocabulary.encode(inputs)) < window:  # room for EOS
                break
            turns = turns[1:]
        return {**example, "inputs": inputs, "targets": messages[last]["content"]}


_TEMPLATES: dict[str, ChatTemplate] = {}


def template_of(folder) -> ChatTemplate:
    """The chat template of a tokenizer folder, read once per process."""
    key = str(folder)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = ChatTemplate(folder)
    return _TEMPLATES[key]


__all__ = ["ChatTemplate", "ConversationSource", "ConversationToPairs", "RenderChat",
           "assistant_mask", "conversation", "template_of"]
