"""FLOPs of one encoder-decoder decoding step with and without the cross-attention cache.

    python benchmarks/decode_step_flops.py                       # t5_1_1_xl, batch 8
    python benchmarks/decode_step_flops.py --config=t5_1_1_small --batch=32
    python benchmarks/decode_step_flops.py --smoke   # tiny: a check that it runs

Without the cache every step projects the whole encoder output into every decoder
layer's cross-attention keys and values again (``cached_cross=False``, what each step
did before the cache existed); with it (``decoding.fill_cross_cache``) they are
projected once per decode and each step reads them. The step is compiled on this CPU
from the config's shapes (no weights are made) with the layers unrolled, so XLA's
FLOP count covers every layer (a scanned body is counted once); the number of FLOPs
does not depend on the device.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def step_flops(config_name: str, batch: int, cached: bool, smoke: bool = False) -> float:
    import jax
    import jax.numpy as jnp
    import ml_collections

    from t5x_like import config_lib, structures
    from t5x_like.models import decoding
    config = config_lib.load_config_file(str(ROOT / "configs" / f"{config_name}.py"))
    if smoke:  # a 1-layer, 32-wide model of the config's family, 16 inputs, 8 targets
        import _smoke
        _smoke.tiny_model(config.model)
        config.task_feature_lengths = {"inputs": 16, "targets": 8}
    model_config = ml_collections.ConfigDict(dict(config.model.to_dict(), scan_layers=False,
                                                  remat_policy="none"))
    model = structures.build_model(model_config)
    encoder_length = config.task_feature_lengths["inputs"]
    decode_length = config.task_feature_lengths["targets"]
    encoder = jax.ShapeDtypeStruct((batch, encoder_length), jnp.int32)
    params = jax.eval_shape(lambda: model.init(
        jax.random.key(0), jnp.ones((batch, encoder_length), jnp.int32),
        jnp.ones((batch, 1), jnp.int32), jnp.ones((batch, 1), jnp.int32))["params"])
    cache = jax.eval_shape(lambda: decoding.init_cache(model, batch, encoder_length,
                                                       decode_length))
    encoded = jax.ShapeDtypeStruct((batch, encoder_length, model_config.d_model),
                                   model.config.compute_dtype)
    token = jax.ShapeDtypeStruct((batch, 1), jnp.int32)

    def step(p, c, e, tokens, t):
        return model.apply({"params": p, "cache": c}, e, tokens, t, decode_length,
                           cached_cross=cached, method=model.decode, mutable=["cache"])
    compiled = jax.jit(step).lower(params, cache, encoded, encoder, token).compile()
    return float(compiled.cost_analysis()["flops"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="t5_1_1_xl")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--smoke", action="store_true",
                        help="the config's model at 1 layer, 32 wide, batch 2: a check that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch = 2
    before = step_flops(args.config, args.batch, cached=False, smoke=args.smoke)
    after = step_flops(args.config, args.batch, cached=True, smoke=args.smoke)
    print(f"| config | batch | step FLOPs, projecting the encoder output | step FLOPs, cross "
          f"cache | ratio |\n| --- | --- | --- | --- | --- |\n| {args.config} | {args.batch} "
          f"| {before:.4g} | {after:.4g} | {before / after:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
