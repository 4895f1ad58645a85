"""t5x_like: pretrain encoders, encoder-decoders and decoders with JAX/Flax.

The picture of the package is ``docs/architecture.md``'s data flow: data -> model +
objective -> partitioner -> trainer -> evaluation. Start at ``t5x_like.train``.
"""

from t5x_like.system import platforms as _platforms

__version__ = "0.1.0"

# Before JAX starts a backend: no libtpu start-up errors on machines without TPUs.
_platforms.keep_libtpu_off_machines_without_tpus()
# TPU compiles (a run's, a plan's) schedule collectives as MaxText's published runs do.
_platforms.use_tpu_compiler_flags()
