"""Generation for serving, rollouts and evaluation: continuous batching over a paged
key/value cache (``engine``), its page allocator (``pages``) and per-row sampling
(``sampling``)."""
