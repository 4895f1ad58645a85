"""Losses: pure functions of a model's outputs (logits and the like), targets and
weights; the structure calls the model (``Structure.apply_model``) and passes its
outputs here, so nothing in this package knows a family's signature or how batches
are built. One module per family of losses:

- ``token``: cross entropy with z-loss and label smoothing (seq2seq and causal LM);
- ``masked_lm``: BERT's masked LM with next-sentence and span-boundary terms;
- ``electra``: ELECTRA's generator MLM + replaced-token detection;
- ``bilm``: ELMo's forward and backward LM cross-entropies;
- ``distillation``: soft targets at a temperature and hidden-state cosine;
- ``heads``: the fine-tuning heads (classification, regression, tagging, spans);
- ``router``: a mixture of experts' load-balancing and router z-losses.
"""

from t5x_like.objectives.bilm import bilm_objective
from t5x_like.objectives.distillation import cosine_loss, soft_target_loss
from t5x_like.objectives.electra import electra_objective
from t5x_like.objectives.heads import (
    classification_loss,
    regression_loss,
    span_extraction_loss,
    token_classification_loss,
)
from t5x_like.objectives.masked_lm import masked_lm_objective
from t5x_like.objectives.router import COLLECTION as ROUTER_COLLECTION
from t5x_like.objectives.router import router_terms
from t5x_like.objectives.token import (
    chunked_token_objective,
    cross_entropy_with_z_loss,
    row_mean_objective,
    token_objective,
)

__all__ = ["ROUTER_COLLECTION", "bilm_objective", "chunked_token_objective",
           "classification_loss", "cosine_loss", "cross_entropy_with_z_loss",
           "electra_objective", "masked_lm_objective",
           "regression_loss", "router_terms", "row_mean_objective",
           "soft_target_loss", "span_extraction_loss", "token_classification_loss",
           "token_objective"]
