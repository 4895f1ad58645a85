"""ELECTRA: masked-LM batches, replaced-token detection on top."""

from __future__ import annotations

import jax
import numpy as np

from t5x_like import objectives
from t5x_like.structures import mode_structures
from t5x_like.structures.base import dropout_rngs
from t5x_like.structures.encoder import EncoderStructure, _encoder_flops


class ElectraStructure(EncoderStructure):
    """ELECTRA: masked-LM batches (as BERT's); the objective adds replaced-token
    detection (``objectives.electra_objective``). Scoring uses the generator's masked-LM
    head; fine-tuning heads read the discriminator."""

    distillable = False
    embeds_text = False  # its towers share embeddings; a retriever takes a plain encoder
    depth_keys = ()  # two towers, the generator a fraction of the discriminator

    @classmethod
    def parameter_split(cls, shapes) -> str:
        """ELECTRA's towers counted as the paper and Hugging Face count them: the
        discriminator with the shared embeddings (what fine-tunes), the generator's own."""
        def count(tree) -> int:
            return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(tree))
        discriminator = count(shapes["discriminator"]) + count(shapes["embeddings"])
        return (f"discriminator: {discriminator} (with the shared embeddings)  "
                f"generator: {count(shapes.get('generator', {}))} (its own tower and head)")

    @classmethod
    def body_params_for_head(cls, flat_params):
        """The discriminator fine-tunes (Clark et al.): the generator stays behind."""
        return {key: value for key, value in flat_params.items()
                if key[:2] != ("backbone", "generator")}

    @classmethod
    def hidden_stack(cls, config):
        with_head = mode_structures.wrapping(config) is not None  # a fine-tuning head
        return (None if with_head else "discriminate"), "discriminator (ELECTRA)"

    def apply_model(self, model, params, batch, rng=None, deterministic=True):
        """Both towers: the generator's ``mlm_logits``, the ``corrupted_tokens`` sampled
        from it, the discriminator's ``rtd_logits``. Training samples from the step's
        rng; evaluation (no rng) from a fixed key, so it is repeatable."""
        dropout_rng, sample_rng = (jax.random.split(rng) if rng is not None
                                   else (None, jax.random.key(0)))
        rngs = dict(dropout_rngs(dropout_rng, deterministic) or {}, sample=sample_rng)
        return model.apply({"params": params}, batch["encoder_input_tokens"],
                           token_type_ids=batch.get("encoder_token_type_ids"),
                           segment_ids=batch.get("encoder_segment_ids"),
                           positions=batch.get("encoder_positions"),
                           masked_positions=batch["encoder_loss_weights"] > 0,
                           deterministic=deterministic, rngs=rngs)

    def loss_fn(self, loss_config):
        label_smoothing = float(loss_config.label_smoothing)

        def loss_fn(model, params, batch, rng, normalizer=None, num_sequences=None):
            out = self.apply_model(model, params, batch, rng, deterministic=rng is None)
            return objectives.electra_objective(
                out, batch, pad_id=model.config.pad_id,
                discriminator_loss_weight=float(model.config.discriminator_loss_weight),
                label_smoothing=label_smoothing, normalizer=normalizer,
                num_sequences=num_sequences)
        return loss_fn

    def logits(self, params, batch):
        return self.model.apply(
            {"params": params}, batch["encoder_input_tokens"],
            token_type_ids=batch.get("encoder_token_type_ids"),
            segment_ids=batch.get("encoder_segment_ids"),
            positions=batch.get("encoder_positions"))["mlm_logits"]

    def forward_flops_per_sequence(self, model, lengths):
        """Both towers over every token: the generator with its vocabulary projection,
        the discriminator with its one-logit head."""
        s, e, generator = lengths["inputs"], model.embedding_width, model.generator
        flops = _encoder_flops(model, s, 0 if e == model.d_model else e, "replaced_token")
        if generator.d_model:
            flops += _encoder_flops(model, s, 0 if e == generator.d_model else e,
                                    dims=generator)
        return flops
