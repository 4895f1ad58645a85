"""t5x_like: pretrain encoders, encoder-decoders and decoders with JAX/Flax.

The picture of the package is ``DESIGN.md``'s data flow: data -> model +
objective -> partitioner -> trainer -> evaluation. Start at ``t5x_like.train``.
"""

__version__ = "0.1.0"
