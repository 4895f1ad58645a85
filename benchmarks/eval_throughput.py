"""Evaluation throughput: examples/s of score and predict mode, t5x_like (JAX) versus
transformers (PyTorch) on the same shapes, in one run.

    .venv/bin/python benchmarks/eval_throughput.py [--batch 8] [--repeats 3] [--rows t5,gpt2]
        [--smoke]

Rows: T5 v1.1-small (``configs/t5_1_1_small.py``; inputs 128, targets 32) and GPT-2
small (``configs/gpt2_small.py``; a 128-token prompt, 32 target tokens), random
weights, identical random token batches on both sides.

- score: the per-example summed log-likelihood of the 32 target tokens
  (``Structure.score_batch``, what rank classification and lm-eval mode run) against
  a transformers forward pass plus ``log_softmax`` and a gather;
- predict: 32 greedy tokens per example (``Structure.predict_batch`` through
  ``decoding.py`` with its KV cache) against ``generate(max_new_tokens=32,
  min_new_tokens=32)`` with transformers' cache. Random weights rarely emit EOS, and
  transformers is held to 32 tokens, so both sides decode the same number of steps.

Times are the fastest of ``--repeats`` calls after one warm-up (compilation for JAX),
which keeps other load on the machine out of the comparison. Needs the ``dev``
extra (torch, transformers). On a GPU both sides run there in float32. ``--smoke``: both
rows with 1-layer, 32-wide models of the same configs, batch 2, 8-token prompts and 4
targets, one timed call (a check that the script runs).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from t5x_like import config_lib, structures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = {"t5": "t5_1_1_small", "gpt2": "gpt2_small"}
PROMPT, TARGET = 128, 32
SMOKE_PROMPT, SMOKE_TARGET = 8, 4


def load_config(row: str, smoke: bool = False):
    config = config_lib.load_config_file(os.path.join(REPO, "configs", f"{ROWS[row]}.py"))
    if smoke:  # 1 layer, 32 wide, a 512-token vocabulary
        import _smoke
        _smoke.tiny_model(config.model, vocab_size=512)
    return config


def make_batch(row: str, batch: int, vocab: int, prompt: int = PROMPT,
               target: int = TARGET) -> dict:
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(5, vocab, size=(batch, n)).astype(np.int32)  # noqa: E731
    targets = ids(target)
    if row == "t5":
        return {"encoder_input_tokens": ids(prompt),
                "decoder_input_tokens": np.concatenate(
                    [np.zeros((batch, 1), np.int32), targets[:, :-1]], axis=1),
                "decoder_target_tokens": targets,
                "decoder_loss_weights": np.ones(targets.shape, np.float32)}
    tokens = np.concatenate([ids(prompt), targets], axis=1)
    weights = np.zeros(tokens.shape, np.float32)
    weights[:, prompt:] = 1.0
    return {"decoder_input_tokens": np.concatenate(
                [np.zeros((batch, 1), np.int32), tokens[:, :-1]], axis=1),
            "decoder_target_tokens": tokens, "decoder_loss_weights": weights}


def prompt_batch(row: str, batch: dict, prompt: int = PROMPT) -> dict:
    """What predict mode gets: the prompt, and for a decoder one target position."""
    if row == "t5":
        return batch
    out = {k: v[:, :prompt + 1] for k, v in batch.items()}
    out["decoder_loss_weights"] = out["decoder_loss_weights"].copy()
    out["decoder_loss_weights"][:, prompt] = 1.0
    return out


def fastest(fn, repeats: int) -> float:
    fn()  # warm-up (and compilation)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def ours(row: str, batch: dict, repeats: int, prompt: int = PROMPT, target: int = TARGET,
         smoke: bool = False) -> tuple[float, float]:
    """(seconds per score batch, seconds per predict batch)."""
    config = load_config(row, smoke)
    structure = structures.for_config(config)
    from t5x_like import models
    lengths = {k: v.shape[1] for k, v in batch.items() if k.endswith("_tokens")}
    params = jax.jit(lambda: structure.model.init(
        jax.random.key(0), *models.example_inputs(structure.model, lengths))["params"])()
    import flax.linen as nn
    params = nn.unbox(params)
    score = jax.jit(structure.score_batch)
    predict = jax.jit(lambda p, b: structure.predict_batch(p, b, max_decode_length=target))
    device_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    prompts = {k: jnp.asarray(v) for k, v in prompt_batch(row, batch, prompt).items()}
    score_time = fastest(lambda: jax.block_until_ready(score(params, device_batch)), repeats)
    predict_time = fastest(lambda: jax.block_until_ready(predict(params, prompts)), repeats)
    return score_time, predict_time


def theirs(row: str, batch: dict, repeats: int, device: str, prompt: int = PROMPT,
           target: int = TARGET, smoke: bool = False) -> tuple[float, float]:
    import torch
    import transformers

    torch.manual_seed(0)
    model_config = load_config(row, smoke).model
    if row == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=model_config.vocab_size, d_model=model_config.d_model,
            d_kv=model_config.head_dim, d_ff=model_config.d_ff,
            num_layers=model_config.num_encoder_layers, num_heads=model_config.num_heads,
            feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=model_config.vocab_size, n_embd=model_config.d_model,
            n_head=model_config.num_heads, n_layer=model_config.num_layers,
            n_inner=model_config.d_ff, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model.to(device).eval()
    tensor = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    @torch.no_grad()
    def score():
        if row == "t5":
            logits = model(input_ids=tensor(batch["encoder_input_tokens"]),
                           decoder_input_ids=tensor(batch["decoder_input_tokens"])).logits
            targets = tensor(batch["decoder_target_tokens"])
        else:
            tokens = tensor(batch["decoder_target_tokens"])
            logits = model(input_ids=tokens).logits[:, prompt - 1:-1]
            targets = tokens[:, prompt:]
        logp = torch.log_softmax(logits.float(), dim=-1)
        out = logp.gather(-1, targets[..., None])[..., 0].sum(-1)
        sync()
        return out

    @torch.no_grad()
    def predict():
        if row == "t5":
            inputs = tensor(batch["encoder_input_tokens"])
        else:
            inputs = tensor(batch["decoder_target_tokens"][:, :prompt])
        out = model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                             max_new_tokens=target, min_new_tokens=target, do_sample=False,
                             num_beams=1, use_cache=True, pad_token_id=0)
        sync()
        return out

    return fastest(score, repeats), fastest(predict, repeats)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default="t5,gpt2")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models and sizes: a check that both rows run")
    args = parser.parse_args(argv)
    prompt, target = (SMOKE_PROMPT, SMOKE_TARGET) if args.smoke else (PROMPT, TARGET)
    if args.smoke:
        args.batch, args.repeats = 2, 1
    import torch
    on_gpu = jax.default_backend() == "gpu"
    device = "cuda" if on_gpu else "cpu"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both sides
        jax.config.update("jax_default_matmul_precision", "highest")
    else:
        torch.set_num_threads(os.cpu_count() or 1)
    print(f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores; batch {args.batch}, "
          f"prompt/inputs {prompt}, targets {target}; examples/s (higher is better)\n")
    header = (f"{'model':<16} {'mode':<8} {'t5x_like ex/s':>14} {'transformers ex/s':>18} "
              f"{'ratio':>6}")
    print(header)
    print("-" * len(header))
    for row in args.rows.split(","):
        vocab = load_config(row, args.smoke).model.vocab_size
        batch = make_batch(row, args.batch, vocab, prompt, target)
        our_score, our_predict = ours(row, batch, args.repeats, prompt, target, args.smoke)
        their_score, their_predict = theirs(row, batch, args.repeats, device, prompt, target,
                                            args.smoke)
        for mode, a, b in (("score", our_score, their_score),
                           ("predict", our_predict, their_predict)):
            print(f"{ROWS[row]:<16} {mode:<8} {args.batch / a:>14,.1f} {args.batch / b:>18,.1f} "
                  f"{b / a:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
