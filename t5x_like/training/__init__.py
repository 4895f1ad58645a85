"""Services: a training run from its config to its last step. ``preflight`` resolves the
run whole, every check done before the workdir is locked or anything compiles;
``starting_state`` says where the first step's state comes from (a resume, ``init_from``,
a teacher's layers, or fresh); ``loop`` runs the resolved run (batches, steps,
evaluators, logging, checkpoints, accounting). ``python -m t5x_like.train`` is the command.
"""
