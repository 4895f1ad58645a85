"""Services: planning a run before it launches. ``aot_planner`` compiles the train step (or a
decode step) for a topology ahead of time, on any machine (libtpu's compiler for TPU
plans), and reads the compiled program: ``hlo_traffic`` (HBM bytes), ``hlo_matmuls``
(FLOPs by operand type) and ``hlo_collectives`` (bytes each collective sends, by mesh axis).
The ``plan`` command and ``scaling plan`` print what it finds. ``topology`` is the JAX-free
part those commands need before their config is read (the ``--topology`` text, libtpu's
environment).
"""
