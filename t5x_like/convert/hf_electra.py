"""Hugging Face ELECTRA <-> t5x_like ``Electra``: a discriminator folder
(``ElectraForPreTraining``) and, optionally, a generator folder (``ElectraForMaskedLM``).

Hugging Face keeps the two as separate models, each with a copy of the embeddings
the original ELECTRA shares; here they are one ``embeddings`` tree. Import takes the
discriminator's copy and warns when the generator's differs (the released
checkpoints hold equal copies). Export writes the discriminator to ``--out`` and the
generator to ``--out/generator``. Without a generator the import is a
discriminator alone (``generator_d_model = 0``): it fine-tunes, it does not pretrain.
"""

from __future__ import annotations

import functools
import sys

import jax
import numpy as np

from t5x_like.convert import hf_bert
from t5x_like.convert.hf_t5 import TrackedWeights
from t5x_like.errors import UserError

_EMBEDDINGS = {"token_embedder": "word_embeddings", "position_embedder": "position_embeddings",
               "token_type_embedder": "token_type_embeddings"}


def _tower_sizes(hf: dict) -> dict:
    d_model, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    return {"d_model": d_model, "num_heads": heads, "head_dim": d_model // heads,
            "d_ff": int(hf["intermediate_size"]), "num_layers": int(hf["num_hidden_layers"])}


def check_folder(hf: dict, folder: str, architecture: str) -> None:
    if hf.get("model_type") != "electra":
        raise UserError(f"{folder}: model_type {hf.get('model_type')!r}, expected 'electra'.")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise UserError(f"{folder}: hidden_act {hf.get('hidden_act')!r}; ELECTRA converts with "
                        "'gelu' (its generator head is gelu whatever the config says).")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(f"{folder}: position_embedding_type "
                        f"{hf.get('position_embedding_type')!r} does not convert; only absolute "
                        "position embeddings are supported.")
    architectures = hf.get("architectures") or [architecture]
    if architecture not in architectures:
        other = ("--generator_dir" if architecture == "ElectraForPreTraining" else "--hf_dir")
        raise UserError(f"{folder} holds {architectures}, not {architecture}; pass the "
                        f"discriminator (ElectraForPreTraining) as --hf_dir and the generator "
                        f"(ElectraForMaskedLM) as --generator_dir (this one belongs in {other}).")


def model_config_from_hf(discriminator: dict, generator: dict | None = None) -> dict:
    config = {"family": "electra", "vocab_size": int(discriminator["vocab_size"]),
              **_tower_sizes(discriminator),
              "embedding_dim": int(discriminator.get("embedding_size",
                                                     discriminator["hidden_size"])),
              "max_length": int(discriminator["max_position_embeddings"]),
              "type_vocab_size": int(discriminator.get("type_vocab_size", 2)),
              "mlp_activations": ("gelu_exact",),
              "layer_norm_epsilon": float(discriminator.get("layer_norm_eps", 1e-12)),
              "pad_id": int(discriminator.get("pad_token_id", 0) or 0),
              "dropout_rate": 0.0, "dtype": "float32"}
    if generator is None:
        config["generator_d_model"] = 0
        return config
    for key in ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size"):
        if generator.get(key) != discriminator.get(key):
            raise UserError(f"The generator's {key} is {generator.get(key)}, the "
                            f"discriminator's {discriminator.get(key)}; ELECTRA's towers share "
                            "their embeddings, so these must be the generator and "
                            "discriminator of one pretraining run.")
    config.update({f"generator_{k}": v for k, v in _tower_sizes(generator).items()})
    return config


def _tower_from_hf(w, cfg: dict, which: str) -> dict:
    prefix = "generator_" if which == "generator" else ""
    d, heads, head_dim = (cfg[f"{prefix}d_model"], cfg[f"{prefix}num_heads"],
                          cfg[f"{prefix}head_dim"])
    tower = {f"layers_{i}": hf_bert.layer_from_hf(w, f"electra.encoder.layer.{i}", heads,
                                                  head_dim, d)
             for i in range(cfg[f"{prefix}num_layers"])}
    if "electra.embeddings_project.weight" in w:
        tower["embedding_projection"] = hf_bert._linear_in(w, "electra.embeddings_project")
    if which == "generator":
        tower["mlm_transform"] = hf_bert._linear_in(w, "generator_predictions.dense")
        tower["mlm_norm"] = hf_bert._norm_in(w, "generator_predictions.LayerNorm")
        tower["mlm_bias"] = w["generator_lm_head.bias"]
    else:
        tower["rtd_transform"] = hf_bert._linear_in(w, "discriminator_predictions.dense")
        tower["rtd_output"] = hf_bert._linear_in(w, "discriminator_predictions.dense_prediction")
    return tower


def _embeddings_from_hf(w) -> dict:
    e = "electra.embeddings"
    tables = {ours: {"embedding": w[f"{e}.{theirs}.weight"]} for ours, theirs in _EMBEDDINGS.items()}
    return {**tables, "embedding_norm": hf_bert._norm_in(w, f"{e}.LayerNorm")}


def params_from_hf(discriminator: dict[str, np.ndarray], cfg: dict,
                   generator: dict[str, np.ndarray] | None = None) -> dict:
    params = discriminator_from_hf(discriminator, cfg)
    if generator is not None:
        params["generator"] = generator_from_hf(generator, cfg, params["embeddings"])
    return params


def discriminator_from_hf(weights: dict[str, np.ndarray], cfg: dict) -> dict:
    """``embeddings`` and ``discriminator`` from an ``ElectraForPreTraining`` folder."""
    w = TrackedWeights(weights)
    params = {"embeddings": _embeddings_from_hf(w),
              "discriminator": _tower_from_hf(w, cfg, "discriminator")}
    w.check_all_used(ignore_suffixes=("position_ids", "token_type_ids"))
    return params


def generator_from_hf(weights: dict[str, np.ndarray], cfg: dict, embeddings: dict) -> dict:
    """The ``generator`` tree of an ``ElectraForMaskedLM`` folder; its embeddings are
    compared with the discriminator's (``embeddings``), which are the ones kept."""
    g = TrackedWeights(weights)
    own = _embeddings_from_hf(g)
    differs = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  if np.shape(a) == np.shape(b) else float("inf")
                  for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(embeddings), strict=False))
    if differs > 0:
        print(f"convert: warning: the generator's embeddings differ from the discriminator's "
              f"(max |diff| {differs:.3g}); ELECTRA shares one set, the discriminator's is "
              "kept.", file=sys.stderr)
    tower = _tower_from_hf(g, cfg, "generator")
    g.check_all_used(ignore=("generator_lm_head.weight",),  # tied to the word embeddings
                     ignore_suffixes=("position_ids", "token_type_ids"))
    return tower


def hf_config_from_model_config(cfg: dict, which: str = "discriminator") -> dict:
    prefix = "generator_" if which == "generator" else ""
    d, heads, head_dim = (cfg[f"{prefix}d_model"], cfg[f"{prefix}num_heads"],
                          cfg[f"{prefix}head_dim"])
    if heads * head_dim != d:
        raise UserError(f"The {which} has {heads} heads of {head_dim} on a width of {d} and "
                        "does not export: Hugging Face ELECTRA needs num_heads x head_dim = "
                        "d_model.")
    if tuple(cfg.get("mlp_activations", ("gelu_exact",))) != ("gelu_exact",):
        raise UserError("Only ELECTRA with exact GELU (mlp_activations ('gelu_exact',)) "
                        "exports, as hidden_act 'gelu'.")
    return {"architectures": ["ElectraForMaskedLM" if which == "generator"
                              else "ElectraForPreTraining"],
            "model_type": "electra", "vocab_size": cfg["vocab_size"],
            "embedding_size": cfg.get("embedding_dim") or cfg["d_model"], "hidden_size": d,
            "num_attention_heads": heads, "num_hidden_layers": cfg[f"{prefix}num_layers"],
            "intermediate_size": cfg[f"{prefix}d_ff"],
            "max_position_embeddings": cfg["max_length"],
            "type_vocab_size": cfg["type_vocab_size"], "hidden_act": "gelu",
            "layer_norm_eps": cfg["layer_norm_epsilon"], "pad_token_id": cfg["pad_id"],
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "position_embedding_type": "absolute", "tie_word_embeddings": True}


def params_to_hf(params: dict, cfg: dict, which: str = "discriminator") -> dict[str, np.ndarray]:
    """The tensors of one Hugging Face folder: the discriminator's or the generator's,
    each with its copy of the shared embeddings."""
    arr = np.asarray
    prefix = "generator_" if which == "generator" else ""
    tower = params[which]
    out = {}
    put = functools.partial(hf_bert.put_out, out)
    e = "electra.embeddings"
    for ours, theirs in _EMBEDDINGS.items():
        out[f"{e}.{theirs}.weight"] = arr(params["embeddings"][ours]["embedding"])
    put(f"{e}.LayerNorm", params["embeddings"]["embedding_norm"])
    if "embedding_projection" in tower:
        put("electra.embeddings_project", tower["embedding_projection"])
    for i in range(cfg[f"{prefix}num_layers"]):
        out.update(hf_bert.layer_to_hf(tower[f"layers_{i}"], f"electra.encoder.layer.{i}",
                                       cfg[f"{prefix}d_model"]))
    if which == "generator":
        put("generator_predictions.dense", tower["mlm_transform"])
        put("generator_predictions.LayerNorm", tower["mlm_norm"])
        # generator_lm_head.weight is the word embedding: transformers ties it on load.
        out["generator_lm_head.bias"] = arr(tower["mlm_bias"])
    else:
        put("discriminator_predictions.dense", tower["rtd_transform"])
        put("discriminator_predictions.dense_prediction", tower["rtd_output"])
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
