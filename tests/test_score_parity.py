"""score_batch of converted GPT-2 and T5 equals transformers' log-likelihoods (random init)."""

import ml_collections
import numpy as np
import torch
from hf_helpers import padded_batch, tiny_hf_gpt2, tiny_hf_t5

from t5x_like import config_lib, structures
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import load_pretrained
from t5x_like.evaluation import few_shot


def structure_for(folder):
    model_config, params = load_pretrained(folder)
    config = config_lib.default_config()
    config.model = config_lib.model_defaults(model_config["family"])
    config.model.update(model_config)
    return structures.for_config(ml_collections.ConfigDict(config)), params


def hf_target_log_likelihood(logits, targets, weights):
    log_probs = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), dim=-1)
    token = torch.gather(log_probs, -1, torch.as_tensor(targets)[..., None])[..., 0]
    return (token * torch.as_tensor(weights, dtype=torch.float64)).sum(-1).numpy()


def test_t5_scores_equal_transformers(tmp_path):
    hf_model = tiny_hf_t5("v1_1")
    hf_model.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    structure, params = structure_for(tmp_path / "ours")
    encoder, decoder_inputs, targets = padded_batch()
    weights = (targets != 0).astype(np.float32)
    ours = np.asarray(structure.score_batch(params, {
        "encoder_input_tokens": encoder, "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets, "decoder_loss_weights": weights}))
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor(encoder),
                          attention_mask=torch.tensor(encoder != 0),
                          decoder_input_ids=torch.tensor(decoder_inputs)).logits.numpy()
    theirs = hf_target_log_likelihood(logits, targets, weights)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)


def test_gpt2_lm_eval_scores_equal_transformers(tmp_path):
    """The harness's request rows: context then continuation, weights on the continuation."""
    hf_model = tiny_hf_gpt2()
    hf_model.save_pretrained(tmp_path / "hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 'hf'}",
                             f"--out={tmp_path / 'ours'}"]) == 0
    structure, params = structure_for(tmp_path / "ours")
    rng = np.random.default_rng(0)
    requests = [(rng.integers(1, 99, n).tolist(), rng.integers(1, 99, m).tolist())
                for n, m in [(7, 3), (12, 1), (4, 6)]]
    width = 20
    rows = [few_shot.request_row(c, k, width) for c, k in requests]
    batch = {key: np.stack([r[key] for r in rows]) for key in rows[0]}
    ours = np.asarray(structure.score_batch(params, batch))
    theirs = []
    for context, continuation in requests:
        tokens = torch.tensor([context + continuation])
        with torch.no_grad():
            log_probs = torch.log_softmax(hf_model(input_ids=tokens).logits.double(), -1)[0]
        n = len(continuation)
        positions = range(len(context) - 1, len(context) - 1 + n)
        theirs.append(sum(float(log_probs[p, t]) for p, t in zip(positions, continuation, strict=False)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
