"""Losses: ``(model, params, batch, rng) -> (loss, metrics)``; nothing about how batches
are built. One module per family of losses:

- ``token``: cross entropy with z-loss and label smoothing; seq2seq and causal LM;
- ``masked_lm``: BERT's masked LM with next-sentence and span-boundary terms;
- ``electra``: ELECTRA's generator MLM + replaced-token detection;
- ``bilm``: ELMo's forward and backward LM cross-entropies;
- ``distillation``: soft targets at a temperature and hidden-state cosine;
- ``heads``: the fine-tuning heads (classification, regression, tagging, spans).
"""

from t5x_like.objectives.bilm import bilm_loss
from t5x_like.objectives.distillation import cosine_loss, soft_target_loss
from t5x_like.objectives.electra import electra_loss
from t5x_like.objectives.heads import (
                                       classification_loss,
                                       regression_loss,
                                       span_extraction_loss,
                                       token_classification_loss,
)
from t5x_like.objectives.masked_lm import masked_lm_loss
from t5x_like.objectives.token import (
                                       causal_lm_loss,
                                       cross_entropy_with_z_loss,
                                       dropout_rngs,
                                       row_mean_objective,
                                       seq2seq_loss,
                                       token_objective,
)

__all__ = ["bilm_loss", "causal_lm_loss", "classification_loss", "cosine_loss", "cross_entropy_with_z_loss",
           "dropout_rngs", "electra_loss", "masked_lm_loss", "regression_loss",
           "row_mean_objective",
           "seq2seq_loss", "soft_target_loss", "span_extraction_loss",
           "token_classification_loss", "token_objective"]
