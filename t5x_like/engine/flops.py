"""Model FLOPs for MFU: what one training step must compute, from the config alone.

Counted as in the PaLM paper (appendix B): 2 FLOPs per multiply-add of every
matmul, training = 3 x forward (the backward pass costs two forward passes), and
attention's score and value matmuls counted in full (no causal halving):

    per layer and sequence, attention scores + values = 2 * 2 * S_q * S_k * H * Dh

with ``H`` heads of size ``Dh`` and ``G = len(mlp_activations)`` input projections
in the MLP (2 for gated GeLU). Per sequence, forward:

- decoder (GPT):   2*S*L*(4*d*H*Dh + (G+1)*d*F) + 4*L*S^2*H*Dh + 2*S*d*V
                   (grouped-query: 2*d*(H + K)*Dh instead of 4*d*H*Dh, K key/value heads)
- encoder (BERT):  the same, plus the MLM transform 2*S*d*d (logits at every position);
                   ALBERT (embeddings of width E): 2*S*E*d up-projection, 2*S*d*E
                   transform and 2*S*E*V logits
- ELECTRA:         the generator as an encoder of its own width (with its logits), plus
                   the discriminator as an encoder whose head is 2*S*d*d + 2*S*d (one
                   logit per token, no vocabulary projection)
- encoder-decoder (T5, BART), inputs S_i, targets S_t:
      encoder  2*S_i*Le*(4*d*H*Dh + (G+1)*d*F) + 4*Le*S_i^2*H*Dh
      decoder  2*S_t*Ld*(6*d*H*Dh + (G+1)*d*F) + 2*S_i*Ld*2*d*H*Dh   (cross-attn keys/values)
               + 4*Ld*(S_t^2 + S_t*S_i)*H*Dh + 2*S_t*d*V

A mixture of experts counts active FLOPs, what each token runs through: in each sparse
layer ``(G+1)*d*F`` becomes ``k*(G+1)*d*F_e + d*E`` (its ``k`` experts of width
``F_e`` and the router over ``E`` experts) plus ``(G+1)*d*F_s`` for a shared expert of
width ``F_s`` (and ``d`` for its gate). Capacity dispatch also multiplies empty slots;
they are hardware FLOPs, not model FLOPs.

Embedding lookups, norms, softmaxes and the optimizer are left out (small, and
not what MFU measures). Model FLOPs do not change with rematerialisation.
"""

from __future__ import annotations

from collections.abc import Mapping

from t5x_like import structures
from t5x_like.config import model_spec_of


def forward_flops_per_sequence(model, lengths: Mapping[str, int]) -> float:
    """Forward FLOPs of one sequence (example) for ``model`` (a model spec, or a model
    section in either layout) at the task feature ``lengths`` (``inputs``/``targets``);
    each family's structure counts its own, with the formulas above (the family
    registry names the known families for an unknown one)."""
    spec = model_spec_of(model)
    return structures.structure_class(spec.family)(None).forward_flops_per_sequence(spec,
                                                                                    lengths)


def train_flops_per_step(model, lengths: Mapping[str, int], batch_size: int) -> float:
    """Model FLOPs of one training step over the global batch (3 x forward)."""
    return 3.0 * forward_flops_per_sequence(model, lengths) * batch_size


def mfu(flops_per_step: float, steps_per_sec: float, num_devices: int,
        peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak."""
    return flops_per_step * steps_per_sec / (num_devices * peak_flops_per_device)
