"""Engine: where a run's numbers go. ``metrics_writer`` (``metrics.jsonl`` and the console),
``trackers`` (TensorBoard, W&B, MLflow) and ``goodput_events`` (``goodput.jsonl``: what the
wall time of every run of a workdir went to). Only process 0 writes.
"""
