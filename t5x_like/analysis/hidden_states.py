"""Every layer's hidden states from any family's checkpoint, without touching the models.

A Flax method interceptor watches the stack's blocks (``stacking.run_stack`` names them
``layers_<i>``, or ``shared_layer`` for ALBERT's one shared block) while the model
runs: layer 0 is the input of the first block (the embedding output: BERT's
LayerNorm-ed sum, GPT-2's token + position sum, T5's token lookup), layer ``k`` is the
output of block ``k``. Block outputs are the raw residual stream: the final norm that
pre-norm models (GPT-2, T5) apply after the last block is not part of any layer.

Which stack: encoders and decoders their only one; encoder-decoders (T5, BART) their
encoder; ELECTRA its discriminator. The model is rebuilt as a loop of blocks without
remat (neither changes a number), so scanned checkpoints read the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like import models, resolving, structures
from t5x_like.builtin_tasks import pretraining as builtin
from t5x_like.checkpoints import param_sources
from t5x_like.config import spec_of
from t5x_like.errors import UserError
from t5x_like.models import stacking

# The names run_stack gives blocks (the per-layer loop, and ALBERT's shared block).
_BLOCK_NAME = re.compile(r"layers_\d+|shared_layer")
# When the model has no learned-position limit (T5's relative positions).
DEFAULT_MAX_LENGTH = 512


@dataclasses.dataclass
class EmbeddingModel:
    """A network, its params and vocabulary, ready to return the hidden states of chosen
    layers for a padded ``[batch, length]`` batch of token ids (0 = padding)."""

    config: object          # the run config (ml_collections.ConfigDict)
    params: dict            # host arrays
    vocabulary: object
    checkpoint: str = ""
    step: int | None = None
    random_init: bool = False

    def __post_init__(self):
        self.config = _unrolled(self.config)
        self._structure = structures.structure_class(self.config.model.family)
        self.structure = self._structure.name  # e.g. "encoder", "encoder_decoder"
        self.model = structures.for_config(self.config).model
        self.params = stacking.unstack_layer_params(self.params)
        self._method, self.stack = self._structure.hidden_stack(self.config)
        probe = jax.eval_shape(functools.partial(_all_layers, self.model, self._method),
                               self.params, np.ones((1, 4), np.int32))
        self.num_layers = probe.shape[0] - 1
        self.d_model = int(probe.shape[-1])
        if self.num_layers < 1:
            raise UserError(f"{self.checkpoint}: found no blocks named layers_<i> in the "
                            f"{self.config.model.family} model, so there are no layers to read.")

    @property
    def max_length(self) -> int:
        """Tokens one input may have: the learned positions, or DEFAULT_MAX_LENGTH."""
        return int(structures.Structure.learned_positions(self.config.model)
                   or DEFAULT_MAX_LENGTH)

    @functools.cached_property
    def framing(self) -> tuple[list[int], list[int]]:
        return self._structure.text_framing(self.vocabulary)

    def hidden_states(self, tokens: np.ndarray, layers: Sequence[int]) -> np.ndarray:
        """``[len(layers), batch, length, d_model]`` float32."""
        out = _jitted_all_layers()(self.model, self._method, self.params,
                                   np.asarray(tokens, np.int32))
        return np.asarray(jax.device_get(out))[list(layers)]


def _unrolled(config):
    """The spec with the stack as a plain loop of blocks and no remat (same numbers)."""
    spec = spec_of(config)
    numerics = spec.model.numerics.replace(scan_layers=False, remat_policy="none")
    return spec.replace(model=spec.model.replace(numerics=numerics))


def _all_layers(model, method, params, tokens):
    """``[num_layers + 1, batch, length, d]``: the model's forward pass with an
    interceptor recording the first block's input and every block's output."""
    states = []

    def record(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name == "__call__" and _BLOCK_NAME.fullmatch(context.module.name or ""):
            if not states:
                states.append(args[0])
            states.append(out[0] if isinstance(out, tuple) else out)
        return out

    with nn.intercept_methods(record):
        model.apply({"params": params}, tokens, method=method)
    if not states:
        return jnp.zeros((0,) + tokens.shape + (1,), jnp.float32)
    return jnp.stack([state.astype(jnp.float32) for state in states])


@functools.cache
def _jitted_all_layers():
    """One compiled function per (model config, method, shapes), shared by every
    EmbeddingModel: flax modules hash by their config."""
    return jax.jit(_all_layers, static_argnums=(0, 1))


def load(checkpoint: str, *, step: int | None = None, random_init: bool = False,
         vocabulary: str | None = None, seed: int = 0,
         flag: str = "--checkpoint") -> EmbeddingModel:
    """The newest (or ``step``'s) params of a run or pretrained folder; ``random_init``:
    the same config with fresh params from ``seed`` (the untrained control). ``flag``:
    the option that named ``checkpoint``, for error messages."""
    source = param_sources.resolve(checkpoint, flag)
    steps = source.steps()
    if not steps:
        raise UserError(f"{flag}={checkpoint}: {source.path} holds no complete checkpoint.")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"--step={step}: {checkpoint} has steps {steps}; pass one of them.")
    resolved = resolving.resolve_checkpoint(source, step, vocabulary=vocabulary,
                                       vocabulary_flag="--vocabulary")
    config = resolved.spec
    chosen = resolved.asked_vocabulary or resolved.trained_vocabulary
    if chosen is None:
        chosen = builtin.embedded_vocabulary()
    resolving.check_fits(config, chosen, f"--checkpoint={checkpoint}")
    if random_init:
        params = _fresh_params(config, seed)
    else:
        params = param_sources.load_params(source, step, config)
    return EmbeddingModel(config, params, chosen, checkpoint=str(checkpoint),
                          step=None if source.kind == "pretrained" else step,
                          random_init=random_init)


def _fresh_params(config, seed: int) -> dict:
    if structures.mode_structures.wrapping(config) is not None:
        raise UserError("--random_init needs a pretraining checkpoint; this one has a "
                        "fine-tuning head or a reward model (its random control is the "
                        "pretraining config's).")
    model = structures.for_config(_unrolled(config)).model
    variables = jax.jit(model.init)(jax.random.PRNGKey(seed), *models.example_inputs(model))
    return jax.device_get(nn.meta.unbox(variables["params"]))
