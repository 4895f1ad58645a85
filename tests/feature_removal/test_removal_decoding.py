"""Removals of what decoding, scoring and post-training rely on: the cross-attention
cache, beam search, causal scoring of causal models, LoRA's merge, distillation's soft
targets and the router's load-balancing loss."""

import numpy as np
from removals import Removal, existing, proving_tests
from test_hf_tokenizers import gpt2  # noqa: F401  (the fixture the scoring check reads)

from t5x_like import objectives
from t5x_like.models import decoding, layers, moe, peft_modules
from t5x_like.objectives import distillation
from t5x_like.structures.decoder import DecoderStructure


def _cross_keys_recomputed(monkeypatch):
    """Decoding steps project the encoder output into keys and values again, every step."""
    original = layers.MultiHeadAttention._keys_and_values

    def recompute(self, inputs_kv, cross_cache, *args):
        return original(self, inputs_kv, "" if cross_cache == "read" else cross_cache, *args)
    monkeypatch.setattr(layers.MultiHeadAttention, "_keys_and_values", recompute)


def _beam_of_one(monkeypatch):
    """Beam search keeps one hypothesis (greedy), returned as every beam."""
    original = decoding.beam_search

    def greedy(step_fn, cache, *, num_beams, **kwargs):
        import jax.numpy as jnp
        seqs, scores = original(step_fn, cache, num_beams=1, **kwargs)
        return jnp.repeat(seqs, num_beams, axis=1), jnp.repeat(scores, num_beams, axis=1)
    monkeypatch.setattr(decoding, "beam_search", greedy)


def _prompts_read_both_ways(monkeypatch):
    """Every decoder checkpoint is scored with a bidirectional prompt."""
    def as_trained(cls, spec, saved, imported):
        return spec.replace(data=spec.data.replace(prefix_attention="bidirectional"))
    monkeypatch.setattr(DecoderStructure, "evaluate_as_trained", classmethod(as_trained))


def _lora_dropped_not_merged(monkeypatch):
    def merge_lora(params, settings):
        def drop(node):
            if not isinstance(node, dict):
                return np.asarray(node)
            return {k: drop(v) for k, v in node.items() if k not in ("lora_a", "lora_b")}
        return drop(peft_modules.plain_dicts(params))
    monkeypatch.setattr(peft_modules, "merge_lora", merge_lora)


def _soft_targets_at_temperature_1(monkeypatch):
    """What ``distill`` calls (``objectives.soft_target_loss``) ignores the temperature."""
    original = distillation.soft_target_loss
    monkeypatch.setattr(objectives, "soft_target_loss",
                        lambda student, teacher, temperature: original(student, teacher, 1.0))


def _no_load_balancing_loss(monkeypatch):
    import jax.numpy as jnp
    monkeypatch.setattr(moe, "load_balancing_loss", lambda p, e, n: jnp.zeros((), jnp.float32))


CROSS = existing("test_decoding.py::test_decode_steps_project_the_encoder_output_once", scan=False)
BEAM = existing("test_beam_search.py::test_beam_beats_greedy_when_the_likely_first_token_is_a_trap")
CAUSAL = existing(
    "test_hf_tokenizers.py::test_rank_scores_of_an_imported_gpt2_are_its_causal_log_likelihoods")
MERGE = existing("test_peft.py::test_merged_lora_gives_the_unmerged_logits", scan=False)
SOFT = existing("test_distill.py::test_the_soft_target_gradient_is_t_times_the_softmax_difference")
BALANCE = existing("test_moe.py::test_load_balancing_and_z_losses_equal_their_formulas")

REMOVALS = [
    Removal("cross-attention cache", "decoding steps project the encoder output again",
            "a cached step's XLA FLOPs are one K/V projection per layer below a recomputing "
            "one's", _cross_keys_recomputed, CROSS[1], holds_in=CROSS[0]),
    Removal("beam search", "beam search keeps one hypothesis", "a beam of 2 avoids the likely "
            "first token that leads nowhere, which greedy takes", _beam_of_one, BEAM[1],
            holds_in=BEAM[0]),
    Removal("causal scoring", "decoder checkpoints are scored with a bidirectional prompt",
            "an imported GPT-2's option scores equal transformers' causal log-likelihoods",
            _prompts_read_both_ways, CAUSAL[1], holds_in=CAUSAL[0]),
    Removal("LoRA merge", "`merge_lora` drops the factors instead of folding them",
            "the merged model's logits equal the LoRA model's", _lora_dropped_not_merged,
            MERGE[1], holds_in=MERGE[0]),
    Removal("distillation soft targets", "the soft-target loss at temperature 1",
            "its gradient is T (softmax(s/T) - softmax(t/T))", _soft_targets_at_temperature_1,
            SOFT[1], holds_in=SOFT[0]),
    Removal("router load-balancing loss", "`load_balancing_loss` is 0",
            "it equals E sum_e f_e P_e written out", _no_load_balancing_loss, BALANCE[1],
            holds_in=BALANCE[0]),
]

globals().update(proving_tests(REMOVALS))
