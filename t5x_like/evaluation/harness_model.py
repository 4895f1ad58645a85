"""lm-evaluation-harness on our checkpoints: the harness's ``t5x_like`` model.

Importing this module registers the model with lm-eval, so

    import t5x_like.evaluation.harness_model
    lm_eval.simple_evaluate(model="t5x_like", model_args="checkpoint=runs/gpt/checkpoints/500",
                            tasks=["lambada_openai"])

scores one of our checkpoints (a run's workdir or step folder, or a ``convert import``
folder) with the harness's own task catalogue, without exporting to Hugging Face
first. ``python -m t5x_like.harness`` is the command around it, and ``train`` runs it
as a ``harness`` evaluator (``config.evals.<name>.kind="harness"``).

The requests are answered as lm-eval's Hugging Face backend (``HFLM``, its defaults)
answers them on the checkpoint's export, over our model on the mesh of the checkpoint's
config: texts are framed as the exported tokenizer frames them (its template: a decoder
run's start id first; an imported tokenizer's own, Llama's BOS, GPT-2's nothing);

- ``loglikelihood``: lm-eval's own encoding of ``(context, continuation)`` (trailing
  spaces move onto the continuation; an empty context becomes the prefix token: the
  vocabulary's BOS, else EOS, as HFLM's default),
  rows cut from the left to ``max_length`` tokens, and ``is_greedy``;
- ``loglikelihood_rolling``: lm-eval's disjoint rolling windows of ``max_length``;
- ``generate_until``: the context cut from the left to ``max_length - max_gen_toks``,
  greedy (or sampled with ``do_sample``) decoding, the text cut at the first stop
  sequence (EOS's text among them).

Requests are sorted by length and batched in a few widths (powers of two and 1.5 times
them), so short requests do not pay for the model's whole window and few programs
compile.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)

from t5x_like.errors import UserError
from t5x_like.evaluation import few_shot
from t5x_like.evaluation.loaded_lm import LoadedModel, bucket, load
from t5x_like.system import progress

NAME = "t5x_like"


@register_model(NAME)
class T5xLikeLM(TemplateLM):
    """lm-eval's model for a t5x_like decoder checkpoint (``model_args``:
    ``checkpoint=PATH`` and optionally ``step``, ``vocabulary`` (a tokenizer path;
    default the checkpoint's own), ``max_length``, ``max_gen_toks``, ``batch_size``,
    ``seed``, ``module`` (a module registering the task a run trained on), ``weights``
    (``int8``: int8 attention and MLP kernels), ``sampler`` (``engine``: generate_until
    through the continuous-batching engine))."""

    backend = "causal"

    def __init__(self, checkpoint: str = "", step: int | None = None,
                 vocabulary: str = "checkpoint", max_length: int = 0, max_gen_toks: int = 256,
                 batch_size: int | str | None = None, seed: int = 0, module: str = "",
                 weights: str = "", sampler: str = "static", loaded: LoadedModel | None = None,
                 **ignored):
        super().__init__()
        if loaded is None:
            if not checkpoint:
                raise UserError("model_args needs checkpoint=PATH (a run's workdir, a step "
                                "folder, or a `convert import` folder).")
            size = 0 if batch_size in (None, "auto") else int(str(batch_size).split(":")[0])
            loaded = load(checkpoint, step=None if step is None else int(step),
                          vocabulary=vocabulary, batch_size=size, max_length=int(max_length),
                          seed=int(seed), module=module, weights=weights, sampler=sampler)
        # Requests done, rate and ETA when run on its own (harness, lm_eval); training's
        # harness evaluations have the train line.
        self.meter = progress.Meter if checkpoint else progress.Silent
        self.loaded = loaded
        self.vocabulary = loaded.vocabulary
        self._max_length = loaded.max_length
        self.max_gen_toks = int(max_gen_toks)

    # -- what lm-eval reads of a model ------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.vocabulary.eos_id)

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is scored after: the vocabulary's BOS where it has one (a
        decoder run here starts its rows with it), else EOS; HFLM's default choice, so an
        export scored by lm-eval's ``hf`` model with its defaults reads the same rows."""
        return few_shot.empty_context_id(self.vocabulary)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.vocabulary, "model_path", type(self.vocabulary).__name__))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs
                   ) -> list[int]:
        """A text's ids framed as the checkpoint's tokenizer frames it unless
        ``add_special_tokens=False`` (HFLM's default: the tokenizer's template, e.g. a
        decoder run's start id first)."""
        ids = [int(t) for t in self.vocabulary.encode(string)]
        return ids if add_special_tokens is False else [*self.loaded.prefix, *ids]

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.vocabulary.decode([int(t) for t in tokens])

    # -- batching ---------------------------------------------------------------------------
    def _batches(self, lengths: list[int], limit: int):
        """``(indices, width)`` per batch: the requests longest first, each batch in the
        bucket width of its longest (at most ``limit``)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        size = self.loaded.runner.settings.batch_size
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            yield chunk, bucket(max(lengths[i] for i in chunk), limit)

    # -- scoring ----------------------------------------------------------------------------
    def _score(self, pairs: list[tuple[list[int], list[int]]], disable_tqdm: bool = False
               ) -> list[tuple[float, bool]]:
        """``(log-likelihood, is_greedy)`` of each ``(context, continuation)``."""
        loaded = self.loaded
        out: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
        inputs = [len(context) + len(continuation) - 1 for context, continuation in pairs]
        meter = progress.Silent if disable_tqdm else self.meter
        with meter(f"{NAME} loglikelihood", len(pairs), "requests") as shown:
            for chunk, width in self._batches(inputs, self.max_length):
                rows = [few_shot.request_row(*pairs[i], width) for i in chunk]
                scores, greedy = loaded.runner.continuation_rows(loaded.params, rows)
                for i, score, is_greedy in zip(chunk, scores, greedy, strict=True):
                    out[i] = (float(score), bool(is_greedy))
                shown.advance(len(chunk))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        for (_, continuation), _, continuation_tokens in requests:
            if len(continuation_tokens) > self.max_length:
                raise UserError(f"A continuation of {len(continuation_tokens)} tokens does not "
                                f"fit max_length={self.max_length}; raise max_length in "
                                f"model_args (continuation {continuation[:40]!r}).")
        results = self._score([(list(c), list(k)) for _, c, k in requests], disable_tqdm)
        for (pair, _, _), result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's whole log-likelihood over lm-eval's disjoint rolling windows."""
        windows, owners = [], []
        for index, (text,) in enumerate(req.args for req in requests):
            for window in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, self._score(windows, disable_tqdm), strict=True):
            totals[owner] += score
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation -------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Requests grouped by their generation options, each group decoded in batches."""
        groups: dict[str, list[int]] = {}
        for index, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(
                index)
        out = [""] * len(requests)
        meter = progress.Silent if disable_tqdm else self.meter
        with meter(f"{NAME} generate_until", len(requests), "requests") as shown:
            for indices in groups.values():
                texts = self._generate([requests[i].args[0] for i in indices],
                                       requests[indices[0]].args[1], shown)
                for i, text in zip(indices, texts, strict=True):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _generate(self, contexts: list[str], gen_kwargs: dict, shown) -> list[str]:
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None),
                                      eos=self.tok_decode([self.eot_token_id]) or None)
        new_tokens = int(kwargs.pop("max_gen_toks"))
        room = self.max_length - new_tokens
        if room <= 0:
            raise UserError(f"max_gen_toks={new_tokens} leaves no room for a prompt in "
                            f"max_length={self.max_length}; lower max_gen_toks.")
        decode = {"temperature": float(kwargs.get("temperature") or 0.0)
                  if kwargs.get("do_sample") else 0.0}
        if decode["temperature"] and kwargs.get("top_p") is not None:
            decode["top_p"] = float(kwargs["top_p"])
        if decode["temperature"] and kwargs.get("top_k") is not None:
            decode["top_k"] = int(kwargs["top_k"])
        prompts = [self.tok_encode(c)[-room:] or [self.prefix_token_id] for c in contexts]
        texts = [""] * len(prompts)
        for chunk, width in self._batches([len(p) for p in prompts], room):
            rows = [few_shot.prompt_row(prompts[i], width) for i in chunk]
            tokens = self.loaded.runner.predict_rows(self.loaded.params, rows, new_tokens,
                                                     num_beams=1, **decode)
            for i, row in zip(chunk, tokens, strict=True):
                texts[i] = postprocess_generated_text(self.tok_decode(self._until_eos(row)),
                                                      stop=until, think_end_token=None)
            shown.advance(len(chunk))
        return texts

    def _until_eos(self, tokens) -> list[int]:
        ids = np.asarray(tokens).tolist()
        return ids[:ids.index(self.eot_token_id)] if self.eot_token_id in ids else ids
