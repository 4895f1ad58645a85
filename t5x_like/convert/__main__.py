"""``python -m t5x_like.convert import|export``: see ``t5x_like/convert/__init__.py``."""

from __future__ import annotations

import argparse
import sys

from t5x_like.convert import hf_albert, hf_bart, hf_bert, hf_gpt2, hf_io, hf_llama, hf_roberta, hf_t5, pretrained

ARCHITECTURES = {"t5": hf_t5, "mt5": hf_t5, "gpt2": hf_gpt2, "bert": hf_bert,
                 "roberta": hf_roberta, "llama": hf_llama, "mistral": hf_llama, "albert": hf_albert,
                 "bart": hf_bart}
EXPORTERS = {"encoder_decoder": hf_t5, "decoder": hf_gpt2, "encoder": hf_bert}


def exporter_for(model_config: dict):
    """The Hugging Face architecture a model config maps back to."""
    family = model_config.get("family")
    if family not in EXPORTERS:
        raise ValueError(f"Cannot export model family {family!r} yet; exportable: "
                         f"{sorted(EXPORTERS)}.")
    if family == "decoder" and model_config.get("position_embedding") == "rotary":
        return hf_llama
    return EXPORTERS[family]


def import_hf(hf_dir: str, out: str) -> dict:
    hf_config = hf_io.read_config(hf_dir)
    model_type = hf_config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"Cannot import model_type {model_type!r} yet; supported: "
                         f"{sorted(ARCHITECTURES)}.")
    module = ARCHITECTURES[model_type]
    model_config = module.model_config_from_hf(hf_config)
    params = module.params_from_hf(hf_io.read_weights(hf_dir), model_config)
    pretrained.save_pretrained(out, model_config, params)
    return model_config


def export_hf(checkpoint: str, out: str) -> dict:
    model_config, params = pretrained.load_pretrained(checkpoint)
    module = exporter_for(model_config)
    hf_config = module.hf_config_from_model_config(model_config)
    hf_io.write_folder(out, hf_config, module.params_to_hf(params, model_config))
    return hf_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.convert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="Hugging Face folder -> t5x_like pretrained folder")
    imp.add_argument("--hf_dir", required=True)
    imp.add_argument("--out", required=True)
    exp = sub.add_parser("export", help="t5x_like pretrained folder -> Hugging Face folder")
    exp.add_argument("--checkpoint", required=True)
    exp.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "import":
            cfg = import_hf(args.hf_dir, args.out)
            print(f"imported {args.hf_dir} -> {args.out} ({cfg['family']}, d_model "
                  f"{cfg['d_model']})")
        else:
            export_hf(args.checkpoint, args.out)
            print(f"exported {args.checkpoint} -> {args.out}")
    except (FileNotFoundError, FileExistsError, ValueError, KeyError) as e:
        print(f"convert: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
