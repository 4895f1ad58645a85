"""Task features -> the model's features (seqio's names), padded to fixed lengths."""

from __future__ import annotations

from typing import Mapping

import numpy as np


def _pad_or_trim(tokens: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros(length, dtype=np.int32)
    tokens = np.asarray(tokens, dtype=np.int32)[:length]
    out[: tokens.size] = tokens
    return out


class EncDecFeatureConverter:
    """``inputs``/``targets`` -> encoder/decoder arrays; decoder inputs are targets shifted right.

    Over-long features are trimmed (seqio's behaviour); padding is id 0 and gets
    loss weight 0. Packing arrives with the data-pipeline issue.
    """

    FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                "decoder_loss_weights")

    def model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return {"encoder_input_tokens": task_feature_lengths["inputs"],
                "decoder_input_tokens": task_feature_lengths["targets"],
                "decoder_target_tokens": task_feature_lengths["targets"],
                "decoder_loss_weights": task_feature_lengths["targets"]}

    def __call__(self, example: Mapping[str, np.ndarray],
                 task_feature_lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
        targets = _pad_or_trim(example["targets"], task_feature_lengths["targets"])
        decoder_inputs = np.concatenate([[0], targets[:-1]]).astype(np.int32)
        return {
            "encoder_input_tokens": _pad_or_trim(example["inputs"], task_feature_lengths["inputs"]),
            "decoder_input_tokens": decoder_inputs,
            "decoder_target_tokens": targets,
            "decoder_loss_weights": (targets != 0).astype(np.float32),
        }
