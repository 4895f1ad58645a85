"""``python -m t5x_like.convert import|export``: see ``t5x_like/convert/__init__.py``."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import numpy as np

from t5x_like import errors, resolving, structures
from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.checkpoints import hf_io, param_sources, pretrained
from t5x_like.config import legacy, model_spec_class, model_spec_of
from t5x_like.convert import (
    hf_albert,
    hf_bart,
    hf_bert,
    hf_distilbert,
    hf_electra,
    hf_gemma,
    hf_gpt2,
    hf_llama,
    hf_longformer,
    hf_mbart,
    hf_moe,
    hf_roberta,
    hf_switch,
    hf_t5,
    hf_xlm_roberta,
    model_card,
)
from t5x_like.data import hf_tokenizers, vocabularies
from t5x_like.engine import trainer as trainer_lib
from t5x_like.errors import UserError
from t5x_like.system import storage

ARCHITECTURES = {"t5": hf_t5, "mt5": hf_t5, "gpt2": hf_gpt2, "bert": hf_bert,
                 "roberta": hf_roberta, "llama": hf_llama, "mistral": hf_llama, "qwen2": hf_llama, "qwen3": hf_llama,
                 "gemma2": hf_gemma, "gemma3_text": hf_gemma, "albert": hf_albert,
                 "bart": hf_bart, "electra": hf_electra, "distilbert": hf_distilbert,
                 "mbart": hf_mbart, "xlm-roberta": hf_xlm_roberta,
                 "longformer": hf_longformer, "mixtral": hf_moe, "qwen2_moe": hf_moe,
                 "switch_transformers": hf_switch}
EXPORTERS = {"encoder_decoder": hf_t5, "decoder": hf_gpt2, "encoder": hf_bert,
             "electra": hf_electra, "bart": hf_bart}
# A model's recorded variant (``model.variant``, the Hugging Face model_type it is) ->
# the exporter that writes it back; a model without one (older folders, our own runs)
# is read from its switches (``exporter_for``).
VARIANT_EXPORTERS = {"t5": hf_t5, "mt5": hf_t5, "switch_transformers": hf_switch,
                     "gpt2": hf_gpt2, "llama": hf_llama, "mistral": hf_llama, "qwen2": hf_llama,
                     "qwen3": hf_llama, "gemma2": hf_gemma, "gemma3_text": hf_gemma,
                     "mixtral": hf_moe, "qwen2_moe": hf_moe, "bert": hf_bert,
                     "distilbert": hf_distilbert, "electra": hf_electra, "bart": hf_bart,
                     "mbart": hf_bart}
# What each exportable family becomes, for the refusal that lists them.
EXPORTED_AS = {"encoder_decoder": "T5, or Switch Transformers with experts",
               "decoder": "GPT-2, or Llama/Mistral/Qwen2/Qwen3/Gemma 2/Gemma 3 with rotary "
                          "positions, Mixtral/Qwen2-MoE with experts",
               "encoder": "BERT or DistilBERT", "electra": "ELECTRA",
               "bart": "BART, or mBART when pre-norm"}


def exporter_for(model_config: dict):
    """The Hugging Face architecture a model config (its flat view, ``flat_model``) maps
    back to: the one its ``variant`` records, else the one its switches describe."""
    family = model_config.get("family")
    variant = model_config.get("variant")
    if variant in VARIANT_EXPORTERS:
        return VARIANT_EXPORTERS[variant]
    if family not in EXPORTERS:
        exportable = "; ".join(f"{name} (as {EXPORTED_AS[name]})" for name in sorted(EXPORTERS))
        raise UserError(f"A model of family {family!r} cannot be exported to Hugging Face yet; "
                        f"exportable families: {exportable}.")
    experts = bool(model_config.get("num_experts"))
    if family == "decoder" and model_config.get("position_embedding") == "rotary":
        if experts:
            return hf_moe
        return hf_gemma if model_config.get("post_sublayer_norms") else hf_llama
    if experts and family == "encoder_decoder":
        return hf_switch
    if experts:
        raise UserError(f"A {family} model with experts (model.num_experts="
                        f"{model_config['num_experts']}) has no Hugging Face exporter; "
                        "exportable mixtures of experts: rotary decoders (as Mixtral/Qwen2-MoE) "
                        "and T5 encoder-decoders (as Switch Transformers).")
    if (family == "encoder" and model_config.get("type_vocab_size") == 1
            and not model_config.get("position_offset")):
        return hf_distilbert  # no token types, positions from 0: DistilBERT's layout
    return EXPORTERS[family]


def import_hf(hf_dir: str, out: str, generator_dir: str | None = None) -> dict:
    hf_config = hf_io.read_config(hf_dir)
    model_type = hf_config.get("model_type")
    if model_type not in ARCHITECTURES and model_type != "electra":
        supported = ", ".join(sorted({*ARCHITECTURES, "electra"}))
        if model_type is None:
            raise UserError(f"{hf_dir}/config.json has no model_type entry, which convert "
                            f"needs (supported model_types: {supported}); re-save the model "
                            "with save_pretrained, which writes it.")
        if model_type in hf_moe.UNSUPPORTED:
            raise UserError(f"{hf_dir}/config.json has {hf_moe.unsupported_message(model_type)} "
                            f"All supported model_types: {supported}.")
        raise UserError(f"{hf_dir}/config.json has model_type {model_type!r}, which convert "
                        f"cannot import; supported model_types: {supported}.")
    if generator_dir and model_type != "electra":
        raise UserError(f"--generator_dir is for ELECTRA's generator; {hf_dir} is a "
                        f"{model_type!r} model. Leave --generator_dir out.")
    if model_type == "electra":
        return _import_electra(hf_dir, out, generator_dir)
    module = ARCHITECTURES[model_type]
    try:
        model_config = module.model_config_from_hf(hf_config)
    except KeyError as e:
        raise UserError(f"{hf_dir}/config.json has no {e.args[0]!r} entry, which a "
                        f"{model_type} config needs; re-save the model with save_pretrained.") \
            from None
    except UserError:
        raise  # a variant convert does not support, named at its source
    except (TypeError, ValueError) as e:  # int(None), float("abc"): a malformed entry
        raise UserError(f"{hf_dir}/config.json has an entry of the wrong type ({e}); re-save "
                        "the model with save_pretrained.") from None
    pretrained.check_new_folder(out)  # before the weights are read
    weights = _TrackedWeights(hf_io.read_weights(hf_dir))
    try:
        params = module.params_from_hf(weights, model_config)
    except UserError as e:  # a tensor missing or left over
        raise UserError(f"{hf_dir}: {e}") from None
    except (ValueError, IndexError, TypeError) as e:  # a tensor that does not reshape
        raise UserError(_tensor_problem(hf_dir, weights, weights.last, str(e))) from None
    _check_param_shapes(hf_dir, params, model_config, weights)
    _check_tensor_shapes(hf_dir, module, params, model_config, weights)
    _save_imported(hf_dir, out, hf_config, model_config, params)
    return model_config


def _import_electra(hf_dir: str, out: str, generator_dir: str | None) -> dict:
    """Discriminator (and generator) folders -> one ``electra`` pretrained folder."""
    discriminator = hf_io.read_config(hf_dir)
    hf_electra.check_folder(discriminator, hf_dir, "ElectraForPreTraining")
    generator = None
    if generator_dir:
        generator = hf_io.read_config(generator_dir, "--generator_dir")
        hf_electra.check_folder(generator, generator_dir, "ElectraForMaskedLM")
    else:
        print(f"convert: {hf_dir} imports without a generator (no --generator_dir): it "
              "fine-tunes, but cannot continue ELECTRA pretraining.", file=sys.stderr)
    try:
        model_config = hf_electra.model_config_from_hf(discriminator, generator)
    except KeyError as e:
        raise UserError(f"An ELECTRA config.json has no {e.args[0]!r} entry; re-save the model "
                        "with save_pretrained.") from None
    except UserError:
        raise  # the towers do not belong together, named at the source
    except (TypeError, ValueError) as e:  # int(None), float("abc"): a malformed entry
        raise UserError(f"An ELECTRA config.json has an entry of the wrong type ({e}); re-save "
                        "the model with save_pretrained.") from None
    pretrained.check_new_folder(out)  # before the weights are read
    weights = _TrackedWeights(hf_io.read_weights(hf_dir))
    try:
        params = hf_electra.discriminator_from_hf(weights, model_config)
    except UserError as e:
        raise UserError(f"{hf_dir}: {e}") from None
    except (ValueError, IndexError, TypeError) as e:
        raise UserError(_tensor_problem(hf_dir, weights, weights.last, str(e))) from None
    if generator_dir:
        generator_weights = _TrackedWeights(hf_io.read_weights(generator_dir))
        try:
            params["generator"] = hf_electra.generator_from_hf(generator_weights, model_config,
                                                               params["embeddings"])
        except UserError as e:
            raise UserError(f"{generator_dir}: {e}") from None
        except (ValueError, IndexError, TypeError) as e:
            raise UserError(_tensor_problem(generator_dir, generator_weights,
                                            generator_weights.last, str(e))) from None
    _check_param_shapes(hf_dir, params, model_config, weights)
    _save_imported(hf_dir, out, discriminator, model_config, params)
    return model_config


def _save_imported(hf_dir: str, out: str, hf_config: dict, model_config: dict, params) -> None:
    """The pretrained folder, with the Hugging Face tokenizer copied beside the weights
    (checked to fit the embedding table first, so a mismatch writes nothing)."""

    files = hf_tokenizers.tokenizer_files(hf_dir)
    if files:
        try:
            vocabulary = hf_tokenizers.load(hf_dir, hf_config)
        except (FileNotFoundError, ValueError) as e:
            raise UserError(f"{hf_dir}: the tokenizer does not load ({e}).") from None
        vocabularies.check_fits(vocabulary, model_config["vocab_size"],
                                f"{hf_dir}: the tokenizer",
                                "the tokenizer belongs to another model. Copy the tokenizer "
                                "files from the model's own folder.")
    else:
        print(f"convert: warning: {hf_dir} has no tokenizer files ({', '.join(hf_tokenizers.TOKENIZER_FILES[:3])}, "
              "...); the model imports without one, so text tasks cannot use "
              "--vocabulary=checkpoint. Save the tokenizer into that folder and import again.",
              file=sys.stderr)
    model_type = hf_config.get("model_type")
    spec = model_spec_of(model_config)
    if model_type in spec.VARIANTS:  # the architecture it is, which export reads
        spec = spec.replace(variant=model_type)
    pretrained.save_pretrained(out, spec.to_dict(), params,
                               tokenizer_from=hf_dir if files else None,
                               metadata={"imported_from": str(pathlib.Path(hf_dir).absolute()),
                                         "model_type": model_type})


class _TrackedWeights(dict):
    """The HF tensors, remembering the last one read: a reshape that fails inside an
    architecture's converter is reported by that tensor's name."""

    last: str | None = None

    def __getitem__(self, key):
        self.last = key
        if key not in self:
            raise hf_t5.missing_tensor(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in self:
            self.last = key
        return super().get(key, default)


def _tensor_problem(hf_dir, weights, name, detail: str) -> str:
    shape = tuple(dict.__getitem__(weights, name).shape) if name in weights else None
    return (f"{hf_dir}: tensor {name!r} (shape {shape}) does not fit the model its config.json "
            f"describes ({detail}). The weights and config.json come from different models; "
            "copy both from the same save_pretrained folder.")


def _check_tensor_shapes(hf_dir, module, params, model_config: dict, weights) -> None:
    """Every Hugging Face tensor has the shape the converted model exports it back to: a
    converter that slices a fused tensor would otherwise drop extra rows silently."""

    to_hf = getattr(module, "params_to_hf", None)
    if to_hf is None:  # an import-only architecture: the param shapes were checked
        return
    try:
        exported = {name: tuple(np.shape(value))
                    for name, value in to_hf(params, model_config).items()}
    except (KeyError, ValueError, NotImplementedError):
        return  # a variant the exporter does not write back: nothing to compare with
    for name in weights:
        got = tuple(dict.__getitem__(weights, name).shape)
        want = exported.get(name)
        if want is None:  # the same tensor under a prefix ("transformer.h.0..." vs "h.0...")
            want = next((shape for key, shape in exported.items()
                         if name.endswith("." + key) or key.endswith("." + name)), None)
        if want is not None and got != want:
            raise UserError(_tensor_problem(hf_dir, weights, name,
                                            f"the config's model has it as {want}"))


def _check_param_shapes(hf_dir, params, model_config: dict, weights) -> None:
    """Every converted parameter has the shape the config's model expects; a mismatch
    names the Hugging Face tensor it came from."""


    expected = dict(trainer_lib.flat_parameter_shapes(model_config))
    for name, leaf in trainer_lib.flat_with_paths(params):
        want = expected.get(name)
        if want is None or tuple(np.shape(leaf)) == tuple(want):
            continue
        sources = [k for k in weights if np.may_share_memory(dict.__getitem__(weights, k), leaf)]
        detail = f"it converts to {name} of shape {tuple(np.shape(leaf))}, expected {want}"
        raise UserError(_tensor_problem(hf_dir, weights, sources[0], detail) if sources else
                        f"{hf_dir}: parameter {name} has shape {tuple(np.shape(leaf))}, the model "
                        f"its config.json describes expects {want}; the weights and config.json "
                        "come from different models.")


def export_vocabulary(value: str, own=None):
    """The vocabulary an export writes: the checkpoint's own (``checkpoint``: ``own``),
    a built-in one (``embedded``, ``byte``), a tokenizer path, or ``none``."""

    if value == "none":
        return None
    if value == "embedded":
        return tasks.embedded_vocabulary()
    if value == "byte":
        return tasks.byte_vocabulary()
    if value == "checkpoint":
        return own
    try:
        return hf_tokenizers.load(value)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"--vocabulary={value}: {e}") from None


def load_for_export(checkpoint: str):
    """``(model_config, host params, the checkpoint's vocabulary or None, provenance,
    head)`` of a pretrained folder, or of a training run's newest step (or the step folder
    given); the provenance is what the model card says of it (``model_card.Provenance``);
    ``head`` is the run's structure's ``exported_head`` ("sequence_classifier" for a
    reward model's run, params ``{"backbone", "head"}``; "" for the architecture's own)."""

    folder = storage.path(checkpoint)
    run_config = folder / "config.json"
    if not (folder / "model_config.json").is_file() and run_config.is_file():
        peft = json.loads(run_config.read_text()).get("peft") or {}
        if (peft.get("lora") or {}).get("rank"):
            raise UserError(
                f"{checkpoint} is a LoRA run's workdir, not a pretrained folder; fold its LoRA "
                f"into the base first: python -m t5x_like.peft merge --peft={checkpoint} "
                "--out=MERGED, then export MERGED.")
    source = param_sources.resolve(checkpoint)
    if source.kind == "pretrained":
        saved = source.saved_config(0)
        flat = flat_model(saved["model"])
        exporter_for(flat)  # an unexportable family is refused before the weights load
        _, params = pretrained.load_pretrained(source.path)
        return (flat, params, resolving.checkpoint_vocabulary(source, {}),
                model_card.Provenance(checkpoint), "")
    steps = source.steps()
    if not steps:
        raise UserError(f"{checkpoint} holds no complete checkpoint yet.")
    step = steps[-1]
    resolved = resolving.resolve_checkpoint(source, step)
    config = resolved.spec
    head = structures.for_config(config).exported_head
    if (structures.mode_structures.wrapping(config) is not None and not head
            or config.peft.enabled):
        raise UserError(f"{checkpoint} is a fine-tuned head or PEFT run; Hugging Face export "
                        "writes the pretrained architectures and reward models only (merge "
                        "LoRA with `python -m t5x_like.peft merge` first).")
    flat = flat_model(config.model)
    exporter_for(flat)  # before the weights are restored
    if head and flat["family"] != "decoder":
        raise UserError(f"{checkpoint} is a reward model on a {flat['family']} model; Hugging "
                        "Face export writes decoder reward models (as "
                        "<Architecture>ForSequenceClassification) only.")
    params = param_sources.load_params(source, step, config)
    print(f"convert: exporting step {step} of {source.path.parent}", file=sys.stderr)
    return (flat, params, resolved.trained_vocabulary,
            model_card.Provenance(checkpoint, source.path.parent, step, config), head)


def flat_model(model) -> dict:
    """A model (spec or section, either layout) in the flat view the converters read:
    the keys Hugging Face configs name, ``config.legacy.flat_model``."""
    spec = model_spec_of(model)
    return legacy.flat_model(spec, model_spec_class(spec.family).defaults())


def as_sequence_classifier(hf_config: dict, named: dict, params: dict) -> tuple[dict, dict]:
    """A decoder reward model as Hugging Face's ``<Architecture>ForSequenceClassification``
    with one label (what TRL's reward and value models are): the backbone's weights under
    the causal model's names without its LM head, and ``score.weight`` ([1, hidden], no
    bias). Hugging Face reads the score at each row's last token that is not
    ``pad_token_id``, where ours reads it (the last real token)."""
    architecture = hf_config["architectures"][0]
    for ending in ("ForCausalLM", "LMHeadModel"):
        architecture = architecture.replace(ending, "ForSequenceClassification")
    named = {key: value for key, value in named.items() if key != "lm_head.weight"}
    named["score.weight"] = np.asarray(params["head"]["kernel"]).T
    hf_config = {**hf_config, "architectures": [architecture], "num_labels": 1,
                 "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
                 "pad_token_id": hf_config.get("pad_token_id") or 0}
    return hf_config, named


# The ids ``generate`` reads from ``generation_config.json``, and the heads that generate.
GENERATION_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
GENERATING_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def generation_config(hf_config: dict) -> dict | None:
    """``generation_config.json`` of an export whose head generates (None otherwise): the
    special ids ``generate`` stops and pads with, as ``config.json`` has them (the
    tokenizer's, ``export_hf``).

    A decoder whose pad id is also the start id its rows begin with (ours: 0 for both)
    gets no pad id: ``generate`` given one and no attention mask masks every token equal
    to it, the prompt's start token included; without one it pads with EOS and attends
    to the whole prompt."""
    architecture = (hf_config.get("architectures") or [""])[0]
    if not architecture.endswith(GENERATING_HEADS):
        return None
    ids = {key: hf_config[key] for key in GENERATION_IDS if hf_config.get(key) is not None}
    if (not architecture.endswith("ForConditionalGeneration")
            and ids.get("pad_token_id") == ids.get("decoder_start_token_id")):
        ids.pop("pad_token_id", None)
    return {**ids, "_from_model_config": False}


def run_generation_defaults(spec) -> dict:
    """What ``generate`` reads as its defaults from a run (``spec``; None: a pretrained
    folder, nothing): ``infer``'s decode length, the run's targets length."""
    if spec is None:
        return {}
    return {"max_new_tokens": int(spec.task_feature_lengths.get("targets", 64))}


def folder_spec(checkpoint: str):
    """A pretrained folder's spec (its model, at the run settings it carries or the
    defaults): what frames its tokenizer when the folder holds one of ours."""
    source = param_sources.resolve(checkpoint)
    return resolving.spec_for_checkpoint(source, source.saved_config(0))


def prompt_format(spec, tokenizer, run: bool = True) -> dict:
    """How the exported tokenizer frames a text, so that ``tokenizer(text)`` gives the
    prompt the run's model reads (``Structure.tokenizer_framing``: a decoder's start id,
    an encoder-decoder's EOS, BERT's [CLS] and [SEP]); the chat template of a decoder
    trained on inputs, whose prompts end with EOS (``Structure.chat_framing``); and which
    side it pads (the left, for a model that generates after its prompt). A pretrained
    folder (``run`` False) gets no chat template: what its prompts were is not known."""
    structure = structures.structure_class(spec.model.family)
    return {"framing": structure.tokenizer_framing(spec, tokenizer),
            "chat_framing": structure.chat_framing(spec, tokenizer) if run else None,
            "padding_side": "left" if structure.generates_after_prompt else ""}


def export_hf(checkpoint: str, out: str, vocabulary: str = "checkpoint") -> dict:
    model_config, params, own, provenance, head = load_for_export(checkpoint)
    module = exporter_for(model_config)
    tokenizer = export_vocabulary(vocabulary, own)
    if tokenizer is not None and tokenizer.vocab_size > model_config["vocab_size"]:
        raise UserError(f"--vocabulary={vocabulary} has {tokenizer.vocab_size} tokens but the "
                        f"model's embedding table has {model_config['vocab_size']} rows; export "
                        "with the vocabulary the model was trained with.")
    hf_config = module.hf_config_from_model_config(model_config)
    if tokenizer is not None:  # the config names the tokenizer's special ids, not guesses
        for name in ("eos", "bos", "pad"):
            value = getattr(tokenizer, f"{name}_id", None)
            if value is not None:
                hf_config[f"{name}_token_id"] = int(value)
    if head == "sequence_classifier":
        hf_config, named = as_sequence_classifier(
            hf_config, module.params_to_hf(params["backbone"], model_config), params)
    else:
        named = module.params_to_hf(params, model_config)
    hf_io.write_folder(out, hf_config, named)
    generation = generation_config(hf_config)
    if generation is not None:
        generation.update(run_generation_defaults(provenance.spec))
        (pathlib.Path(out) / "generation_config.json").write_text(
            json.dumps(generation, indent=2, sort_keys=True))
    num_params = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(params))
    (pathlib.Path(out) / "README.md").write_text(
        model_card.render(hf_config, num_params, provenance))
    if tokenizer is not None:
        spec = provenance.spec or folder_spec(checkpoint)
        hf_tokenizers.write_tokenizer(tokenizer, out, **prompt_format(
            spec, tokenizer, run=provenance.spec is not None))
    else:
        print(f"convert: warning: {checkpoint} carries no tokenizer, so {out} has none and "
              "AutoTokenizer cannot load it; pass --vocabulary=embedded|byte|PATH to write the "
              "one the model was trained with.", file=sys.stderr)
    if model_config["family"] == "electra" and model_config.get("generator_d_model"):
        # ELECTRA's generator is a model of its own in Hugging Face: beside the discriminator.
        hf_io.write_folder(pathlib.Path(out) / "generator",
                           module.hf_config_from_model_config(model_config, "generator"),
                           module.params_to_hf(params, model_config, "generator"))
    return hf_config


@errors.command_line("convert")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.convert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="Hugging Face folder -> t5x_like pretrained folder")
    imp.add_argument("--hf_dir", required=True)
    imp.add_argument("--out", required=True)
    imp.add_argument("--generator_dir", default=None,
                     help="ELECTRA: the generator (ElectraForMaskedLM) folder beside the "
                          "discriminator (ElectraForPreTraining) given as --hf_dir.")
    exp = sub.add_parser("export", help="t5x_like pretrained folder or run -> Hugging Face "
                                        "folder with its tokenizer")
    exp.add_argument("--checkpoint", required=True)
    exp.add_argument("--out", required=True)
    exp.add_argument("--vocabulary", default="checkpoint",
                     help="The tokenizer written beside the weights: checkpoint (the folder's "
                          "tokenizer/, the default), embedded (the 8k SentencePiece of the "
                          "built-in tasks), byte, a tokenizer folder/file, or none.")
    args = parser.parse_args(argv)
    if args.command == "import":
        cfg = import_hf(args.hf_dir, args.out, args.generator_dir)
        print(f"imported {args.hf_dir} -> {args.out} ({cfg['family']}, d_model "
              f"{cfg['d_model']})")
    else:
        export_hf(args.checkpoint, args.out, args.vocabulary)
        print(f"exported {args.checkpoint} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
