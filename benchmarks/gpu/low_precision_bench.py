"""One-call GPU benchmark of low precision (issue: int8/fp8 through Qwix): the bf16 matmul
gap between XLA and cuBLAS, train-step MFU in bf16 and fp8 against PyTorch, and decoding
with int8 weights against float ones. Prints a table; ``--out`` keeps the numbers.

Run through the device tool (see ``run_device.sh``, which prepares ``.whl/``), e.g.

    bash benchmarks/gpu/run_device.sh --script low_precision_bench.py --budget_s 420

and on a CPU, as a check that every stage runs (tiny sizes, seconds a stage):

    .venv/bin/python benchmarks/gpu/low_precision_bench.py --smoke

``--smoke`` shrinks every row (a 256^3 matmul, 1-layer 64-wide decoders of 4 x 64 tokens,
batch 2 decoding of 16 + 16 tokens, 2 timed steps) and exits 1 if a row failed. What
needs a GPU is skipped where there is none, each with its reason in the table: the
XLA:GPU GEMM flag sets (XLA:CPU refuses them; the default set runs, in this process when
there is no GPU: it sets no flag, and a fresh process costs seconds of imports) and
torchao's float8 training (CUDA only). Each config runs in one stage (``SMOKE_ROWS``: the
train stage on ``gpt2_small``, both weights of the decode stage on ``decoder_modern_1b``):
the rows of a stage share its code, and each compile of even a tiny step takes seconds.
For the same reason the train stage leaves out t5x_like's bf16 side (``SMOKE_SKIPPED``: the
fp8 side runs the same function with ``quantization.kind`` set, its matmul-share count
included; ``low_precision.py``'s smoke run trains both kinds).

Stages:

1. ``matmul``: an 8192^3 bf16 matmul (a jitted loop of 10, so dispatch is not timed) in
   JAX under each set of XLA flags in ``FLAG_SETS`` (each in a fresh process: the flags
   are read when the backend starts), and ``torch.matmul`` on the same shapes. For each:
   TFLOP/s and which kernel XLA chose (the custom call in the compiled HLO: cuBLAS,
   cuBLASLt or a Triton fusion), so the gap is located, not guessed.
2. ``train``: GPT-2 small (32 x 1024) and ``decoder_modern_1b`` (8 x 2048) train steps
   (AdamW) of t5x_like's ``Trainer`` in bf16, then with ``quantization.kind=fp8`` (Qwix:
   e4m3 forward, e5m2 backward), and the same shapes in PyTorch (transformers,
   ``torch.compile``, fused AdamW, bf16 autocast) and, where ``torchao`` imports, with its
   ``convert_to_float8_training``. MFU = model FLOPs (``t5x_like.engine.flops``) / step time /
   the chip's dense bf16 peak (``t5x_like.system.hardware``), for every row, so rows compare;
   the fp8 rows also give the share of matmul FLOPs XLA ran in fp8 (``hlo_matmuls``).
3. ``decode``: greedy decoding of 128 new tokens after 128-token prompts at batch 8 and
   64: the float checkpoint's weights cast to bf16, and int8 attention/MLP weights
   (``quantization.weights=int8``); tokens/s, and whether the tokens are the same.

Stages stop starting rows once ``--budget_s`` seconds have passed; the JSON is rewritten
after every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

T0 = time.perf_counter()
RESULTS: dict = {"matmul": [], "train": [], "decode": [], "errors": []}
# XLA:GPU's GEMM choices: autotuning on or off, Triton GEMMs on or off, cuBLASLt.
FLAG_SETS = {
    "default": "",
    "no_triton_gemm": "--xla_gpu_enable_triton_gemm=false",
    "cublaslt": "--xla_gpu_enable_cublaslt=true",
    "cublaslt_no_triton": "--xla_gpu_enable_cublaslt=true --xla_gpu_enable_triton_gemm=false",
    "autotune_0": "--xla_gpu_autotune_level=0",
    "autotune_4": "--xla_gpu_autotune_level=4",
}


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {message}", flush=True)


def save(path: str) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


def over_budget(args) -> bool:
    return time.perf_counter() - T0 > args.budget_s


# -- 1. the matmul gap ---------------------------------------------------------------------

MATMUL_CHILD = r"""
import json, re, sys, time, statistics
import jax, jax.numpy as jnp
n, reps = int(sys.argv[1]), 10
a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
def loop(a, b):
    return jax.lax.fori_loop(0, reps, lambda i, c: (a + c[:1, :1].astype(a.dtype)) @ b, b)
f = jax.jit(loop)
text = f.lower(a, b).compile().as_text()
kernels = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
triton = "triton" in text and "__triton" in text or "kind=kCustom" in text
times = []
for i in range(6):
    t = time.perf_counter(); f(a, b).block_until_ready(); times.append(time.perf_counter() - t)
rate = 2 * n**3 * reps / statistics.median(times[2:])
print(json.dumps({"tflops": rate / 1e12, "kernels": kernels, "triton_fusion": triton}))
"""


def _matmul_here(n: int) -> str:
    """``MATMUL_CHILD``'s output, run in this process (its backend already started)."""
    import contextlib
    import io
    out, argv = io.StringIO(), sys.argv
    try:
        sys.argv = ["-c", str(n)]
        with contextlib.redirect_stdout(out):
            exec(MATMUL_CHILD, {"__name__": "__main__"})  # noqa: S102 - our own code
    finally:
        sys.argv = argv
    return out.getvalue()


def on_gpu() -> bool:
    import jax
    return jax.default_backend() == "gpu"


def stage_matmul(args) -> None:
    n = 256 if args.smoke else 8192
    for name, flags in FLAG_SETS.items():
        if over_budget(args):
            break
        if flags and not on_gpu():
            RESULTS["matmul"].append({"side": "jax", "flags": name,
                                      "skipped": "XLA:GPU flags; no GPU here"})
            continue
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
        try:
            if args.smoke and not on_gpu():  # no flags to start a backend with (docstring)
                stdout = _matmul_here(n)
            else:
                stdout = subprocess.run([sys.executable, "-c", MATMUL_CHILD, str(n)], env=env,
                                        capture_output=True, text=True, timeout=120).stdout
            row = {"side": "jax", "flags": name, **json.loads(stdout.strip().splitlines()[-1])}
        except Exception as e:  # noqa: BLE001 - a flag this XLA does not know: say so, go on
            row = {"side": "jax", "flags": name, "error": f"{type(e).__name__}: {e}"[:300]}
        RESULTS["matmul"].append(row)
        log(f"matmul jax {name}: {row}")
        save(args.out)
    try:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        y = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        times = []
        for _ in range(8):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                x @ y
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        RESULTS["matmul"].append({"side": "torch", "flags": "-",
                                  "tflops": 2 * n**3 * 10 / statistics.median(times[2:]) / 1e12})
    except Exception as e:  # noqa: BLE001
        RESULTS["errors"].append(f"torch matmul: {e}")
    save(args.out)


# -- 2. train steps ------------------------------------------------------------------------

TRAIN_ROWS = {  # config, batch, length (smoke: a tiny decoder)
    "gpt2_small": ("gpt2_small", 32, 1024),
    "decoder_modern_1b": ("decoder_modern_1b", 8, 2048),
}
DECODE_ROWS = ("gpt2_small", "decoder_modern_1b")
# --smoke: each stage's rows (every config is read by one of them; every side and both
# weights still run).
SMOKE_ROWS = {"train": ("gpt2_small",), "decode": ("decoder_modern_1b",)}
# --smoke: the train stage's sides it leaves out (see the docstring).
SMOKE_SKIPPED = ("t5x_like bf16",)


def _config(name: str, batch: int, length: int, kind: str, smoke: bool):
    from t5x_like import config_lib
    config = config_lib.load_config_file(os.path.join(args_src(), "configs", f"{name}.py"))
    if smoke:
        config.model.update(dict(vocab_size=512, d_model=64, num_heads=4, head_dim=16, d_ff=128,
                                 num_layers=1))
    config.model.numerics.dtype = "bfloat16"
    config.task, config.task_feature_lengths = "embedded_en_lm", {"targets": length}
    config.batch_size, config.quantization.kind = batch, kind
    config.mesh.update(dict(data=1, fsdp=1, tensor=1))
    return config


def ours_train(config, steps: int) -> dict:
    import jax
    import numpy as np

    from t5x_like import structures
    from t5x_like.config import spec_of
    from t5x_like.engine import flops, partitioning
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.planner import hlo_matmuls
    from t5x_like.system import hardware
    spec = spec_of(config)
    devices = jax.devices()[:1]
    trainer = trainer_lib.build_trainer(spec, partitioning.make_mesh(
        {"data": 1, "fsdp": 1, "tensor": 1}, devices))
    abstract = structures.for_config(spec).abstract_batch(spec.task_feature_lengths,
                                                          spec.batch_size)
    rng = np.random.default_rng(0)
    batch = {k: (np.ones(v.shape, np.float32) if v.dtype == np.float32 else
                 rng.integers(3, spec.model.vocab_size, size=v.shape).astype(np.int32))
             for k, v in abstract.items()}
    batch = jax.device_put(batch, trainer.batch_sharding)
    state = trainer.init_state(0)
    start = time.perf_counter()
    compiled = trainer.lower_train_step(state, batch).compile()
    compile_s = time.perf_counter() - start
    # None where XLA's matmuls are custom calls (cuBLAS on GPU), which hlo_matmuls does not
    # read (it reads dot and convolution, as TPU and CPU programs hold them).
    by_dtype = hlo_matmuls.matmul_flops_by_dtype(compiled.as_text())
    share = hlo_matmuls.low_precision_share(by_dtype) if by_dtype else None
    for _ in range(2):
        state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    model_flops = flops.train_flops_per_step(spec.model, spec.task_feature_lengths,
                                             spec.batch_size)
    peak = hardware.peak_flops(devices[0].device_kind)  # None: no datasheet peak (a CPU)
    return {"step_s": step_s, "tokens_per_s": spec.batch_size * spec.task_feature_lengths[
        "targets"] / step_s, "mfu": model_flops / step_s / peak if peak else None,
        "compile_s": compile_s,
        "low_precision_matmul_share": share, "loss": float(metrics["loss"])}


def torch_train(name: str, batch: int, length: int, steps: int, float8: bool,
                smoke: bool) -> dict:
    import torch
    import transformers
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "gpt2_small":
        hf = transformers.GPT2Config(n_positions=max(1024, length))
    else:
        hf = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048,
                                      intermediate_size=5632, num_hidden_layers=22,
                                      num_attention_heads=32, num_key_value_heads=4,
                                      max_position_embeddings=2048, tie_word_embeddings=False)
    if smoke:
        hf = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=1, n_head=4,
                                     n_positions=length)
    model = transformers.AutoModelForCausalLM.from_config(hf).to(device).train()
    if float8:
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: "lm_head" not in fqn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    forward = torch.compile(model) if device == "cuda" else model
    ids = torch.randint(3, hf.vocab_size, (batch, length), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times),
            "tokens_per_s": batch * length / statistics.median(times)}


def _free_torch_memory() -> None:
    """PyTorch's cached blocks back to the device after a row (JAX allocates next)."""
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stage_train(args) -> None:
    from t5x_like.config import spec_of
    from t5x_like.engine import flops
    from t5x_like.system import hardware
    for row, (name, batch, length) in TRAIN_ROWS.items():
        if args.smoke:
            if row not in SMOKE_ROWS["train"]:
                continue
            batch, length = 4, 64
        for side, kind in (("t5x_like bf16", ""), ("t5x_like fp8", "fp8"),
                           ("torch.compile bf16", None), ("torch.compile torchao float8", "ao")):
            if over_budget(args):
                return
            if args.smoke and side in SMOKE_SKIPPED:
                continue
            entry = {"row": row, "side": side, "batch": batch, "length": length}
            if kind == "ao" and not on_gpu():
                entry["skipped"] = "torchao float8 training needs CUDA"
                RESULTS["train"].append(entry)
                continue
            try:
                if kind is None or kind == "ao":
                    entry.update(torch_train(name, batch, length, args.steps, kind == "ao",
                                             args.smoke))
                    spec = spec_of(_config(name, batch, length, "", args.smoke))
                    import jax
                    peak = hardware.peak_flops(jax.devices()[0].device_kind)
                    entry["mfu"] = (flops.train_flops_per_step(
                        spec.model, spec.task_feature_lengths, batch) / entry["step_s"] / peak
                        if peak else None)
                else:
                    entry.update(ours_train(_config(name, batch, length, kind, args.smoke),
                                            args.steps))
            except Exception as e:  # noqa: BLE001 - a row that cannot run says why
                entry["error"] = f"{type(e).__name__}: {e}"[:400]
            _free_torch_memory()
            RESULTS["train"].append(entry)
            log(f"train {entry}")
            save(args.out)


# -- 3. decoding with int8 weights ---------------------------------------------------------

def stage_decode(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from t5x_like import structures
    from t5x_like.checkpoints import int8_weights
    from t5x_like.config import spec_of
    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    prompt, new = (16, 16) if args.smoke else (128, 128)
    for row in (SMOKE_ROWS["decode"] if args.smoke else DECODE_ROWS):
        for batch in ((2,) if args.smoke else (8, 64)):
            if over_budget(args):
                return
            config = _config(row, batch, prompt + new, "", args.smoke)
            config.task_feature_lengths = {"inputs": prompt, "targets": new}
            config.model.numerics.scan_layers = False  # int8 weights are per layer
            spec = spec_of(config)
            mesh = partitioning.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
            trainer = trainer_lib.build_trainer(spec, mesh)
            structure = structures.for_config(spec)
            params = trainer.init_state(0).params
            rng = np.random.default_rng(0)
            tokens = rng.integers(3, spec.model.vocab_size, size=(batch, prompt + new))
            weights = (tokens * 0).astype(np.float32)
            weights[:, prompt:] = 1
            feed = {"decoder_target_tokens": tokens.astype(np.int32),
                    "decoder_input_tokens": tokens.astype(np.int32),
                    "decoder_loss_weights": weights}
            outputs = {}
            for name in ("bf16 weights", "int8 weights"):
                entry = {"row": row, "batch": batch, "weights": name}
                try:
                    if name == "int8 weights":
                        quantized = int8_weights.Int8Weights(structure, trainer)
                        side, side_params = quantized.structure, quantized.quantize(params)
                    else:
                        side, side_params = structure, jax.tree.map(
                            lambda p: p.astype(jnp.bfloat16), params)
                    run = jax.jit(lambda p, b, s=side: s.predict_batch(
                        p, b, max_decode_length=new))
                    out = run(side_params, feed)
                    jax.block_until_ready(out)
                    times = []
                    for _ in range(3):
                        start = time.perf_counter()
                        jax.block_until_ready(run(side_params, feed))
                        times.append(time.perf_counter() - start)
                    outputs[name] = np.asarray(out)
                    entry["tokens_per_s"] = batch * new / min(times)
                except Exception as e:  # noqa: BLE001
                    entry["error"] = f"{type(e).__name__}: {e}"[:400]
                RESULTS["decode"].append(entry)
                log(f"decode {entry}")
                save(args.out)
            if len(outputs) == 2:
                RESULTS["decode"][-1]["same_tokens_share"] = float(
                    (outputs["bf16 weights"] == outputs["int8 weights"]).mean())


def table() -> str:
    lines = ["| matmul (bf16, 8192^3) | XLA flags | TFLOP/s | kernels |", "|---|---|---|---|"]
    for r in RESULTS["matmul"]:
        tflops = f"{r['tflops']:.0f}" if "tflops" in r else "—"
        lines.append(f"| {r['side']} | {r['flags']} | {tflops} | "
                     f"{r.get('kernels', r.get('error', r.get('skipped', '')))} |")
    lines += ["", "| train row | side | tokens/s | MFU (bf16 peak) | fp8 share |",
              "|---|---|---|---|---|"]
    for r in RESULTS["train"]:
        lines.append(f"| {r['row']} | {r['side']} | {r.get('tokens_per_s', 0):,.0f} | "
                     f"{mfu(r)} | {r.get('low_precision_matmul_share', '')}"
                     f" {r.get('error', '')}{r.get('skipped', '')} |")
    lines += ["", "| decode row | batch | weights | tokens/s | same tokens |",
              "|---|---|---|---|---|"]
    for r in RESULTS["decode"]:
        lines.append(f"| {r['row']} | {r['batch']} | {r['weights']} | "
                     f"{r.get('tokens_per_s', 0):,.0f} | {r.get('same_tokens_share', '')} "
                     f"{r.get('error', '')} |")
    return "\n".join(lines)


_SRC = [os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))]


def args_src() -> str:
    return _SRC[0]


def mfu(row: dict) -> str:
    """A train row's MFU cell: ``—`` where the chip has no datasheet peak (a CPU)."""
    return "—" if row.get("mfu") is None else f"{100 * row['mfu']:.1f}%"


def failures() -> list[str]:
    """Rows that failed (a skipped row says why it could not run here, and is none)."""
    rows = [r for stage in ("matmul", "train", "decode") for r in RESULTS[stage]]
    return [str(r) for r in rows if "error" in r] + RESULTS["errors"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=_SRC[0], help="where t5x_like and configs/ are")
    parser.add_argument("--stages", default="matmul,train,decode")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--budget_s", type=float, default=420)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU check)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    _SRC[0] = os.path.abspath(args.src)
    sys.path.insert(0, _SRC[0])
    if args.smoke:
        args.steps, args.budget_s = 2, float("inf")  # every row, however slow the machine
    import jax
    RESULTS["device"] = jax.devices()[0].device_kind
    stages = {"matmul": stage_matmul, "train": stage_train, "decode": stage_decode}
    for name in args.stages.split(","):
        if over_budget(args):
            log(f"budget spent: {name} not started")
            continue
        stages[name](args)
    save(args.out)
    print(table(), flush=True)
    failed = failures()
    if args.smoke and failed:
        print("failed rows:", *failed, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
