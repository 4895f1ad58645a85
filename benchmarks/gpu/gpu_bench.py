"""One-call GPU benchmark: train-step throughput and MFU (t5x_like vs PyTorch) and greedy /
beam decode speed (t5x_like ``infer`` decoding vs transformers ``generate``).

Meant to be run once on a lent GPU machine (see docs/benchmarks.md), e.g. from the
repository root:

    PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 \\
        python3 benchmarks/gpu/gpu_bench.py --out $OUT/results.json --budget_s 280

and on a CPU, as a quick check that everything runs (tiny sizes, a few seconds a stage):

    .venv/bin/python benchmarks/gpu/gpu_bench.py --smoke --out /tmp/gpu_bench.json

``--smoke`` runs every stage with the 1-layer, 32-wide models of ``model_step.py`` and
``decode_speed.py``'s own smoke modes (batch 2, 4 new tokens, one timed step), the
``compile`` stage under ``torch.compile(backend="eager")`` (Dynamo's tracing without
Inductor's code generation, which takes minutes on a CPU; the table says so), and exits 1
if any row failed (a real run records a failed row and goes on). Its rows are
``SMOKE_ROWS``: the train stage on GPT-2 only, and the decode stage on T5 with beams (the
``decode_extra`` pass decodes GPT-2 greedily: each family and each search once); the rows
a stage leaves out run the same stage code with other models of ``model_step.py`` and
``decode_speed.py``, whose own smoke runs cover the other train rows (BERT, T5) and the
other two decode rows (GPT-2 with beams, T5 greedy).

``--src DIR`` imports ``t5x_like``, ``configs/`` and ``benchmarks/{model_step,decode_speed}.py``
from DIR instead of this checkout (a frozen copy of the package can travel to the device
machine while the tree is being edited). The stages reuse those two scripts' code:

1. ``train``: for each of GPT-2 small (targets 256), BERT-base (inputs 128) and T5 v1.1
   small (inputs 512 / targets 114), the batch of ``model_step.py`` times
   ``--batch_multiplier``: a full train step (forward, backward, AdamW) of t5x_like's
   ``Trainer`` (jitted) and of the same transformers model in PyTorch eager (AdamW,
   ``torch.autocast`` for bfloat16), same shapes and random batch. Each side: one warm-up
   step, then ``--steps`` timed steps, each synchronised; median and best are kept.
   MFU = ``t5x_like.engine.flops.train_flops_per_step`` (PaLM-style model FLOPs from the config,
   the same count for both sides) / step time / ``t5x_like.system.hardware.peak_flops`` (dense
   bf16 datasheet peak, 989 TFLOP/s for an H100 SXM); the table also gives the ratio to
   a bf16 matmul measured here on random data.
2. ``decode``: ``decode_speed.py``'s rows (its exporters, so both sides hold the same
   weights; EOS off, exactly ``--new_tokens`` new tokens), each side best of
   ``--repeats`` after a warm-up; tokens/s and the share of token-identical sequences.
3. ``compile``: the PyTorch train step again under ``torch.compile`` with fused AdamW,
   for the rows in ``--compile_rows``.
4. ``decode_extra``: a second decode pass (``--decode_extra DTYPE:BATCH:ROWS``, by default
   bfloat16 at batch 64, greedy).

Decode and compile rows are skipped once ``--budget_s`` seconds of wall time have passed
(the numbers so far are already in ``--out``, rewritten after every row).

Runs recorded in ``benchmarks/gpu/results/`` (2026-11-25, snapshot of the tree at a0076bb
plus uncommitted edits; the device tool gave an NVIDIA H200, not an H100; jax 0.11.2 +
CUDA 13 plugin, flax 0.12.10, optax 0.2.8, torch 2.11.0, transformers 5.17.0 there, not
this checkout's jax 0.10.2 / flax 0.12.8 / torch 2.13 / transformers 5.23), made through the
device tool with carry [".whl"]:

    bash benchmarks/gpu/run_device.sh --budget_s 250                      # h200_run1_*
    GPU_BENCH_TIMEOUT=360 bash benchmarks/gpu/run_device.sh \
        --stages decode,compile,decode_extra --budget_s 270               # h200_run2_*

(``t5x_like.system.hardware`` lists 989 TFLOP/s dense bf16 for both the H100 SXM and the H200.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

T0 = time.perf_counter()
# --smoke: the train rows and the decode rows (see the docstring).
SMOKE_ROWS = {"train": "gpt2", "decode": "t5_beam"}
RESULTS: dict = {"env": {}, "matmul": {}, "train": [], "decode": [], "compile": [],
                 "errors": []}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def save(path: str) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


def setup_imports(src: str):
    sys.path.insert(0, os.path.join(src, "benchmarks"))
    sys.path.insert(0, src)
    import t5x_like
    if not os.path.abspath(t5x_like.__file__).startswith(os.path.abspath(src)):
        raise RuntimeError(f"t5x_like imported from {t5x_like.__file__}, not {src}")
    import decode_speed
    import model_step
    return model_step, decode_speed


def versions() -> dict:
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "orbax-checkpoint",
                 "ml_collections", "torch", "transformers", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def matmul_rates(on_gpu: bool, size: int) -> dict:
    """bf16 matmul FLOP/s on random data, JAX and torch (median of 10 after 3 warm-ups)."""
    import jax
    import jax.numpy as jnp
    import torch
    out = {}
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.bfloat16)
    f = jax.jit(lambda x, y: x @ y)
    times = []
    for i in range(13):
        start = time.perf_counter()
        f(a, b).block_until_ready()
        if i >= 3:
            times.append(time.perf_counter() - start)
    out["jax_bf16"] = 2 * size**3 / statistics.median(times)
    device = "cuda" if on_gpu else "cpu"
    x = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    y = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    times = []
    for i in range(13):
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        x @ y
        if on_gpu:
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    out["torch_bf16"] = 2 * size**3 / statistics.median(times)
    return out


def ours_train(ms, row: str, batch: dict, steps: int, dtype: str, smoke: bool = False) -> dict:
    """model_step.t5x_like_step, keeping every step time."""
    import jax
    import optax

    from t5x_like import structures
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    config = ms.load_config(row, smoke)
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
    start = time.perf_counter()
    compiled = trainer.lower_train_step(state, device_batch).compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    xla_flops = float((cost[0] if isinstance(cost, list) else cost).get("flops", 0.0))
    state, metrics = trainer.train_step(state, device_batch)  # warm-up (and jit cache fill)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, device_batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    loss = float(jax.device_get(metrics.get("loss", float("nan")))) if isinstance(
        metrics, dict) else float("nan")
    del state, device_batch
    return {"times": times, "xla_flops": xla_flops, "compile_s": compile_s, "loss": loss}


def torch_train(ms, row: str, batch: dict, steps: int, dtype: str, device: str,
                compile_: bool = False, smoke: bool = False) -> dict:
    """model_step.torch_step, keeping every step time; ``compile_``: torch.compile the
    model (``smoke``: its ``eager`` backend, no code generation) and use fused AdamW."""
    import torch

    model, inputs = ms.torch_model_and_inputs(row, batch, device, smoke)
    model.to(device).train()
    attn = getattr(model.config, "_attn_implementation", None)
    if compile_:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                      fused=device == "cuda")
        forward = torch.compile(model, backend="eager") if smoke else torch.compile(model)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        forward = model
    autocast = (torch.autocast(device, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = forward(**inputs).loss
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return loss

    start = time.perf_counter()
    step()  # warm-up (compiles under torch.compile)
    warmup_s = time.perf_counter() - start
    if compile_:
        step()  # a second warm-up: recompiles for the optimizer's state are done
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    return {"times": times, "warmup_s": warmup_s, "loss": float(loss.detach()), "attn": attn}


def free_torch_memory(on_gpu: bool) -> None:
    """Return PyTorch's cached blocks to the device after a row (JAX allocates next)."""
    import gc

    import torch
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()


def row_setup(ms, row: str, multiplier: int, smoke: bool = False) -> tuple:
    """``(config name, batch size, lengths, batch, tokens per step, model FLOPs per step)``
    of a ``model_step.py`` row at ``multiplier`` times its batch (``smoke``: its smoke row)."""
    from t5x_like.engine import flops
    config_name, batch_size, lengths = ms.ROWS[row]
    batch_size *= multiplier
    if smoke:
        batch_size, lengths = 2, ms.SMOKE_LENGTHS[row]
    model_config = ms.load_config(row, smoke).model
    batch = ms.make_batch(row, batch_size, lengths, model_config.vocab_size)
    return (config_name, batch_size, lengths, batch, batch_size * sum(lengths.values()),
            flops.train_flops_per_step(model_config, lengths, batch_size))


def stage_train(ms, args, on_gpu: bool, peak: float, measured: float) -> None:
    device = "cuda" if on_gpu else "cpu"
    for row in args.train_rows.split(","):
        config_name, batch_size, lengths, batch, tokens, model_flops = row_setup(
            ms, row, args.batch_multiplier, args.smoke)
        entry = {"row": row, "config": config_name, "batch": batch_size, "lengths": lengths,
                 "tokens_per_step": tokens, "model_flops_per_step": model_flops,
                 "dtype": args.dtype}
        for side in ("t5x_like", "torch_eager"):
            try:
                if side == "t5x_like":
                    r = ours_train(ms, row, batch, args.steps, args.dtype, args.smoke)
                else:
                    r = torch_train(ms, row, batch, args.steps, args.dtype, device,
                                    smoke=args.smoke)
                    free_torch_memory(on_gpu)
                med = statistics.median(r["times"])
                r.update(median_s=med, best_s=min(r["times"]), tok_s=tokens / med,
                         mfu=model_flops / med / peak, frac_measured=model_flops / med / measured)
                entry[side] = r
                log(f"train {row} {side}: median {med * 1e3:.1f} ms ({tokens / med:,.0f} tok/s, "
                    f"MFU {r['mfu']:.1%}), best {min(r['times']) * 1e3:.1f} ms, loss {r['loss']:.3f}")
            except Exception as e:  # noqa: BLE001 - keep going, report
                entry[side] = {"error": repr(e)[:500]}
                RESULTS["errors"].append(f"train {row} {side}: {e!r}"[:500])
                log(f"train {row} {side} FAILED: {e!r}"[:500])
            save(args.out)
        RESULTS["train"].append(entry)
        save(args.out)


def stage_decode(ds, args, on_gpu: bool, rows: list[str], dtype: str, batch: int) -> None:
    import numpy as np

    from t5x_like import structures

    device = "cuda" if on_gpu else "cpu"
    loaded = {}
    for row in rows:
        if time.perf_counter() - T0 > args.budget_s:
            log(f"decode {row} {dtype} b{batch}: skipped (budget)")
            continue
        config_name, beams = ds.ROWS[row]
        try:
            if config_name not in loaded:
                loaded.clear()
                model_config = ds.load_model_config(config_name, dtype, args.smoke)
                params = ds.init_params(structures.build_model(model_config))
                loaded[config_name] = (model_config, params, ds.hf_model_with_same_weights(
                    config_name, ds.export_config(model_config), params, device))
            model_config, params, hf_model = loaded[config_name]
            family = model_config["family"]
            length = args.prompt_length or ds.DEFAULT_PROMPT_LENGTH[config_name]
            rng = np.random.default_rng(0)
            tokens = rng.integers(5, model_config.vocab_size, size=(batch, length)).astype(np.int32)
            start = time.perf_counter()
            our_s, our_tok = ds.ours(model_config, params, tokens, beams, args.new_tokens,
                                     args.repeats)
            ours_wall = time.perf_counter() - start
            hf_s, hf_tok = ds.theirs(hf_model, family, tokens, beams, args.new_tokens,
                                     args.repeats, dtype, device)
            ok = our_tok.shape == hf_tok.shape == (batch, args.new_tokens)
            same = float(np.mean(np.all(our_tok == hf_tok, axis=1))) if ok else float("nan")
            generated = batch * args.new_tokens
            entry = {"row": row, "config": config_name, "beams": beams, "dtype": dtype,
                     "batch": batch, "prompt": length, "new": args.new_tokens,
                     "t5x_like_s": our_s, "hf_s": hf_s, "t5x_like_tok_s": generated / our_s,
                     "hf_tok_s": generated / hf_s, "same_tokens": same, "shapes_ok": ok,
                     "t5x_like_wall_incl_compile_s": ours_wall}
            RESULTS["decode"].append(entry)
            log(f"decode {row} {dtype} b{batch}: ours {generated / our_s:,.1f} tok/s, "
                f"HF {generated / hf_s:,.1f} tok/s, ratio {hf_s / our_s:.2f}, same {same:.0%}")
        except Exception as e:  # noqa: BLE001
            RESULTS["errors"].append(f"decode {row} {dtype} b{batch}: {e!r}"[:500])
            log(f"decode {row} {dtype} b{batch} FAILED: {e!r}"[:500])
        save(args.out)
    loaded.clear()


def stage_compile(ms, args, on_gpu: bool, peak: float) -> None:
    device = "cuda" if on_gpu else "cpu"
    for row in args.compile_rows.split(","):
        if not row:
            continue
        if time.perf_counter() - T0 > args.budget_s:
            log(f"compile {row}: skipped (budget)")
            continue
        config_name, batch_size, lengths, batch, tokens, model_flops = row_setup(
            ms, row, args.batch_multiplier, args.smoke)
        try:
            r = torch_train(ms, row, batch, args.steps, args.dtype, device, compile_=True,
                            smoke=args.smoke)
            free_torch_memory(on_gpu)
            med = statistics.median(r["times"])
            r.update(row=row, batch=batch_size, median_s=med, best_s=min(r["times"]),
                     tok_s=tokens / med, mfu=model_flops / med / peak)
            RESULTS["compile"].append(r)
            log(f"compile {row}: median {med * 1e3:.1f} ms ({tokens / med:,.0f} tok/s, "
                f"MFU {r['mfu']:.1%}), first step {r['warmup_s']:.0f} s")
        except Exception as e:  # noqa: BLE001
            RESULTS["errors"].append(f"compile {row}: {e!r}"[:500])
            log(f"compile {row} FAILED: {e!r}"[:500])
        save(args.out)


def print_tables(peak: float, smoke: bool = False) -> None:
    print("\n== train step (median of timed steps), MFU vs "
          f"{peak / 1e12:.0f} TFLOP/s dense bf16 peak ==")
    print(f"{'model':<14} {'batch':>5} {'tok/step':>8} {'ours tok/s':>11} {'ours MFU':>8} "
          f"{'torch tok/s':>11} {'torch MFU':>9} {'ratio':>6}")
    for e in RESULTS["train"]:
        o, t = e.get("t5x_like", {}), e.get("torch_eager", {})
        ot, tt = o.get("tok_s"), t.get("tok_s")
        print(f"{e['config']:<14} {e['batch']:>5} {e['tokens_per_step']:>8} "
              f"{ot or 0:>11,.0f} {o.get('mfu', 0):>8.1%} {tt or 0:>11,.0f} "
              f"{t.get('mfu', 0):>9.1%} {(ot / tt if ot and tt else 0):>6.2f}")
    backend = " (backend eager: --smoke skips Inductor's code generation)" if smoke else ""
    for c in RESULTS["compile"]:
        print(f"torch.compile {c['row']}{backend}: {c['tok_s']:,.0f} tok/s, MFU {c['mfu']:.1%}")
    print("\n== decode (best of repeats), tokens/s ==")
    print(f"{'row':<12} {'dtype':<9} {'batch':>5} {'ours':>9} {'HF':>9} {'ratio':>6} {'same':>5}")
    for d in RESULTS["decode"]:
        print(f"{d['row']:<12} {d['dtype']:<9} {d['batch']:>5} {d['t5x_like_tok_s']:>9,.1f} "
              f"{d['hf_tok_s']:>9,.1f} {d['hf_s'] / d['t5x_like_s']:>6.2f} "
              f"{d['same_tokens']:>5.0%}")
    if RESULTS["errors"]:
        print("\nerrors:", *RESULTS["errors"], sep="\n  ")


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default=os.path.dirname(os.path.dirname(here)))
    parser.add_argument("--out", default="")
    parser.add_argument("--budget_s", type=float, default=280.0)
    parser.add_argument("--stages", default="train,decode,compile,decode_extra",
                        help="stages, run in this order")
    parser.add_argument("--train_rows", default="gpt2,bert,t5")
    parser.add_argument("--batch_multiplier", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--decode_rows", default="gpt2_greedy,t5_greedy,gpt2_beam,t5_beam")
    parser.add_argument("--decode_batch", type=int, default=8)
    parser.add_argument("--decode_extra", default="bfloat16:64:gpt2_greedy,t5_greedy",
                        help="a second decode pass, DTYPE:BATCH:ROWS ('' for none)")
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--prompt_length", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile_rows", default="gpt2")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes for a CPU check of the whole script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch_multiplier, args.steps, args.repeats = 1, 1, 1
        args.decode_batch, args.new_tokens, args.prompt_length = 2, 4, 8
        args.decode_extra = "bfloat16:2:gpt2_greedy"
        args.train_rows, args.decode_rows = SMOKE_ROWS["train"], SMOKE_ROWS["decode"]
        args.budget_s = float("inf")  # every row runs, however slow the machine

    ms, ds = setup_imports(args.src)
    import jax
    import torch

    from t5x_like.system import hardware
    on_gpu = jax.default_backend() == "gpu"
    if on_gpu:
        torch.set_float32_matmul_precision("high")  # TF32 as JAX's default, as model_step.py
    else:
        torch.set_num_threads(os.cpu_count() or 1)
    kind = jax.devices()[0].device_kind
    env = versions()
    env.update(device_kind=kind, backend=jax.default_backend(), cpus=os.cpu_count(),
               torch_device=torch.cuda.get_device_name() if on_gpu else "cpu",
               src=args.src, args=vars(args))
    if on_gpu:
        with contextlib.suppress(Exception):
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                 "clocks.max.sm,power.limit,temperature.gpu", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip()
    RESULTS["env"] = env
    log(f"env: {json.dumps(env, default=str)}")
    peak = hardware.peak_flops(kind) or 1.0
    rates = matmul_rates(on_gpu, 256 if args.smoke else 8192 if on_gpu else 1024)
    RESULTS["matmul"] = dict(rates, datasheet_peak=peak)
    log(f"bf16 matmul measured: jax {rates['jax_bf16'] / 1e12:.1f} TFLOP/s, torch "
        f"{rates['torch_bf16'] / 1e12:.1f} TFLOP/s; datasheet peak {peak / 1e12:.0f}")
    if not on_gpu:
        peak = rates["jax_bf16"]  # no datasheet figure for a CPU; MFU against measured
    save(args.out)

    for stage in args.stages.split(","):  # in the order given
        if stage == "train":
            stage_train(ms, args, on_gpu, peak, rates["jax_bf16"])
        elif stage == "decode":
            stage_decode(ds, args, on_gpu, args.decode_rows.split(","), "float32",
                         args.decode_batch)
        elif stage == "decode_extra" and args.decode_extra:
            dtype, batch, rows = args.decode_extra.split(":")
            stage_decode(ds, args, on_gpu, rows.split(","), dtype, int(batch))
        elif stage == "compile":
            stage_compile(ms, args, on_gpu, peak)
    RESULTS["wall_s"] = time.perf_counter() - T0
    save(args.out)
    print_tables(peak, args.smoke)
    log("done")
    return 1 if args.smoke and RESULTS["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
