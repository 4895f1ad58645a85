"""Task features -> the model's features (seqio's names), padded or packed to fixed lengths.

Unpacked: each example is trimmed and padded with 0 (loss weight 0). Packed:
grain's best-fit packing (64 open rows by default) puts several examples in one row; ``*_segment_ids``
(1, 2, ... and 0 for padding) and ``*_positions`` (restarting at 0) tell the
model where each example lies, and decoder inputs restart with 0 at every
segment, so nothing leaks across examples. With ``num_packing_bins=1`` it is
seqio's greedy packing; more bins fill rows more densely (see the benchmark).

A converter works on a grain ``IterDataset`` (``apply``) and, for tests and
notebooks, on a plain iterable of examples or a single example (``__call__``).
"""

from __future__ import annotations

from collections.abc import Mapping

import grain
import numpy as np

from t5x_like.errors import MissingField


class MissingFeatures(MissingField):
    """An example reached the feature converter without a feature the model needs: the
    task's data or preprocessors, not ours (``pipeline`` names the record)."""


def pad_or_trim(tokens, length: int, dtype=np.int32) -> np.ndarray:
    out = np.zeros(length, dtype=dtype)
    tokens = np.asarray(tokens, dtype=dtype).reshape(-1)[:length]
    out[: tokens.size] = tokens
    return out


def shift_right_per_segment(targets: np.ndarray, segment_ids: np.ndarray | None,
                            start_id: int = 0) -> np.ndarray:
    """Decoder inputs: targets shifted right by one, with ``start_id`` at the start of
    every segment (0 where padding starts)."""
    shifted = np.concatenate([[start_id], targets[:-1]]).astype(np.int32)
    if segment_ids is not None:
        starts = np.concatenate([[True], segment_ids[1:] != segment_ids[:-1]])
        shifted = np.where(starts, np.where(segment_ids > 0, start_id, 0), shifted)
    return shifted


# Both fill up to ``num_packing_bins`` rows and emit them all when an example fits none;
# best fit puts each example in the fullest row it fits. One bin = seqio's greedy packing.
PACKERS = {"first_fit": grain.experimental.FirstFitPackIterDataset,
           "best_fit": grain.experimental.BestFitPackIterDataset}


class FeatureConverter:
    """Base: which task features are packed, and how they become model features."""

    #: task feature -> the task length key it is trimmed/packed to.
    PACKED_FEATURES: Mapping[str, str] = {}
    #: task features that must be present.
    REQUIRED: tuple[str, ...] = ()

    def __init__(self, pack: bool = False, num_packing_bins: int = 64,
                 packing_algorithm: str = "best_fit"):
        if num_packing_bins < 1:
            raise ValueError(f"num_packing_bins must be >= 1, got {num_packing_bins}.")
        if packing_algorithm not in PACKERS:
            raise ValueError(f"packing_algorithm={packing_algorithm!r}; pick one of "
                             f"{sorted(PACKERS)}.")
        self.pack = pack
        self.num_packing_bins = num_packing_bins
        self.packing_algorithm = packing_algorithm

    def __repr__(self):
        return (f"{type(self).__name__}(pack={self.pack}, num_packing_bins="
                f"{self.num_packing_bins}, packing_algorithm={self.packing_algorithm!r})")

    # -- what subclasses define ------------------------------------------------
    def task_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """Length of each task feature to trim or pack to."""
        return {f: int(task_feature_lengths[key]) for f, key in self.PACKED_FEATURES.items()}

    def prepare(self, example: Mapping, lengths: Mapping[str, int]) -> dict:
        """The example's packable features, trimmed to their lengths (1-D numpy arrays)."""
        missing = [f for f in self.REQUIRED if f not in example]
        if missing:
            raise MissingFeatures(
                f"{type(self).__name__} needs task features {list(self.REQUIRED)}; the example "
                f"lacks {missing} (it has {sorted(example)}). Check the task's preprocessors or "
                "pick the converter for the model family.")
        return {f: np.asarray(example[f]).reshape(-1)[:lengths[f]]
                for f in self.PACKED_FEATURES if f in example}

    def convert(self, features: Mapping[str, np.ndarray], example: Mapping,
                packed: bool) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        raise NotImplementedError

    # -- shared machinery ---------------------------------------------------------
    def _check_lengths(self, task_feature_lengths):
        for f, key in self.PACKED_FEATURES.items():
            if f in self.REQUIRED and key not in task_feature_lengths:
                raise ValueError(f"{type(self).__name__} needs task_feature_lengths[{key!r}]; got "
                                 f"{dict(task_feature_lengths)}.")

    def convert_example(self, example: Mapping, task_feature_lengths: Mapping[str, int]) -> dict:
        """One example, padded (no packing)."""
        self._check_lengths(task_feature_lengths)
        lengths = self.task_lengths(task_feature_lengths)
        features = self.prepare(example, lengths)
        padded = {f: pad_or_trim(v, lengths[f], v.dtype) for f, v in features.items()}
        # Where the real tokens end, as one packed segment would say: token id 0 is a
        # real token in some tokenizers (GPT-2's "!"), so padding is not found by value.
        padded.update({f"{f}_segment_ids": (np.arange(lengths[f]) < min(v.size, lengths[f]))
                       .astype(np.int32) for f, v in features.items()})
        return self.convert(padded, example, packed=False)

    def apply(self, ds: grain.IterDataset, task_feature_lengths: Mapping[str, int]
              ) -> grain.IterDataset:
        """The model's features for every example of ``ds`` (a grain IterDataset)."""
        self._check_lengths(task_feature_lengths)
        if not self.pack:
            return ds.map(lambda ex: self.convert_example(ex, task_feature_lengths))
        lengths = self.task_lengths(task_feature_lengths)

        def prepare_for_packing(example):
            if "next_sentence_labels" in example:
                raise ValueError("Next-sentence examples cannot be packed (one label per row); "
                                 "use pack=False for NSP tasks.")
            return self.prepare(example, lengths)

        packed = PACKERS[self.packing_algorithm](
            ds.map(prepare_for_packing), length_struct=lengths,
            num_packing_bins=self.num_packing_bins, shuffle_bins=False)
        return packed.map(lambda row: self.convert(row, row, packed=True))

    def __call__(self, examples, task_feature_lengths: Mapping[str, int]):
        """A single example dict -> one converted dict; an iterable -> a list of them."""
        if isinstance(examples, Mapping):
            return self.convert_example(examples, task_feature_lengths)
        ds = grain.MapDataset.source(list(examples)).to_iter_dataset()
        return list(self.apply(ds, task_feature_lengths))


def _segments(row, feature, packed):
    return row[f"{feature}_segment_ids"] if packed else None


class EncDecFeatureConverter(FeatureConverter):
    """``inputs``/``targets`` -> encoder/decoder arrays; decoder inputs are targets shifted
    right (restarting at each packed segment). Padding has loss weight 0."""

    PACKED_FEATURES = {"inputs": "inputs", "targets": "targets"}
    REQUIRED = ("inputs", "targets")

    def convert(self, row, example, packed):
        targets = row["targets"].astype(np.int32)
        out = {
            "encoder_input_tokens": row["inputs"].astype(np.int32),
            "decoder_input_tokens": shift_right_per_segment(targets, _segments(row, "targets", packed)),
            "decoder_target_tokens": targets,
            "decoder_loss_weights": (row["targets_segment_ids"] > 0).astype(np.float32),
        }
        if packed:
            out.update({
                "encoder_segment_ids": row["inputs_segment_ids"],
                "encoder_positions": row["inputs_positions"],
                "decoder_segment_ids": row["targets_segment_ids"],
                "decoder_positions": row["targets_positions"],
            })
        return out

    def model_feature_lengths(self, lengths):
        out = {"encoder_input_tokens": lengths["inputs"], "decoder_input_tokens": lengths["targets"],
               "decoder_target_tokens": lengths["targets"], "decoder_loss_weights": lengths["targets"]}
        if self.pack:
            out.update({"encoder_segment_ids": lengths["inputs"],
                        "encoder_positions": lengths["inputs"],
                        "decoder_segment_ids": lengths["targets"],
                        "decoder_positions": lengths["targets"]})
        return out


class EncoderFeatureConverter(FeatureConverter):
    """BERT: aligned ``inputs`` (masked) and ``targets`` (original).

    Loss weights come from the example's ``loss_weights`` (every selected position, as
    BERT trains); without them, seqio's rule: positions where ``inputs == mask_id``.
    ``token_type_ids`` become ``encoder_token_type_ids``; ``next_sentence_labels`` pass
    through (unpacked only). ``global_attention`` (a Longformer): the task's
    ``global_attention_mask`` (1 on the global tokens, e.g. a question's; by default an
    example's first token) becomes ``encoder_global_attention_mask``.
    """

    REQUIRED = ("inputs", "targets")

    def __init__(self, pack: bool = False, num_packing_bins: int = 64,
                 packing_algorithm: str = "best_fit", mask_id: int | None = None,
                 global_attention: bool = False):
        super().__init__(pack, num_packing_bins, packing_algorithm)
        self.mask_id = mask_id
        self.global_attention = global_attention

    @property
    def PACKED_FEATURES(self):  # noqa: N802  (seqio-style class constant, per instance here)
        features = {"inputs": "inputs", "targets": "inputs", "loss_weights": "inputs",
                    "token_type_ids": "inputs"}
        if self.global_attention:
            features["global_attention_mask"] = "inputs"
        return features

    def prepare(self, example, lengths):
        features = super().prepare(example, lengths)
        inputs = features["inputs"]
        if "loss_weights" not in features:
            if self.mask_id is None:
                raise ValueError("EncoderFeatureConverter: the examples have no loss_weights; "
                                 "pass mask_id= to take the loss where inputs == [MASK] (seqio).")
            features["loss_weights"] = (inputs == self.mask_id).astype(np.float32)
        if "token_type_ids" not in features:
            features["token_type_ids"] = np.zeros(inputs.size, np.int32)
        if self.global_attention and "global_attention_mask" not in features:
            features["global_attention_mask"] = (np.arange(inputs.size) == 0).astype(np.int32)
        return features

    def convert(self, row, example, packed):
        out = {"encoder_input_tokens": row["inputs"].astype(np.int32),
               "encoder_target_tokens": row["targets"].astype(np.int32),
               "encoder_loss_weights": row["loss_weights"].astype(np.float32),
               "encoder_token_type_ids": row["token_type_ids"].astype(np.int32)}
        if self.global_attention:
            out["encoder_global_attention_mask"] = row["global_attention_mask"].astype(np.int32)
        if packed:
            out["encoder_segment_ids"] = row["inputs_segment_ids"]
            out["encoder_positions"] = row["inputs_positions"]
        elif "next_sentence_labels" in example:
            out["next_sentence_labels"] = np.asarray(example["next_sentence_labels"], np.int32)
        return out

    def model_feature_lengths(self, lengths):
        names = ["encoder_input_tokens", "encoder_target_tokens", "encoder_loss_weights",
                 "encoder_token_type_ids"]
        if self.pack:
            names += ["encoder_segment_ids", "encoder_positions"]
        return {n: lengths["inputs"] for n in names}


class DecoderFeatureConverter(FeatureConverter):
    """Decoder-only: causal LM on ``targets``, or prefix LM when examples have ``inputs``.

    Prefix LM (``prefix_lm=True``): the row is inputs + targets;
    ``decoder_causal_attention`` is 1 over the inputs and one position more (the first
    decoder input of the targets is the last input token), as in seqio; the loss is on
    the targets only unless ``loss_on_targets_only=False``. ``bidirectional_prefix=False``
    leaves out ``decoder_causal_attention``: the prefix is read causally, as GPT
    fine-tuning and lm-evaluation-harness condition on a prompt. ``start_id`` is the
    first decoder input of every sequence (the model's ``bos_id``: 0 for the runs of
    this framework, the tokenizer's BOS for an imported causal LM).

    Examples that carry ``inputs`` while ``prefix_lm=False`` are refused: silently
    dropping the inputs would train a language model on the targets alone. A causal LM
    example may carry a ``loss_mask`` beside its ``targets`` (a chat's assistant tokens,
    ``data/chat.py``): the loss weights are multiplied by it, packed or not.
    """

    REQUIRED = ("targets",)

    def __init__(self, pack: bool = False, num_packing_bins: int = 64,
                 packing_algorithm: str = "best_fit", prefix_lm: bool = False,
                 loss_on_targets_only: bool = True, bidirectional_prefix: bool = True,
                 start_id: int = 0):
        super().__init__(pack, num_packing_bins, packing_algorithm)
        self.start_id = int(start_id)
        self.prefix_lm = prefix_lm
        self.loss_on_targets_only = loss_on_targets_only
        self.bidirectional_prefix = bidirectional_prefix

    @property
    def PACKED_FEATURES(self):  # noqa: N802  (seqio-style class constant, per instance here)
        return ({"targets": "targets", "inputs_width": "targets", "loss_mask": "targets"}
                if not self.prefix_lm else {"targets": "prefix_lm", "inputs_width": "prefix_lm"})

    def task_lengths(self, lengths):
        if not self.prefix_lm:
            length = int(lengths["targets"])
            return {"targets": length, "inputs_width": length, "loss_mask": length}
        total = int(lengths["inputs"]) + int(lengths["targets"])
        return {"targets": total, "inputs_width": total}

    def _check_lengths(self, lengths):
        needed = ("inputs", "targets") if self.prefix_lm else ("targets",)
        for key in needed:
            if key not in lengths:
                raise ValueError(f"DecoderFeatureConverter(prefix_lm={self.prefix_lm}) needs "
                                 f"task_feature_lengths[{key!r}]; got {dict(lengths)}.")

    def prepare(self, example, lengths):
        if self.prefix_lm:
            if "inputs" not in example:
                raise KeyError("DecoderFeatureConverter(prefix_lm=True) needs 'inputs' and "
                               f"'targets'; the example has {sorted(example)}.")
            inputs = np.asarray(example["inputs"], np.int32)
            tokens = np.concatenate([inputs, np.asarray(example["targets"], np.int32)])
            width = inputs.size
        else:
            if "inputs" in example:
                raise ValueError(
                    "DecoderFeatureConverter(prefix_lm=False) got examples with 'inputs', which "
                    "it would drop. Pass prefix_lm=True (the inputs become the prefix, the loss "
                    "covers the targets) or give task_feature_lengths an 'inputs' length; or "
                    "remove the feature with a Rekey step if the task is plain language modelling.")
            tokens, width = np.asarray(super().prepare(example, lengths)["targets"]), 0
        tokens = tokens[:lengths["targets"]]
        out = {"targets": tokens, "inputs_width": np.full(tokens.size, width, np.int32)}
        if not self.prefix_lm:  # every example the same features, so any may be packed
            mask = example.get("loss_mask")
            out["loss_mask"] = (np.ones(tokens.size, np.int32) if mask is None else
                                np.asarray(mask, np.int32).reshape(-1)[:tokens.size])
        return out

    def convert(self, row, example, packed):
        targets = row["targets"].astype(np.int32)
        segments = row["targets_segment_ids"] if packed else None
        positions = row["targets_positions"] if packed else np.arange(targets.size)
        nonpad = row["targets_segment_ids"] > 0
        out = {"decoder_target_tokens": targets,
               "decoder_input_tokens": shift_right_per_segment(targets, segments,
                                                               self.start_id),
               "decoder_loss_weights": nonpad.astype(np.float32)}
        if "loss_mask" in row:
            out["decoder_loss_weights"] *= row["loss_mask"].astype(np.float32)
        if self.prefix_lm:
            width = row["inputs_width"]
            if self.bidirectional_prefix:
                out["decoder_causal_attention"] = ((positions < width + 1) & nonpad).astype(
                    np.int32)
            if self.loss_on_targets_only:
                out["decoder_loss_weights"] *= (positions >= width).astype(np.float32)
        if packed:
            out["decoder_segment_ids"] = segments
            out["decoder_positions"] = row["targets_positions"]
        return out

    def model_feature_lengths(self, lengths):
        length = self.task_lengths(lengths)["targets"]
        names = ["decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"]
        names += ["decoder_causal_attention"] if self.prefix_lm and self.bidirectional_prefix else []
        names += ["decoder_segment_ids", "decoder_positions"] if self.pack else []
        return {n: length for n in names}

