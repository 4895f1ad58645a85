"""Config checks for ``model.family = "bilm"`` (called by ``config_lib.validate``)."""

from __future__ import annotations


def validate_bilm(config, error) -> None:
    if config.pack:
        raise error("model.family='bilm' reads unpacked, right-padded rows (its backward LSTM "
                    "reverses each row within its length, and packed segments would leak "
                    "state across examples); set --config.pack=False.")
    if "inputs" in config.task_feature_lengths:
        raise error("model.family='bilm' is a language model over one sequence; give it a "
                    "task with 'targets' only (e.g. --config.task=embedded_en_lm), not "
                    "inputs and targets.")
    if config.get("head") is not None and config.head.kind:
        raise error("model.family='bilm' has no fine-tuning heads; use its features "
                    "(benchmarks/elmo_scalar_mix.py) and set --config.head.kind=''.")
    model = config.model
    if len(model.filter_widths) != len(model.filter_counts) or not model.filter_widths:
        raise error(f"model.filter_widths={tuple(model.filter_widths)} and model.filter_counts="
                    f"{tuple(model.filter_counts)} must be non-empty and of equal length (one "
                    "count per convolution width).")
    if max(model.filter_widths) > model.max_chars:
        raise error(f"model.max_chars={model.max_chars} is shorter than the widest filter "
                    f"({max(model.filter_widths)}); raise max_chars.")
    if model.char_vocabulary not in ("embedded", ""):
        raise error(f"model.char_vocabulary={model.char_vocabulary!r}: use 'embedded' (the "
                    "embedded SentencePiece pieces) or '' (characters from the ids' bytes).")
    for key in ("lstm_dim", "projection_dim", "num_layers", "max_chars", "char_embed_dim"):
        if model[key] <= 0:
            raise error(f"model.{key}={model[key]} must be positive.")
