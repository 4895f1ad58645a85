"""What every structure offers, and the arithmetic they share (log-likelihoods, token losses,
per-layer matmul counts)."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t5x_like import objectives
from t5x_like.config.evals import SAMPLERS
from t5x_like.errors import UserError
from t5x_like.models import decoding

# Keys of ``predict_batch`` beyond the batch: the decoding flags of ``infer`` and ``eval``.
DECODE_DEFAULTS = {"max_decode_length": 64, "num_beams": 1, "alpha": 0.6, "temperature": 0.0,
                   "top_k": 0, "top_p": 1.0}


def _target_logits(logits, targets) -> tuple[jax.Array, jax.Array]:
    """``(logits in float32, each position's target logit)``."""
    logits = logits.astype(jnp.float32)
    return logits, jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32),
                                       axis=-1)[..., 0]


def _target_log_likelihood(logits, targets, weights) -> jax.Array:
    """Sum over positions of ``log p(target)`` where ``weights`` > 0: ``[batch]``.

    The target's logit minus the log-sum-exp over the vocabulary, the two reductions
    XLA fuses into one pass over the logits: a whole ``log_softmax`` was written out and
    read back, which cost GPT-2's scoring 40% of its forward pass on CPU."""
    return _summed_log_likelihood(*_target_logits(logits, targets), weights)


def _summed_log_likelihood(logits, target, weights) -> jax.Array:
    return ((target - jax.nn.logsumexp(logits, axis=-1)) * weights).sum(axis=-1)


# The most alternatives a served completion reports per token (OpenAI's ``logprobs`` <= 5).
TOP_TOKENS = 5

FINAL_HIDDEN_SOW = 'self.sow("intermediates", "final_hidden", x)'


def _final_hidden(state, model) -> jax.Array:
    """The states a family ``sow``s as ``final_hidden`` before its vocabulary projection.
    Optional in a family's module: only what compares hidden states (distillation) asks
    for them, and a module that does not sow them is told so in one line naming its
    family and the call to add."""
    found = [value for key, value in
             traverse_util.flatten_dict(dict(state.get("intermediates", {}))).items()
             if key[-1] == "final_hidden"]
    if not found:
        config = getattr(model, "config", None)
        family = getattr(config, "family", None) or type(model).__name__
        raise UserError(
            f"model.family={family!r}: its module {type(model).__module__}."
            f"{type(model).__qualname__} does not sow its final hidden state, which "
            "distillation compares (its cosine loss, teacher against student); add "
            f"`{FINAL_HIDDEN_SOW}` in its __call__, on the states its vocabulary projection "
            "reads (after the final norm).")
    return found[0][0]


def dropout_rngs(rng, deterministic: bool):
    """Dropout randomness for ``model.apply``: only when training with an rng."""
    return {"dropout": rng} if (rng is not None and not deterministic) else None


def _token_loss_fn(structure, loss_config):
    """The train/eval loss of a token-level structure (seq2seq, decoder): its model's
    logits (``apply_model``) through ``objectives.token_objective`` with the config's
    label smoothing and z-loss; dropout runs exactly when given an rng."""
    options = {"label_smoothing": float(loss_config.label_smoothing),
               "z_loss": float(loss_config.z_loss)}

    chunks = int(getattr(loss_config, "logit_chunks", 1))

    def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
        weights, targets = batch[structure.weights_feature], batch[structure.targets_feature]
        if chunks > 1:  # the logits a slice of positions at a time (check_logit_chunks)
            hidden, state = structure.apply_model(model, params, batch, rng,
                                                  deterministic=rng is None, return_hidden=True,
                                                  mutable=[objectives.ROUTER_COLLECTION])
            objective, metrics = objectives.chunked_token_objective(
                lambda h: structure.project_logits(model, params, h), hidden, targets, weights,
                chunks=chunks, normalizer=normalizer, **options)
        else:
            logits, state = structure.apply_model(model, params, batch, rng,
                                                  deterministic=rng is None,
                                                  mutable=[objectives.ROUTER_COLLECTION])
            objective, metrics = objectives.token_objective(
                logits, targets, weights, normalizer=normalizer, **options)
        return _with_router_terms(objective, metrics, state, weights, normalizer)
    return loss_fn


def _with_router_terms(objective, metrics, state, weights, normalizer):
    """A mixture of experts' router losses (``objectives.router_terms``) added to a
    per-token objective, weighted by this batch's share of the ``normalizer``'s tokens
    so that microbatches add up to the whole batch's term; and their metrics."""
    aux, router_metrics = objectives.router_terms(state)
    if not router_metrics:
        return objective, metrics
    if normalizer is not None:
        aux = aux * weights.sum() / normalizer
    return objective + aux, {**metrics, **router_metrics}


def _layer_matmuls(d: int, heads: int, head_dim: int, d_ff: int, activations, attention_mats=4,
                   kv_heads: int | None = None):
    """Multiply-adds per token of one layer's projections (attention and MLP). With
    grouped-query attention the key and value projections have ``kv_heads`` heads."""
    kv_heads = kv_heads or heads
    attention = (attention_mats - 2) * d * heads * head_dim + 2 * d * kv_heads * head_dim
    return attention + (len(tuple(activations)) + 1) * d * d_ff


def _stack_matmuls(model, num_layers: int, attention_mats=4, kv_heads: int | None = None,
                   dims=None) -> float:
    """Multiply-adds per token of a stack of ``num_layers`` layers of ``model`` (a model
    spec; ``dims``: another tower's dimensions, ELECTRA's generator): ``_layer_matmuls``
    each, where a mixture-of-experts layer's MLP counts what a token runs through (active
    FLOPs, as MFU reads them): its ``k`` experts, the router, and the shared expert with
    its gate. Capacity dispatch computes empty slots too; they are not model FLOPs."""
    dims = dims or model
    d, f, activations = dims.d_model, dims.d_ff, model.mlp_activations
    dense = _layer_matmuls(d, dims.num_heads, dims.head_dim, f, activations, attention_mats,
                           kv_heads)
    if not model.expert_count:
        return num_layers * dense
    experts = model.experts
    projections = len(tuple(activations)) + 1
    shared = experts.shared_d_ff
    sparse = (dense - projections * d * f + d * experts.num_experts
              + experts.num_experts_per_token * projections * d * (experts.d_ff or f)
              + projections * d * shared + (d if shared and experts.shared_gate else 0))
    sparse_layers = num_layers // experts.every
    return (num_layers - sparse_layers) * dense + sparse_layers * sparse


class Structure:
    """Base: shared plumbing; subclasses say what differs."""

    name = ""
    #: the batch feature holding the loss weights, and the one holding the targets.
    weights_feature = "decoder_loss_weights"
    targets_feature = "decoder_target_tokens"

    #: whether distillation (``distill.py``) is built for this structure's families
    distillable = True
    #: whether k-shot multiple choice is scored as lm-evaluation-harness scores it
    #: (a causal LM's log-likelihood of each choice after the context)
    scores_choices_as_lm_eval = False
    #: whether a row is a prompt followed by what is generated, so that the targets length
    #: is the number of tokens to generate (decoders)
    generates_after_prompt = False
    #: whether the continuous-batching engine (``generation/engine.py``) decodes this
    #: structure's model (``--sampler=engine``): decoder-only language models
    decodes_with_engine = False
    #: whether the loss can run the output layer over slices of the positions
    #: (``loss.logit_chunks``, ``check_logit_chunks``): a token loss over a model whose
    #: ``__call__`` projects given hidden states (``project_hidden``)
    chunks_logits = False
    #: whether a retrieval tower can be this structure's network (BERT-style encoders)
    embeds_text = False
    #: the model keys that set the depth of its transformer stacks, which a scaling
    #: sweep's shape ladder sets together (empty: no such ladder, e.g. two towers or LSTMs)
    depth_keys: tuple[str, ...] = ()
    #: model rows per example (a preference pair is two: its chosen and rejected rows),
    #: what the loop's tokens per second count
    rows_per_example = 1
    #: the mode ``eval`` always uses for this structure's checkpoints ("" : the task and
    #: the flags choose; ``head``: a fine-tuned head's labels; ``pairs``: a reward model's
    #: scores of preference pairs)
    evaluation_mode = ""
    #: whether ``infer`` writes generated text (else the structure's own outputs: labels,
    #: values, tags or spans, with nothing to decode)
    writes_text = True
    #: whether a resume onto a mesh of fewer batch shards may split each batch into more
    #: optimizer microbatches (``training.preflight``); a head trains on whole batches
    splits_into_microbatches = True

    def __init__(self, model):
        self.model = model

    @classmethod
    def for_model(cls, model, prefix_attention: str = "bidirectional"):
        """The structure of ``model`` in a run (``data.prefix_attention``: how a decoder
        reads a prompt; other structures have no such choice)."""
        return cls(model)

    @classmethod
    def pretrained_lengths(cls, spec) -> dict[str, int] | None:
        """Task lengths for a pretrained folder's model when the default lengths do not
        fit it (``None``: the defaults do)."""
        return None

    @classmethod
    def evaluate_as_trained(cls, spec, saved: dict, imported: bool):
        """``spec`` with what evaluating a checkpoint needs from how it was trained
        (``saved``: the run's config, or an imported folder's ``{"model": ...}``)."""
        return spec

    @classmethod
    def evaluation_line(cls, config) -> str | None:
        """What ``eval`` says about how this model reads its rows (None: nothing)."""
        return None

    @classmethod
    def parameter_split(cls, shapes) -> str | None:
        """A line ``summary`` adds below the totals, where a family counts its parameters
        in parts (ELECTRA's two towers)."""
        return None

    def params_from_pretrained(self, flat_params: dict) -> dict:
        """Of a pretrained checkpoint's params (flattened), those this structure starts
        from (``init_from``); what is missing starts fresh (``starts_fresh``)."""
        return flat_params

    def starts_fresh(self, key: tuple) -> bool:
        """Whether a parameter (its flattened path) that ``init_from`` lacks may start from
        its init: a new task head's."""
        return key[0] == "head"

    #: whether the params hold, beside the model the run trains for use, models that only
    #: help train it (PPO's value model): checkpoint readers (``eval``, ``infer``,
    #: ``convert export``, ``init_from``) restore the run whole and keep
    #: ``trained_params`` of it
    keeps_helpers = False

    #: what ``convert export`` writes a run of this structure as: "" for its family's
    #: architecture (a wrapping mode's run is refused), "sequence_classifier" for a
    #: decoder with a scalar head on the last token (params ``{"backbone", "head"}``)
    exported_head = ""

    def trained_params(self, params):
        """Of this structure's params, those of the model it trains for use."""
        return params

    def reference(self) -> Structure:
        """The structure a frozen reference of this structure's run (DPO's, GRPO's and
        PPO's KL) is read with: this one, or the part of it the reference's params fit."""
        return self

    @classmethod
    def body_params_for_head(cls, flat_params: dict) -> dict:
        """Of a pretrained checkpoint's params (flattened paths under ``backbone``), those a
        fine-tuning head's body starts from."""
        return flat_params

    @classmethod
    def text_framing(cls, vocabulary) -> tuple[list[int], list[int]]:
        """``(prefix, suffix)`` ids around a text, as the structure pretrains on texts:
        here (T5's and BART's encoders) ``text EOS``."""
        return [], [int(vocabulary.eos_id)]

    @classmethod
    def prompt_framing(cls, spec, vocabulary) -> tuple[list[int], list[int]]:
        """``(prefix, suffix)`` ids around a prompt's text as the run's model reads it
        (``infer``'s free text; its tasks' inputs). Here the text's own framing (an
        encoder-decoder's ``text EOS``, BERT's ``[CLS] text [SEP]``)."""
        return cls.text_framing(vocabulary)

    @classmethod
    def tokenizer_framing(cls, spec, vocabulary) -> tuple[list[int], list[int]]:
        """``(prefix, suffix)`` ids an exported tokenizer adds around every text (its
        template), so ``tokenizer(text)`` gives the model's prompt: here the prompt's."""
        return cls.prompt_framing(spec, vocabulary)

    def text_prefix(self) -> tuple[int, ...]:
        """The ids this model's rows put before a text where its tokenizer's template adds
        them (``tokenizer_framing``'s prefix): what lm-eval's ``hf`` model puts first on
        an export, and our harness and k-shot scoring with it. None here."""
        return ()

    @classmethod
    def chat_framing(cls, spec, vocabulary) -> tuple[list[int], list[int]] | None:
        """``(prefix, suffix)`` ids around a user's message in the export's chat template,
        where a prompt's framing does not travel as the tokenizer's template (None: no
        chat template is written)."""
        return None

    @classmethod
    def with_start_id(cls, spec, vocabulary, saved_start: int | None = None):
        """``spec`` with the id its rows start with decided, where the family has one the
        run decides (a decoder's ``model.bos_id=-1``); here there is none."""
        return spec

    @classmethod
    def hidden_stack(cls, config) -> tuple[str | None, str]:
        """``(model method, words)``: the stack whose layers the embedding analyses read
        (``None``: the model's ``__call__``)."""
        return None, cls.name

    @classmethod
    def positions_needed(cls, config, lengths: Mapping[str, int]) -> int:
        """Learned positions one row of ``lengths`` takes (0: no learned-position limit
        applies, as for T5's relative positions)."""
        return 0

    @classmethod
    def check_eval_lengths(cls, config, lengths: Mapping[str, int], tasks,
                           few_shot: bool = False) -> None:
        """Refuses evaluation lengths the model cannot take, before anything compiles."""
        limit = cls.learned_positions(config.model)
        total = cls.positions_needed(config, lengths)
        if limit and total > limit:
            raise UserError(
                f"Lengths {dict(lengths)} need {total} positions, but the model has "
                f"max_length={limit} learned positions; lower --inputs_length/--targets_length "
                f"so they sum to at most {limit}.")

    @staticmethod
    def learned_positions(model) -> int:
        """Rows of the model's learned position table (0: none, relative or rotary)."""
        positions = getattr(model, "positions", None)
        if getattr(positions, "kind", "learned") != "learned":
            return 0
        return getattr(positions, "max_length", 0)

    @classmethod
    def check_decoding(cls, config, num_beams: int) -> None:
        """Refuses decoding settings (``--num_beams``) this structure's model cannot run,
        before anything is restored or compiled; a ``UserError`` names the fix."""

    @classmethod
    def check_sampler(cls, sampler: str, num_beams: int) -> None:
        """Refuses ``--sampler=engine`` where the engine cannot decode: a model it does not
        serve, or beam search (it decodes greedily or samples), in one line."""
        if sampler not in SAMPLERS:
            raise UserError(f"sampler={sampler!r}; choose one of {', '.join(SAMPLERS)}.")
        if sampler != "engine":
            return
        if not cls.decodes_with_engine:
            raise cls._not_engine_decoded()
        if num_beams > 1:
            raise UserError(f"--sampler=engine decodes greedily or samples; beam search "
                            f"(--num_beams={num_beams}) runs with --sampler=static.")

    def engine_decoder(self, params) -> tuple:
        """``(module, params, eos id)``: what the continuous-batching engine decodes this
        structure's generations with, ``params`` being the structure's own (a run's
        policy inside them, say)."""
        raise self._not_engine_decoded()

    def engine_prompts(self, batch) -> list:
        """Each row's prompt (token ids) of a host ``batch`` of ``predict_batch``'s rows,
        for the engine to continue."""
        raise self._not_engine_decoded()

    @classmethod
    def _not_engine_decoded(cls) -> UserError:
        return UserError(f"--sampler=engine: the continuous-batching engine decodes "
                         f"decoder-only language models, not {cls.name!r} ones; use "
                         "--sampler=static.")

    @classmethod
    def build_model(cls, spec, module_class):
        """The family's Flax module ``module_class(spec)`` (what it needs from outside its
        spec, such as a vocabulary's pieces, is given here)."""
        return module_class(spec)

    # -- data -------------------------------------------------------------------------------
    def feature_converter(self, task_feature_lengths: Mapping[str, int], pack: bool = False):
        raise NotImplementedError

    def model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        raise NotImplementedError

    def abstract_batch(self, task_feature_lengths, batch_size: int, sharding=None) -> dict:
        """Shapes and dtypes of one global batch, for ahead-of-time compilation."""
        lengths = self.model_feature_lengths(task_feature_lengths)
        batch = {name: jax.ShapeDtypeStruct((batch_size, n), jnp.int32, sharding=sharding)
                 for name, n in lengths.items()}
        batch[self.weights_feature] = jax.ShapeDtypeStruct(
            (batch_size, lengths[self.targets_feature]), jnp.float32, sharding=sharding)
        return batch

    # -- objectives -------------------------------------------------------------------------
    def apply_model(self, model, params, batch, rng=None, deterministic: bool = True):
        """The one place the family's model is called with its own signature, on a
        training batch: the outputs its objective reads (logits, or a dict of heads).
        ``model`` is this structure's (PEFT-wrapped in training) or a teacher's."""
        raise NotImplementedError

    def loss_fn(self, loss_config):
        """``(model, params, batch, rng, normalizer=None, num_sequences=None) ->
        (objective, metrics)``: ``apply_model``'s outputs through the family's pure
        objective (``objectives/``)."""
        raise NotImplementedError

    def check_logit_chunks(self, chunks: int) -> None:
        """Refuses ``loss.logit_chunks`` > 1 in one line where this structure's loss reads
        its logits whole (``chunks_logits``) or its module cannot project given hidden
        states (a plug-in family's ``__call__`` without ``project_hidden``)."""
        if chunks <= 1:
            return
        fix = "set --config.loss.logit_chunks=1."
        if not self.chunks_logits:
            raise UserError(f"loss.logit_chunks={chunks}: the {self.name or type(self).__name__} "
                            f"structure's loss reads its logits whole; {fix}")
        module = type(self.model)
        if not decoding.takes(self.model, "project_hidden"):
            raise UserError(f"loss.logit_chunks={chunks}: {module.__name__}.__call__ takes no "
                            f"project_hidden, through which the loss projects a slice; {fix}")

    def project_logits(self, model, params, hidden) -> jax.Array:
        """``model``'s output layer over final-normed ``hidden`` states (the chunked loss's
        slices); only where ``chunks_logits``."""
        raise NotImplementedError

    def logits(self, params, batch) -> jax.Array:
        """What scoring reads; no hidden states are asked for, so a family whose module
        does not sow them is scored and evaluated all the same."""
        return self.forward(self.model, params, batch, hidden=False)["logits"]

    def forward(self, model, params, batch, rng=None, deterministic: bool = True,
                hidden: bool = True) -> dict:
        """What distillation compares (``distill.py``): ``logits``, the final ``hidden``
        states (with ``hidden``), the objective's ``targets`` and ``weights``, and the
        ``positions`` ``[batch, length]`` whose distributions and states the student
        matches.

        Here, for the token structures (seq2seq and decoder): ``apply_model``'s logits
        and the ``final_hidden`` states the model sows (``_final_hidden``: optional in a
        family's module, refused in one line where asked for and not sown), over the
        positions the loss weights mark."""
        weights = batch[self.weights_feature]
        out = {"targets": batch[self.targets_feature], "weights": weights,
               "positions": (weights > 0).astype(jnp.float32)}
        if not hidden:
            return {"logits": self.apply_model(model, params, batch, rng, deterministic), **out}
        logits, state = self.apply_model(model, params, batch, rng, deterministic,
                                         mutable=["intermediates"])
        return {"logits": logits, "hidden": _final_hidden(state, model), **out}

    def score_batch(self, params, batch) -> jax.Array:
        """Per-example summed log-likelihood of the targets (``[batch]``, float32)."""
        return _target_log_likelihood(self.logits(params, batch), batch[self.targets_feature],
                                      batch[self.weights_feature])

    def continuation_scores(self, params, batch) -> tuple[jax.Array, jax.Array]:
        """lm-evaluation-harness's ``loglikelihood``: per example the summed
        log-probability of the weighted targets, and whether every one of them is the
        most likely token (``is_greedy``)."""
        targets, weights = batch[self.targets_feature], batch[self.weights_feature]
        logits, target = _target_logits(self.logits(params, batch), targets)
        # The target is the argmax where no logit exceeds it (an exact tie, which argmax
        # breaks by index, is the one case that reads differently); a max costs nothing
        # beside the log-sum-exp, where an argmax was another pass over the logits.
        greedy = (target >= jnp.max(logits, axis=-1)) | (weights == 0)
        return _summed_log_likelihood(logits, target, weights), jnp.all(greedy, axis=-1)

    def token_scores(self, params, batch) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Per position: the target's log-probability ``[batch, length]``, and the
        ``TOP_TOKENS`` most likely tokens and their log-probabilities ``[batch, length,
        TOP_TOKENS]`` (a served completion's ``logprobs``; float32)."""
        logits, target = _target_logits(self.logits(params, batch), batch[self.targets_feature])
        norm = jax.nn.logsumexp(logits, axis=-1)
        top_values, top_ids = jax.lax.top_k(logits, TOP_TOKENS)
        return target - norm, top_ids, top_values - norm[..., None]

    def predict_batch(self, params, batch, *, rng=None, **decode) -> jax.Array:
        raise NotImplementedError

    # -- what eval and infer ask of a checkpoint ----------------------------------------------
    def check_evaluated_tasks(self, name: str, tasks) -> None:
        """Refuses (``UserError``) an evaluation of ``tasks`` (``name``'s leaves) this
        structure cannot answer; any number of tasks by default."""

    def infer_rows(self, examples, task_feature_lengths, eos_id: int) -> list[dict]:
        """``infer``'s batch rows of ``examples`` (their ``inputs`` tokenized): prompts
        whose targets are a lone EOS, so a decoder's prompt ends where they begin."""
        converter = self.feature_converter(task_feature_lengths, pack=False)
        return [converter.convert_example(dict(ex, targets=np.asarray([eos_id], np.int32)),
                                          task_feature_lengths) for ex in examples]

    def output_texts(self, outputs, rows, decode) -> list[str]:
        """``infer``'s text of each row's output (``decode``: tokens -> text)."""
        return [decode(row) for row in outputs]

    def decode_step(self, batch_size: int, lengths: Mapping[str, int]):
        """One token of generation over a filled cache, for ``plan --decode``:
        ``(step, cache, inputs)``, where ``step(params, cache, *inputs)`` returns the
        logits and the new cache, and ``cache`` and ``inputs`` are abstract shapes."""
        raise UserError(f"A {self.name} model does not generate text, so it has no decode "
                        "step to plan; plan its training step (leave out --decode).")

    def paged_decode_step(self, slots: int, max_length: int, page_size: int, pages: int):
        """One step of the continuous-batching engine (``generation/engine.py``) for
        ``plan --decode --page_size``: a token for each of ``slots`` rows over a pool of
        ``pages`` key/value pages of ``page_size`` positions, each row's pages named by
        its page table. ``(step, cache, inputs)`` as ``decode_step``."""
        raise UserError(f"A {self.name} model is not served by the continuous-batching "
                        "engine (it decodes decoder-only models), so it has no paged decode "
                        "step to plan; leave out --page_size.")

    def forward_flops_per_sequence(self, model, lengths: Mapping[str, int]) -> float:
        raise NotImplementedError
