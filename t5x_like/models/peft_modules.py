"""Parameter-efficient tuning modules: LoRA and bottleneck adapters, added to any family
without touching its definition.

``with_peft(model, settings)`` returns the same model (same class, same parameter
paths) whose ``init`` and ``apply`` run under a Flax method interceptor:

- **LoRA** (Hu et al. 2021): every ``DenseGeneral`` whose kernel path matches
  ``settings.lora_targets`` (a regular expression searched in
  ``"decoder/layers_0/attention/query/kernel"``) gains ``lora_a`` (input dims x
  rank, Gaussian) and ``lora_b`` (rank x output dims, zeros) beside its kernel, and
  returns ``x @ W + (alpha / rank) * dropout(x) @ A @ B``. With ``B = 0`` that is the
  base model exactly; ``merge_lora`` folds the product into ``W``.
- **Adapters** (Houlsby et al. 2019): a bottleneck ``h + up(act(down(h)))`` on the
  output of every attention block and every feed-forward block (``houlsby``), or of
  the feed-forward blocks only (``pfeiffer``, Pfeiffer et al. 2021). ``up`` starts
  at zero, so an untrained adapter is the identity.
- **Prefix tuning** (Li & Liang 2021): every attention block (self and cross) attends
  to ``prefix_length`` learned keys and values of its own before the sequence; with
  ``prefix_reparameterize`` they come from a per-layer MLP over a learned
  ``[prefix, d_model]`` table (the stabilising trick of the paper), else they are
  learned directly.
- **Prompt tuning** (Lester et al. 2021): ``prompt_length`` learned embeddings enter
  the encoder in front of the input (T5's encoder; after ``[CLS]`` in a BERT-style
  encoder, whose outputs are returned without them), initialised from rows of the
  token embedding table (``prompt_init_ids``). Decoder-only models and BART take
  prefix tuning instead (config validation says so).

The new parameters carry logical axis names (the kernel's own for the input and
output dims, an unsharded rank/bottleneck dim), so they shard like the weight they
adapt and scanned stacks give them a leading ``layers`` axis. Which parameters train
is ``optim.trainable_mask``'s business; the names here (``lora_a``, ``lora_b``,
``adapter``) are what it looks for.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.models import layers

LORA_PARAMS = ("lora_a", "lora_b")
ADAPTER_MODULE = "adapter"
PREFIX_MODULE = "prefix"
PROMPT_PARAM = "prompt"
ADAPTER_PLACEMENTS = ("houlsby", "pfeiffer")
DEFAULT_LORA_TARGETS = r"(^|/)(query|value)/kernel$"


@dataclasses.dataclass(frozen=True)
class PeftSettings:
    """What ``config.peft`` asks of the model (hashable: models are cached by it)."""

    lora_rank: int = 0
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    lora_targets: str = DEFAULT_LORA_TARGETS
    adapter_size: int = 0
    adapter_activation: str = "gelu"
    adapter_placement: str = "houlsby"
    prefix_length: int = 0
    prefix_reparameterize: bool = False
    prefix_hidden: int = 512
    prompt_length: int = 0

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def adapters(self) -> bool:
        return self.adapter_size > 0

    @property
    def prefix(self) -> bool:
        return self.prefix_length > 0

    @property
    def prompt(self) -> bool:
        return self.prompt_length > 0

    @property
    def any(self) -> bool:
        return self.lora or self.adapters or self.prefix or self.prompt

    @classmethod
    def from_config(cls, peft) -> PeftSettings:
        if peft is None:
            return cls()
        lora, adapter = peft.get("lora") or {}, peft.get("adapter") or {}
        prefix, prompt = peft.get("prefix") or {}, peft.get("prompt") or {}
        return cls(lora_rank=int(lora.get("rank", 0)), lora_alpha=float(lora.get("alpha", 8.0)),
                   lora_dropout=float(lora.get("dropout", 0.0)),
                   lora_targets=str(lora.get("targets", DEFAULT_LORA_TARGETS)),
                   adapter_size=int(adapter.get("size", 0)),
                   adapter_activation=str(adapter.get("activation", "gelu")),
                   adapter_placement=str(adapter.get("placement", "houlsby")),
                   prefix_length=int(prefix.get("length", 0)),
                   prefix_reparameterize=bool(prefix.get("reparameterize", False)),
                   prefix_hidden=int(prefix.get("hidden", 512)),
                   prompt_length=int(prompt.get("length", 0)))


def with_peft(model: nn.Module, settings: PeftSettings) -> nn.Module:
    """``model`` with ``settings``' LoRA, adapters, prefixes or prompt (``model`` itself
    when none is on)."""
    if not settings.any:
        return model
    cls = _peft_class(type(model), settings)
    return cls(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model)
                  if f.init and f.name not in ("parent", "name")})


@functools.cache
def _peft_class(base: type, settings: PeftSettings) -> type:
    """A subclass of ``base`` whose ``init``/``apply`` install the interceptor. A subclass
    keeps ``isinstance`` checks, field values and parameter paths as they were."""
    interceptor = functools.partial(_intercept, settings)

    def init(self, *args, **kwargs):
        with nn.intercept_methods(interceptor):
            return base.init(self, *args, **kwargs)

    def apply(self, *args, **kwargs):
        with nn.intercept_methods(interceptor):
            return base.apply(self, *args, **kwargs)

    return type(base.__name__, (base,), {"init": init, "apply": apply,
                                         "_peft_settings": settings,
                                         "__module__": base.__module__})


def _module_path(module: nn.Module) -> str:
    return "/".join(str(p) for p in module.scope.path)


def _intercept(settings: PeftSettings, next_fun, args, kwargs, context):
    module = context.module
    if context.method_name != "__call__":
        return next_fun(*args, **kwargs)
    if settings.prompt:
        prompted = _prompt_call(settings.prompt_length, module, next_fun, args, kwargs)
        if prompted is not NotImplemented:
            return prompted
    if isinstance(module, layers.DenseGeneral) and settings.lora:
        path = _module_path(module) + "/kernel"
        if re.search(settings.lora_targets, path):
            return next_fun(*args, **kwargs) + _lora_delta(module, settings, *args, **kwargs)
        return next_fun(*args, **kwargs)
    if isinstance(module, layers.MultiHeadAttention) and settings.prefix:
        kv_heads = module.num_kv_heads or module.num_heads
        prefix = Prefix(settings.prefix_length, kv_heads, module.head_dim,
                        grouped=kv_heads != module.num_heads,
                        reparameterize=settings.prefix_reparameterize,
                        hidden=settings.prefix_hidden, name=PREFIX_MODULE)(args[0].shape[-1])
        kwargs = dict(kwargs, prefix_kv=prefix)
    if settings.adapters and (
            isinstance(module, layers.Mlp)
            or (isinstance(module, layers.MultiHeadAttention)
                and settings.adapter_placement == "houlsby")):
        out = next_fun(*args, **kwargs)
        return Adapter(settings.adapter_size, settings.adapter_activation, dtype=module.dtype,
                       name=ADAPTER_MODULE)(out)
    return next_fun(*args, **kwargs)


def _lora_delta(dense: layers.DenseGeneral, settings: PeftSettings, x: jax.Array) -> jax.Array:
    """``(alpha / r) * dropout(x) @ A @ B`` in ``dense``'s scope and compute dtype."""
    features = (dense.features,) if isinstance(dense.features, int) else tuple(dense.features)
    axes = layers._canonical_axes(dense.axis, x.ndim)
    in_shape = tuple(x.shape[a] for a in axes)
    in_names = tuple(dense.kernel_axes[:len(axes)])
    out_names = tuple(dense.kernel_axes[len(axes):])
    rank = settings.lora_rank
    fan_in = int(np.prod(in_shape))

    def a_init(key, shape, dtype=jnp.float32):
        # Hu et al.: A Gaussian, B zero, so training starts at the base model.
        return (jax.random.normal(key, shape, dtype) / np.sqrt(fan_in)).astype(dtype)

    a = dense.param("lora_a", nn.with_logical_partitioning(a_init, in_names + (None,)),
                    in_shape + (rank,), jnp.float32)
    b = dense.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros,
                                                           (None,) + out_names),
                    (rank,) + features, jnp.float32)
    x = x.astype(dense.dtype)
    if settings.lora_dropout > 0 and dense.has_rng("dropout"):  # training: objectives pass one
        keep = 1.0 - settings.lora_dropout
        mask = jax.random.bernoulli(dense.make_rng("dropout"), keep, x.shape)
        x = jnp.where(mask, x / keep, 0).astype(dense.dtype)
    low = layers.contract(x, a.astype(dense.dtype), axes)
    delta = layers.contract(low, b.astype(dense.dtype), (low.ndim - 1,))
    return delta * jnp.asarray(settings.lora_alpha / rank, dense.dtype)


def _named_param(module: nn.Module, name: str, init, names: tuple, shape: tuple) -> jax.Array:
    """A float32 parameter of ``module`` with logical axis ``names``."""
    return module.param(name, nn.with_logical_partitioning(init, names), shape, jnp.float32)


class Adapter(nn.Module):
    """Houlsby's bottleneck: ``h + up(act(down(h)))``, the up projection starting at zero."""

    size: int
    activation: str = "gelu"
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        if self.activation not in layers.ACTIVATIONS:
            raise ValueError(f"Unknown peft.adapter.activation {self.activation!r}; choose from "
                             f"{sorted(layers.ACTIVATIONS)}.")
        embed = h.shape[-1]
        param = functools.partial(_named_param, self)
        down = param("down_kernel", nn.initializers.normal(1e-2), ("embed", None),
                     (embed, self.size))
        down_bias = param("down_bias", nn.initializers.zeros, (None,), (self.size,))
        up = param("up_kernel", nn.initializers.zeros, (None, "embed"), (self.size, embed))
        up_bias = param("up_bias", nn.initializers.zeros, ("embed",), (embed,))
        x = h.astype(self.dtype)
        hidden = layers.ACTIVATIONS[self.activation](
            layers.contract(x, down.astype(self.dtype), (x.ndim - 1,)) + down_bias.astype(self.dtype))
        out = layers.contract(hidden, up.astype(self.dtype), (hidden.ndim - 1,))
        return (x + out + up_bias.astype(self.dtype)).astype(h.dtype)


# While an encoder-side call runs under prompt tuning: (the module that owns the prompt,
# where in the sequence the prompt sits). The token embedder's call reads it.
_PROMPT_SITE: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("prompt_site",
                                                                           default=None)


@contextlib.contextmanager
def _prompt_site(owner, offset: int):
    token = _PROMPT_SITE.set((owner, offset))
    try:
        yield
    finally:
        _PROMPT_SITE.reset(token)


def prompt_init_ids(length: int, vocab_size: int) -> np.ndarray:
    """Rows of the token table a fresh prompt copies: evenly spread over the first 5,000
    ids past the special ones (Lester et al. sample the 5,000 most frequent tokens;
    SentencePiece and WordPiece ids run roughly from frequent to rare)."""
    low, high = min(10, vocab_size - 1), max(min(5000, vocab_size), min(10, vocab_size - 1) + 1)
    return np.linspace(low, high - 1, length).round().astype(np.int32)


def _insert(x, offset: int, length: int, value):
    """``x [batch, seq, ...]`` with ``length`` copies of ``value`` at column ``offset``."""
    filler = jnp.full((x.shape[0], length) + x.shape[2:], value, x.dtype)
    return jnp.concatenate([x[:, :offset], filler, x[:, offset:]], axis=1)


@dataclasses.dataclass(frozen=True)
class PromptSite:
    """How a family's module takes prompt tuning's prompt (its class attribute
    ``PROMPT_SITE``; modules without one are left alone): ``length`` placeholder ids go
    into the rows of its ``tokens`` argument at column ``offset``. ``owner``: the prompt
    is this module's parameter and replaces those ids' embeddings (False: the module only
    sees the longer rows, as T5's decoder's cross-attention mask over the encoder's).
    ``aligned``: ``(argument, fill)`` lengthened alike; ``unpacked``: arguments that must
    be None (packed rows cannot take the prompt; ``packed_refusal`` says so);
    ``trimmed``: outputs whose prompt columns are cut back out."""

    tokens: str
    offset: int = 0
    owner: bool = True
    aligned: tuple[tuple[str, object], ...] = ()
    unpacked: tuple[str, ...] = ()
    packed_refusal: str = ""
    trimmed: tuple[str, ...] = ()


def _prompt_call(length: int, module, next_fun, args, kwargs):
    """Prompt tuning's changes to the calls it touches; ``NotImplemented`` elsewhere."""
    if isinstance(module, layers.Embed):
        return _prompted_embeddings(length, module, next_fun, args, kwargs)
    site = getattr(type(module), "PROMPT_SITE", None)
    if site is None:
        return NotImplemented
    bound = inspect.signature(type(module).__call__).bind(module, *args, **kwargs)
    given = bound.arguments
    if any(given.get(name) is not None for name in site.unpacked):
        raise ValueError(site.packed_refusal)
    given[site.tokens] = _insert(given[site.tokens], site.offset, length,
                                 _placeholder(module.config))
    for name, value in site.aligned:
        if given.get(name) is not None:
            given[name] = _insert(given[name], site.offset, length, value)
    if not site.owner:
        return next_fun(*bound.args[1:], **bound.kwargs)
    with _prompt_site(module, site.offset):
        out = next_fun(*bound.args[1:], **bound.kwargs)
    if not site.trimmed:
        return out
    def keep(x):
        return jnp.concatenate([x[:, :site.offset], x[:, site.offset + length:]], axis=1)
    return {k: keep(v) if k in site.trimmed else v for k, v in out.items()}


def _prompted_embeddings(length: int, module, next_fun, args, kwargs):
    """The token embedder of the module that owns the prompt (its site is entered): the
    placeholder rows' embeddings are the prompt's."""
    site = _PROMPT_SITE.get()
    if site is None or module.name != "token_embedder":
        return NotImplemented
    owner, offset = site
    table = module.embedding
    prompt = owner.param(
        PROMPT_PARAM, nn.with_logical_partitioning(
            lambda key, shape, dtype=jnp.float32: jnp.take(
                table, prompt_init_ids(shape[0], table.shape[0]), axis=0).astype(dtype),
            (None, "embed")), (length, module.features), jnp.float32)
    x = next_fun(*args, **kwargs)
    return jax.lax.dynamic_update_slice_in_dim(
        x, jnp.broadcast_to(prompt.astype(x.dtype)[None], (x.shape[0],) + prompt.shape),
        offset, axis=1)


def _placeholder(config) -> int:
    """An id that counts as a real token (its embedding is replaced by the prompt's)."""
    return int(getattr(config, "pad_id", 0)) + 1


class Prefix(nn.Module):
    """One attention block's learned prefix: ``(keys, values)``, each
    ``[length, kv_heads, head_dim]``."""

    length: int
    kv_heads: int
    head_dim: int
    grouped: bool = False
    reparameterize: bool = False
    hidden: int = 512

    @nn.compact
    def __call__(self, d_model: int) -> tuple[jax.Array, jax.Array]:
        heads_axis = "kv_heads" if self.grouped else "heads"
        shape = (self.length, self.kv_heads, self.head_dim)
        param = functools.partial(_named_param, self)
        if not self.reparameterize:
            init = nn.initializers.normal(0.02)
            return (param("key", init, (None, heads_axis, "kv"), shape),
                    param("value", init, (None, heads_axis, "kv"), shape))
        table = param("embedding", nn.initializers.normal(0.02), (None, "embed"),
                      (self.length, d_model))
        wi = param("wi", nn.initializers.lecun_normal(), ("embed", "mlp"), (d_model, self.hidden))
        bi = param("wi_bias", nn.initializers.zeros, ("mlp",), (self.hidden,))
        wo = param("wo", nn.initializers.normal(0.02), ("mlp", None, heads_axis, "kv"),
                   (self.hidden, 2) + shape[1:])
        bo = param("wo_bias", nn.initializers.zeros, (None, heads_axis, "kv"), (2,) + shape[1:])
        hidden = jnp.tanh(table @ wi + bi)
        both = jnp.einsum("ph,htkd->ptkd", hidden, wo) + bo
        return both[:, 0], both[:, 1]


def is_peft_param(path: tuple[str, ...]) -> bool:
    """Whether a parameter (by its path's keys) was added by LoRA, an adapter, a prefix or
    a prompt."""
    return (path[-1] in LORA_PARAMS or path[-1] == PROMPT_PARAM or ADAPTER_MODULE in path
            or PREFIX_MODULE in path)


def prompts_from_table(fresh: dict, base: dict) -> dict:
    """Fresh prompt params (flat ``{path tuple: array}``) re-initialised from the token
    table in ``base`` (pretrained params, flat), as ``prompt_init_ids`` picks rows: a
    fresh model's init copies its own random table."""
    tables = [key for key in base if key[-2:] == ("token_embedder", "embedding")]
    out = {}
    for key, value in fresh.items():
        if key[-1] != PROMPT_PARAM or not tables:
            out[key] = value
            continue
        # The table nearest the prompt in the tree (T5 shares one across encoder/decoder).
        table = max(tables, key=lambda t: sum(1 for a, b in zip(t, key, strict=False) if a == b))
        rows = np.asarray(base[table])
        out[key] = rows[prompt_init_ids(value.shape[0], rows.shape[0])].astype(value.dtype)
    return out


def merge_lora(params, settings: PeftSettings):
    """Params with every ``lora_a``/``lora_b`` pair folded into its kernel and removed:
    ``W + (alpha / r) A B``, in float32 (host numpy). The result loads into the model
    without LoRA and gives the same outputs."""
    def merge(node):
        if not isinstance(node, dict):
            return node
        node = {k: merge(v) for k, v in node.items()}
        if "lora_a" in node and "lora_b" in node:
            a = np.asarray(node.pop("lora_a"), np.float32)
            b = np.asarray(node.pop("lora_b"), np.float32)
            kernel = np.asarray(node["kernel"], np.float32)
            scale = settings.lora_alpha / settings.lora_rank
            if a.ndim + b.ndim - 2 == kernel.ndim + 1:  # scanned: a leading layers axis on all
                product = np.stack([np.tensordot(a[i], b[i], axes=1) for i in range(a.shape[0])])
            else:
                product = np.tensordot(a, b, axes=1)
            if product.shape != kernel.shape:
                raise ValueError(f"LoRA factors {a.shape} x {b.shape} do not make the kernel's "
                                 f"shape {kernel.shape}.")
            node["kernel"] = kernel + scale * product
        return node
    return merge(jax.tree.map(np.asarray, plain_dicts(params)))


def plain_dicts(tree):
    """A parameter tree with every mapping (FrozenDict included) as a plain dict."""
    if hasattr(tree, "items"):
        return {k: plain_dicts(v) for k, v in tree.items()}
    return tree
