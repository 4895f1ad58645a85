"""Decode speed: t5x_like's ``infer`` decoding versus transformers' ``generate``, same weights.

    .venv/bin/python benchmarks/decode_speed.py [--repeats 5] [--batch 8] [--new_tokens 64]
        [--prompt_length N] [--rows gpt2_greedy,gpt2_beam,t5_greedy,t5_beam]
        [--dtype float32] [--torch_threads 0] [--smoke]

``--smoke``: the rows of ``SMOKE_ROWS`` (each model and each search once: GPT-2 with beams,
T5 greedy) at tiny sizes (1-layer, 32-wide models of the same configs, batch 2, 8-token
prompts, 4 new tokens, one timed call), a check that the script runs. The other two rows
run in ``gpu/gpu_bench.py``'s smoke run (T5 with beams, GPT-2 greedy in bfloat16) through
this script's functions; each row is another decode compile and ``generate`` call.

Rows: GPT-2 small (``configs/gpt2_small.py``) and T5 v1.1 small
(``configs/t5_1_1_small.py``), each greedy and beam search with 4 beams. Our
parameters are randomly initialised with a fixed seed and exported with the
repository's own converters (``t5x_like/convert/hf_gpt2.py``, ``hf_t5.py``,
``hf_io.write_folder``) into a Hugging Face folder that transformers loads, so both
sides compute the same function.

The t5x_like side calls exactly the decoding functions ``python -m t5x_like.infer``
reaches through ``structures.*.predict_batch``: ``decoding.generate_padded`` (greedy,
or ``num_beams=4``) for GPT-2 and ``decoding.decode`` / ``decoding.beam_decode`` for
T5, with the same arguments (beam ``alpha`` 0.6), each jitted as one call (the whole
decode is one ``while_loop``/``fori_loop``). The transformers side is
``model.generate(do_sample=False, num_beams=1 or 4, use_cache=True)``.

Both sides generate exactly ``--new_tokens`` tokens per sequence: EOS is switched off
(ours: ``eos_id=-1``, an id argmax never returns, so no row finishes and beam search
never closes a hypothesis; theirs: ``generation_config.eos_token_id = None``). This
changes nothing for greedy decoding before the first EOS, and makes the token counts
equal; the script checks both sides returned that many tokens.

Printed per row: tokens/s for both, where tokens = batch x new tokens (for beam
search the returned best sequence's new tokens, not beams x new tokens), the ratio
(t5x_like / transformers), and the fraction of the batch's sequences that are
token-identical between the two. Greedy decoding of the same weights should agree
exactly up to float32 rounding (a random-init model's logits are close together, so
a rare argmax flip after rounding is possible; the column reports it rather than
asserting). For beam rows it compares the best beams; with no EOS every hypothesis
has the same length, so both searches rank by total log-probability and should agree
too, but they are not the same algorithm in general.

Times are the median of ``--repeats`` timed calls per side, after one warm-up call
(which includes JAX's compile); the two sides' calls alternate, so load that comes and
goes falls on both, which trims, but cannot remove, its effect. Wall time includes the
prompt prefill / encoder pass. Needs the ``hf`` extra (torch, transformers, safetensors).

Caveats: run it on an otherwise idle machine. With other processes competing for the
cores, PyTorch's OpenMP threads lose far more than XLA's (every small op is a parallel
region whose threads wait for each other), beam search worst: on a loaded 2-core
machine transformers' T5 beam row came out 24x slower than its greedy row, for about
4x the work (``--torch_threads`` sets PyTorch's thread count). Random weights, so what
is generated is meaningless (only speed and agreement are measured); prompts are all
``--prompt_length`` long (no padding). On a GPU (JAX's default backend) PyTorch runs
on CUDA too, with TF32 matmuls for float32 on both sides, as in ``model_step.py``;
``--dtype bfloat16`` computes in bfloat16 (our ``model.dtype``, PyTorch under autocast;
parameters stay float32), where token identity is no longer expected.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like import config_lib, models, structures
from t5x_like.checkpoints import hf_io
from t5x_like.convert import __main__ as convert_cli
from t5x_like.convert import hf_gpt2, hf_t5
from t5x_like.models import decoding

ROWS = {
    # name: (config file, beams)
    "gpt2_greedy": ("gpt2_small", 1),
    "gpt2_beam": ("gpt2_small", 4),
    "t5_greedy": ("t5_1_1_small", 1),
    "t5_beam": ("t5_1_1_small", 4),
}
# --smoke's rows (see the docstring).
SMOKE_ROWS = ("gpt2_beam", "t5_greedy")
DEFAULT_PROMPT_LENGTH = {"gpt2_small": 64, "t5_1_1_small": 256}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_EOS = -1  # never an argmax, so no row ends early on our side


def load_model_config(config_name: str, dtype: str, smoke: bool = False):
    config = config_lib.load_config_file(os.path.join(REPO, "configs", f"{config_name}.py"))
    config.model.numerics.dtype = dtype
    if smoke:
        import _smoke
        _smoke.tiny_model(config.model, vocab_size=512)
    return config.model


def export_config(model_config) -> dict:
    """The model as the exporters read it: their flat view (``convert.flat_model``, what
    ``convert export`` hands them; a config's sectioned ``to_dict()`` hides keys such as
    ``positions.max_length`` from them), in float32, the dtype of the exported weights."""
    return dict(convert_cli.flat_model(model_config), dtype="float32")


def init_params(model, seed: int = 0):
    """Random parameters (fixed seed) as host numpy, the tree the exporters read."""
    inputs = models.example_inputs(model)
    params = jax.jit(lambda rng: nn.unbox(model.init(rng, *inputs)["params"]))(
        jax.random.key(seed))
    return jax.tree.map(np.asarray, params)


def hf_model_with_same_weights(config_name: str, model_config: dict, params, device: str):
    """Our params exported through ``convert``'s Hugging Face writer and loaded back by
    transformers, so the exporter (not this script) decides the weight layout."""
    import transformers

    transformers.utils.logging.set_verbosity_error()  # loading progress bars and notes
    transformers.utils.logging.disable_progress_bar()
    exporter = hf_gpt2 if model_config["family"] == "decoder" else hf_t5
    hf_config = exporter.hf_config_from_model_config(model_config)
    weights = exporter.params_to_hf(params, model_config)
    cls = (transformers.GPT2LMHeadModel if model_config["family"] == "decoder"
           else transformers.T5ForConditionalGeneration)
    with tempfile.TemporaryDirectory(prefix=f"decode_speed_{config_name}_") as folder:
        hf_io.write_folder(folder, hf_config, weights)
        model = cls.from_pretrained(folder, dtype="float32")
    model.generation_config.eos_token_id = None  # run every sequence to max_new_tokens
    model.generation_config.pad_token_id = 0
    return model.to(device).eval()


def ours_decode_fn(model, family: str, beams: int, new_tokens: int):
    """The jitted call ``infer`` makes for this row (``structures.*.predict_batch``), with
    EOS disabled; returns ``[batch, new_tokens]`` (the best beam for beam search)."""
    alpha = structures.DECODE_DEFAULTS["alpha"]  # what infer's --alpha defaults to
    if family == "decoder":
        def run(params, prompts):
            lengths = jnp.full((prompts.shape[0],), prompts.shape[1], jnp.int32)
            return decoding.generate_padded(model, params, prompts, lengths,
                                            max_new_tokens=new_tokens, num_beams=beams,
                                            alpha=alpha, eos_id=NO_EOS)
    elif beams > 1:
        def run(params, inputs):
            sequences, _ = decoding.beam_decode(model, params, inputs,
                                                max_decode_length=new_tokens, num_beams=beams,
                                                alpha=alpha, eos_id=NO_EOS)
            return sequences[:, 0]
    else:
        run = functools.partial(decoding.decode, model, max_decode_length=new_tokens,
                                eos_id=NO_EOS)
    return jax.jit(run)


def time_alternating(fns, repeats: int) -> list[tuple[float, np.ndarray]]:
    """A warm-up call of each (compile, caches), then ``repeats`` rounds calling each in
    turn; per function the median of its timed calls and its last output. Alternating
    puts both sides under the same passing load, and the median is not the one quiet
    moment a minimum is."""
    outs = [fn() for fn in fns]
    times = [[] for _ in fns]
    for _ in range(repeats):
        for index, fn in enumerate(fns):
            start = time.perf_counter()
            outs[index] = fn()
            times[index].append(time.perf_counter() - start)
    return [(statistics.median(t), out) for t, out in zip(times, outs, strict=True)]


def our_runner(model_config, params, tokens: np.ndarray, beams: int, new_tokens: int):
    """The timed call of our side: ``() -> [batch, new_tokens]`` (numpy)."""
    model = structures.build_model(model_config)
    decode_fn = ours_decode_fn(model, model_config["family"], beams, new_tokens)
    device_params = jax.device_put(params)
    device_tokens = jax.device_put(jnp.asarray(tokens, jnp.int32))
    return lambda: np.asarray(jax.block_until_ready(decode_fn(device_params, device_tokens)))


def their_runner(hf_model, family: str, tokens: np.ndarray, beams: int, new_tokens: int,
                 dtype: str, device: str):
    """The timed call of transformers' side: ``() -> [batch, new_tokens]`` (numpy)."""
    import torch

    input_ids = torch.tensor(tokens, dtype=torch.long, device=device)
    autocast = (torch.autocast(device, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())

    def run():
        with torch.inference_mode(), autocast:
            out = hf_model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                    do_sample=False, num_beams=beams, use_cache=True)
        out = out.cpu().numpy()  # waits for CUDA too
        # GPT-2 returns prompt + new tokens; T5 the decoder start token + new tokens.
        return out[:, tokens.shape[1]:] if family == "decoder" else out[:, 1:]
    return run


def ours(model_config, params, tokens: np.ndarray, beams: int, new_tokens: int,
         repeats: int) -> tuple[float, np.ndarray]:
    """Median seconds and output of our side alone (``gpu/gpu_bench.py``)."""
    (result,) = time_alternating([our_runner(model_config, params, tokens, beams, new_tokens)],
                                 repeats)
    return result


def theirs(hf_model, family: str, tokens: np.ndarray, beams: int, new_tokens: int,
           repeats: int, dtype: str, device: str) -> tuple[float, np.ndarray]:
    """Median seconds and output of transformers' side alone (``gpu/gpu_bench.py``)."""
    (result,) = time_alternating(
        [their_runner(hf_model, family, tokens, beams, new_tokens, dtype, device)], repeats)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--prompt_length", type=int, default=0,
                        help="prompt (GPT-2) / encoder input (T5) tokens; 0: 64 for GPT-2, "
                             "256 for T5")
    parser.add_argument("--torch_threads", type=int, default=0,
                        help="PyTorch CPU threads; 0: one per core")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="compute dtype; parameters stay float32")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models and sizes, two rows: a check that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.new_tokens, args.prompt_length, args.repeats = 2, 4, 8, 1
        if args.rows == ",".join(ROWS):
            args.rows = ",".join(SMOKE_ROWS)
    rows = args.rows.split(",")
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown --rows {unknown}; choose from {sorted(ROWS)}")

    import torch
    on_gpu = jax.default_backend() == "gpu"
    device = "cuda" if on_gpu else "cpu"
    if on_gpu:
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default precision on GPU
    else:
        torch.set_num_threads(args.torch_threads or os.cpu_count() or 1)
    torch_on = (f"on {torch.cuda.get_device_name()}" if on_gpu
                else f"threads {torch.get_num_threads()}")
    print(f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores, {args.dtype}; torch "
          f"{torch_on}; median of {args.repeats} alternating calls after 1 warm-up\n")
    header = (f"{'model':<14} {'decoding':<8} {'batch':>5} {'prompt':>6} {'new':>4} "
              f"{'t5x_like tok/s':>15} {'HF tok/s':>9} {'ratio':>6} {'same tokens':>11}")
    print(header)
    print("-" * len(header))

    loaded = {}  # config name -> (model config, params, HF model), shared by its two rows
    for row in rows:
        config_name, beams = ROWS[row]
        if config_name not in loaded:
            loaded.clear()  # one model pair in memory at a time
            model_config = load_model_config(config_name, args.dtype, args.smoke)
            params = init_params(structures.build_model(model_config))
            loaded[config_name] = (model_config, params,
                                   hf_model_with_same_weights(config_name,
                                                              export_config(model_config),
                                                              params, device))
        model_config, params, hf_model = loaded[config_name]
        family = model_config["family"]
        length = args.prompt_length or DEFAULT_PROMPT_LENGTH[config_name]
        rng = np.random.default_rng(0)
        tokens = rng.integers(5, model_config.vocab_size,
                              size=(args.batch, length)).astype(np.int32)

        (our_seconds, our_tokens), (hf_seconds, hf_tokens) = time_alternating(
            [our_runner(model_config, params, tokens, beams, args.new_tokens),
             their_runner(hf_model, family, tokens, beams, args.new_tokens, args.dtype, device)],
            args.repeats)
        for name, out in (("t5x_like", our_tokens), ("transformers", hf_tokens)):
            if out.shape != (args.batch, args.new_tokens):
                raise RuntimeError(f"{row}: {name} returned {out.shape}, expected "
                                   f"{(args.batch, args.new_tokens)} new tokens")
        same = float(np.mean(np.all(our_tokens == hf_tokens, axis=1)))
        generated = args.batch * args.new_tokens
        print(f"{config_name:<14} {'greedy' if beams == 1 else f'beam {beams}':<8} "
              f"{args.batch:>5} {length:>6} {args.new_tokens:>4} "
              f"{generated / our_seconds:>15,.1f} {generated / hf_seconds:>9,.1f} "
              f"{hf_seconds / our_seconds:>6.2f} {same:>11.0%}", flush=True)


if __name__ == "__main__":
    main()
