"""Serving throughput: the continuous-batching engine (``t5x_like.generation``, what
``t5xl serve`` decodes with) against static batches of the same requests, ours
(``decoding.generate_padded``, what ``infer`` runs) and transformers' ``generate``.

    .venv/bin/python benchmarks/serving.py [--concurrency 1,8,64] [--requests_per_stream 4]
        [--layers 4] [--d_model 256] [--prompt 16,128] [--new 4,256] [--page_size 16]
        [--systems engine,static,transformers] [--smoke]

``--smoke``: a 1-layer, 32-wide model, concurrency 2, short requests: a check
that the script runs.

The model is GPT-2's layout (``configs/gpt2_small.py``: learned positions, LayerNorm,
GELU, tied embeddings, its 50,257-token vocabulary) at ``--layers`` x ``--d_model``
(64-wide heads, a 4x MLP), random weights with a fixed seed; transformers reads the same
weights through the repository's exporter (``decode_speed.hf_model_with_same_weights``).

The workload, for each concurrency C: ``--requests_per_stream`` x C requests (at least
8), all waiting at time 0 in a fixed order; prompt lengths drawn uniformly from
``--prompt`` and new-token counts log-uniformly from ``--new`` (many short answers, a
few long ones), seed 0. Every request is greedy and runs to its own count (EOS off).

- ``engine``: C slots, pages of ``--page_size``; requests are admitted as slots free up.
- ``static``: the requests in batches of C in order, each batch one jitted
  ``generate_padded`` call (prompts padded to the batch's longest, bucketed; every row
  decoded to the batch's largest count): a batch's requests end when its longest does.
- ``transformers``: the same batches through ``generate`` (left padding, its cache).

Reported per system: useful tokens/s (each request's own count, over the wall time of the
whole workload), time to first token and latency (from time 0 to the request's first /
last token; a static batch returns its tokens when the batch ends), p50 and p99 over the
requests, and the share of requests whose tokens equal the static batch's. Every program
is compiled in an untimed pass over the same workload first. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import decode_speed  # benchmarks/ is on the path (a script, or the smoke test)
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like import structures
from t5x_like.generation.engine import Engine, Request, bucket
from t5x_like.models import decoding

NO_EOS = -1


def workload(count: int, prompt: tuple[int, int], new: tuple[int, int], vocab: int,
             seed: int = 0) -> list[Request]:
    """``count`` greedy requests: prompt lengths uniform in ``prompt``, new-token counts
    log-uniform in ``new`` (both inclusive), random token ids."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(prompt[0], prompt[1] + 1, size=count)
    counts = np.exp(rng.uniform(np.log(new[0]), np.log(new[1] + 1), size=count)).astype(int)
    return [Request(tuple(int(t) for t in rng.integers(5, vocab, size=n)), int(c))
            for n, c in zip(lengths, counts, strict=True)]



def run_engine(engine: Engine, requests: list[Request]):
    """``(tokens per request, first-token times, end times, wall)``."""
    start = time.perf_counter()
    first, end = [None] * len(requests), [None] * len(requests)

    def watch(i):
        def on_token(token, logprob):
            now = time.perf_counter() - start
            first[i] = now if first[i] is None else first[i]
            end[i] = now
            return True
        return on_token
    handles = [engine.submit(r, watch(i)) for i, r in enumerate(requests)]
    while engine.busy():
        engine.step()
    tokens = [h.wait().tokens for h in handles]
    return tokens, first, end, time.perf_counter() - start


def static_batches(requests: list[Request], size: int, decode_batch):
    """Runs ``decode_batch(rows [b, width], lengths [b], new) -> tokens [b, new]`` on the
    requests in batches of ``size``; the same timing tuple as ``run_engine``."""
    start = time.perf_counter()
    tokens, done = [], []
    for at in range(0, len(requests), size):
        batch = requests[at:at + size]
        # The engine's buckets (powers of two times 8), without its cap.
        width = bucket(max(len(r.prompt) for r in batch), 8, sys.maxsize)
        new = bucket(max(r.max_tokens for r in batch), 8, sys.maxsize)
        rows = np.zeros((len(batch), width), np.int32)
        for i, r in enumerate(batch):
            rows[i, :len(r.prompt)] = r.prompt
        out = decode_batch(rows, np.asarray([len(r.prompt) for r in batch], np.int32), new)
        now = time.perf_counter() - start
        tokens += [list(out[i][:r.max_tokens]) for i, r in enumerate(batch)]
        done += [now] * len(batch)
    return tokens, done, done, time.perf_counter() - start


def ours_static(model, params):
    compiled = {}

    def decode_batch(rows, lengths, new):
        key = (rows.shape, new)
        if key not in compiled:
            compiled[key] = jax.jit(lambda p, r, n: decoding.generate_padded(
                model, p, r, n, max_new_tokens=new, eos_id=NO_EOS))
        return np.asarray(compiled[key](params, jnp.asarray(rows), jnp.asarray(lengths)))
    return decode_batch


def transformers_static(hf_model):
    import torch

    def decode_batch(rows, lengths, new):
        width = rows.shape[1]
        left = np.zeros_like(rows)
        mask = np.zeros_like(rows)
        for i, n in enumerate(lengths):  # left padding, as generate wants it
            left[i, width - n:] = rows[i, :n]
            mask[i, width - n:] = 1
        with torch.inference_mode():
            out = hf_model.generate(input_ids=torch.tensor(left, dtype=torch.long),
                                    attention_mask=torch.tensor(mask, dtype=torch.long),
                                    max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                    num_beams=1, use_cache=True)
        return out[:, width:].numpy()
    return decode_batch


def summary(name, concurrency, requests, result, reference) -> str:
    tokens, first, end, wall = result
    useful = sum(r.max_tokens for r in requests)
    same = np.mean([a == b for a, b in zip(tokens, reference, strict=True)])
    p = lambda values, q: float(np.percentile(values, q))  # noqa: E731
    return (f"| {concurrency} | {len(requests)} | {name} | {useful / wall:,.1f} | "
            f"{p(first, 50):.2f} | {p(end, 50):.2f} | {p(end, 99):.2f} | {same:.0%} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--requests_per_stream", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--prompt", default="16,128")
    parser.add_argument("--new", default="4,256")
    parser.add_argument("--page_size", type=int, default=16)
    parser.add_argument("--systems", default="engine,static,transformers")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model and short requests: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.concurrency, args.prompt, args.new, args.requests_per_stream = "2", "3,8", "2,8", 2
    systems = args.systems.split(",")
    prompt = tuple(int(x) for x in args.prompt.split(","))
    new = tuple(int(x) for x in args.new.split(","))

    model_config = decode_speed.load_model_config("gpt2_small", "float32", args.smoke)
    if not args.smoke:
        model_config.num_layers = args.layers
        model_config.d_model = args.d_model
        model_config.num_heads = args.d_model // 64
        model_config.head_dim = 64
        model_config.d_ff = 4 * args.d_model
    model = structures.build_model(model_config)
    params = jax.device_put(decode_speed.init_params(model))
    max_length = prompt[1] + new[1]
    print(f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores; GPT-2 layout "
          f"{model_config.num_layers}x{model_config.d_model}, vocab {model_config.vocab_size}; "
          f"prompts {prompt[0]}-{prompt[1]} (uniform), new tokens {new[0]}-{new[1]} "
          f"(log-uniform)\n")
    print("| concurrency | requests | system | tokens/s | TTFT p50 s | latency p50 s | "
          "latency p99 s | same tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    hf_model = None
    if "transformers" in systems:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        hf_model = decode_speed.hf_model_with_same_weights(
            "gpt2_small", decode_speed.export_config(model_config),
            jax.device_get(params), "cpu")
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        requests = workload(max(8, args.requests_per_stream * concurrency), prompt, new,
                            model_config.vocab_size)
        static = ours_static(model, params)  # its programs, compiled by the warm-up pass
        runs = {"static": lambda: static_batches(requests, concurrency, static)}  # noqa: B023
        engine = Engine(model, params, max_length=max_length, slots=concurrency,
                        page_size=args.page_size)
        def served(engine=engine, requests=requests):
            engine.clear_prefix_cache()  # the warm-up pass's prompts are not found again
            return run_engine(engine, requests)
        runs["engine"] = served
        if hf_model is not None:
            runs["transformers"] = lambda: static_batches(requests, concurrency,  # noqa: B023
                                                          transformers_static(hf_model))
        results = {}
        for name in ("static", *[s for s in systems if s != "static"]):
            runs[name]()  # compiles every program the timed pass runs
            results[name] = runs[name]()
        reference = results["static"][0]
        for name in systems:
            print(summary(name, concurrency, requests, results[name], reference), flush=True)


if __name__ == "__main__":
    main()
