"""Launchers for real clusters: Cloud TPU VMs (gcloud queued resources), GKE (xpk) and
SLURM GPU clusters.

Every launcher builds its commands as argv lists first (``commands.Command``), so
``--dry_run`` can print exactly what would run, each value quoted with ``shlex``, and
the tests can compare those commands with golden files. Nothing here imports JAX: the
launcher runs on a workstation, the training runs on the workers.

    python -m launch tpu create --name=t5 --zone=us-west4-a --accelerator_type=v5litepod-16
    python -m launch gke run --cluster=c --workload=t5 --tpu_type=v5p-64 ...
    python -m launch slurm --nodes=2 --gpus_per_node=8 ...

See docs/launching.md.
"""
