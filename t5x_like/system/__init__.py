"""Leaves: what a run meets of the system it runs on, with no JAX model code and nothing of
the run spec: which JAX backends start (``platforms``, decided before JAX is imported),
the platform a program is traced for (``traced_platform``), each chip's published peak
rates and memory (``hardware``), paths that may live in object storage (``storage``) and
progress lines on a terminal or a log (``progress``).

Imports nothing at package level: ``launch/`` reads ``platforms`` with the standard
library alone.
"""
