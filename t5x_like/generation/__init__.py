"""Generation by continuous batching over a paged key/value cache (``engine``), its page
allocator (``pages``) and per-row sampling (``sampling``): what ``t5xl serve`` decodes
with."""
