"""Train-step throughput: t5x_like (JAX) versus transformers (PyTorch), same shapes, same run.

    .venv/bin/python benchmarks/model_step.py [--steps 3] [--rows bert,t5,gpt2] [--smoke]

For each model a full train step (forward, backward, AdamW update) runs on
identical random batches in both frameworks. Printed per row: tokens/s for both,
the ratio, and t5x_like's FLOPs utilisation: the step's FLOPs as counted by XLA
for the compiled step, over the f32 matmul rate measured on this machine at the
start of the run. Step times are the fastest of ``--steps`` timed steps in each
framework (after one warm-up), which keeps other load on the machine out of the
comparison. Needs the ``hf`` extra (torch, transformers).

On a GPU (JAX's default backend) PyTorch runs on CUDA too, both sides with TF32
matmuls for float32 (JAX's default precision there; PyTorch is set to match);
``--batch_multiplier`` scales the batches up to GPU-sized ones and
``--dtype bfloat16`` computes in bfloat16 (PyTorch under autocast). ``--smoke``: the rows of
``SMOKE_ROWS`` (BERT and T5) with 1-layer, 32-wide models of the same configs on both
sides, batch 2 of 16 tokens, one timed step (a check that the script runs); the GPT-2
row's batch, models and step run in ``gpu/gpu_bench.py``'s smoke run, through this
script's functions, and each row here is seconds more compile.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5x_like import config_lib, structures
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib

ROWS = {
    # name: (config file, batch size, lengths)
    "bert": ("bert_base", 8, {"inputs": 128}),
    "t5": ("t5_1_1_small", 4, {"inputs": 512, "targets": 114}),
    "gpt2": ("gpt2_small", 4, {"targets": 256}),
}
SMOKE_LENGTHS = {"bert": {"inputs": 16}, "t5": {"inputs": 16, "targets": 8},
                 "gpt2": {"targets": 16}}
SMOKE_ROWS = ("bert", "t5")  # --smoke's rows (see the docstring)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(row: str, smoke: bool = False):
    """The row's config; ``smoke``: its model at 1 layer, 32 wide, a 512-token vocabulary."""
    config = config_lib.load_config_file(os.path.join(REPO, "configs", f"{ROWS[row][0]}.py"))
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model, vocab_size=512)
    return config


def matmul_flops_per_second(size: int = 2048, repeats: int = 5, dtype=jnp.float32) -> float:
    a = jnp.ones((size, size), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def make_batch(row: str, batch: int, lengths: dict, vocab: int) -> dict:
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(5, vocab, size=(batch, n)).astype(np.int32)  # noqa: E731
    if row == "bert":
        tokens = ids(lengths["inputs"])
        return {"encoder_input_tokens": tokens, "encoder_target_tokens": tokens,
                "encoder_token_type_ids": np.zeros_like(tokens),
                "encoder_loss_weights": (rng.random(tokens.shape) < 0.15).astype(np.float32),
                "next_sentence_labels": rng.integers(0, 2, size=(batch,)).astype(np.int32)}
    if row == "t5":
        targets = ids(lengths["targets"])
        return {"encoder_input_tokens": ids(lengths["inputs"]),
                "decoder_input_tokens": np.concatenate([np.zeros((batch, 1), np.int32),
                                                        targets[:, :-1]], axis=1),
                "decoder_target_tokens": targets,
                "decoder_loss_weights": np.ones(targets.shape, np.float32)}
    tokens = ids(lengths["targets"] + 1)
    return {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
            "decoder_loss_weights": np.ones((batch, lengths["targets"]), np.float32)}


def t5x_like_step(row: str, batch: dict, steps: int, dtype: str,
                  smoke: bool = False) -> tuple[float, float]:
    """(seconds per step, XLA FLOPs per step)."""
    config = load_config(row, smoke)
    config.model.numerics.dtype = dtype
    model = structures.build_model(config.model)
    config.loss.z_loss = 0.0  # as the PyTorch side computes it
    loss_fn = structures.structure_class(config.model.family)(model).loss_fn(config.loss)
    schedule = optax.constant_schedule(1e-4)
    mesh = partitioning.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    lengths = {k: v.shape[1] for k, v in batch.items() if v.ndim == 2}
    trainer = trainer_lib.Trainer(model, loss_fn, optax.adamw(schedule), schedule, mesh,
                                  partitioning.axis_rules("fsdp"), lengths)
    state = trainer.init_state(0)
    device_batch = partitioning.global_batch(batch, mesh)
    compiled = trainer.lower_train_step(state, device_batch).compile()
    cost = compiled.cost_analysis()
    flops = float((cost[0] if isinstance(cost, list) else cost).get("flops", 0.0))
    state, metrics = trainer.train_step(state, device_batch)  # warm-up
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, device_batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return min(times), flops


def torch_model_and_inputs(row: str, batch: dict, device: str, smoke: bool = False):
    """The transformers model of ``row`` (seeded, dropout off) and ``batch`` as its
    inputs on ``device``: what the PyTorch side of every train-step table runs."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = load_config(row, smoke).model
    if row == "bert":
        model = transformers.BertForPreTraining(transformers.BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.d_model,
            num_attention_heads=config.num_heads, num_hidden_layers=config.num_layers,
            intermediate_size=config.d_ff, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0))
        labels = np.where(batch["encoder_loss_weights"] > 0, batch["encoder_target_tokens"], -100)
        inputs = dict(input_ids=batch["encoder_input_tokens"], labels=labels,
                      next_sentence_label=batch["next_sentence_labels"])
    elif row == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=config.vocab_size, d_model=config.d_model, d_kv=config.head_dim,
            d_ff=config.d_ff, num_layers=config.num_encoder_layers, num_heads=config.num_heads,
            feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0))
        inputs = dict(input_ids=batch["encoder_input_tokens"],
                      decoder_input_ids=batch["decoder_input_tokens"],
                      labels=batch["decoder_target_tokens"])
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=config.vocab_size, n_embd=config.d_model, n_head=config.num_heads,
            n_layer=config.num_layers, n_inner=config.d_ff, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
        tokens = np.concatenate([batch["decoder_input_tokens"],
                                 batch["decoder_target_tokens"][:, -1:]], axis=1)
        inputs = dict(input_ids=tokens, labels=tokens)  # shifted inside the model
    inputs = {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in inputs.items()}
    return model, inputs


def torch_step(row: str, batch: dict, steps: int, dtype: str, device: str,
               smoke: bool = False) -> float:
    import contextlib

    import torch

    model, inputs = torch_model_and_inputs(row, batch, device, smoke)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = (torch.autocast(device, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", default="bert,t5,gpt2")
    parser.add_argument("--batch_multiplier", type=int, default=1,
                        help="scale every row's batch (GPU-sized batches)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="compute dtype; parameters stay float32")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models and batches: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps = 1
        if args.rows == ",".join(ROWS):
            args.rows = ",".join(SMOKE_ROWS)
    import torch
    on_gpu = jax.default_backend() == "gpu"
    device = "cuda" if on_gpu else "cpu"
    if on_gpu:
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default precision on GPU
    else:
        torch.set_num_threads(os.cpu_count() or 1)
    peak = matmul_flops_per_second(256 if args.smoke else 8192 if on_gpu else 2048,
                                   dtype=jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32)
    print(f"{args.dtype} matmul rate measured here: {peak / 1e9:,.1f} GFLOP/s "
          f"({jax.devices()[0].device_kind}, {os.cpu_count()} cores, torch "
          f"{'on ' + torch.cuda.get_device_name() if on_gpu else f'threads {torch.get_num_threads()}'})\n")
    header = (f"{'model':<42} {'batch':>5} {'tokens/step':>11} {'t5x_like tok/s':>15} "
              f"{'PyTorch tok/s':>14} {'ratio':>6} {'XLA GFLOP/step':>15} {'util':>6}")
    print(header)
    print("-" * len(header))
    for row in args.rows.split(","):
        config_name, batch_size, lengths = ROWS[row]
        batch_size *= args.batch_multiplier
        if args.smoke:
            batch_size, lengths = 2, SMOKE_LENGTHS[row]
        vocab = load_config(row, args.smoke).model.vocab_size
        batch = make_batch(row, batch_size, lengths, vocab)
        tokens = batch_size * sum(lengths.values())
        ours, flops = t5x_like_step(row, batch, args.steps, args.dtype, args.smoke)
        theirs = torch_step(row, batch, args.steps, args.dtype, device, args.smoke)
        shape = " / ".join(f"{k} {v}" for k, v in lengths.items())
        print(f"{config_name + ' (' + shape + ')':<42} {batch_size:>5} {tokens:>11} "
              f"{tokens / ours:>15,.0f} {tokens / theirs:>14,.0f} {theirs / ours:>6.2f} "
              f"{flops / 1e9:>15,.0f} {flops / ours / peak:>6.1%}", flush=True)


if __name__ == "__main__":
    main()
