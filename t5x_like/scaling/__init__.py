"""Scaling laws: fitting how loss falls with parameters and tokens, and spending a compute
budget by the fitted law (``laws``: the parametric law and its compute-optimal split,
with published presets; ``fit``: Hoffmann et al.'s approaches 2 and 3 with bootstrap
intervals; ``cli``: ``python -m t5x_like.scaling fit|plan``)."""
