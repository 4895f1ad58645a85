"""Engine: the jitted steps and what they run on. ``trainer`` (the train state, its
shardings, the jitted train and eval steps), ``partitioning`` (the one place that decides
sharding: meshes, logical-axis rules, shardings of state and batches, multi-process
start-up), ``optim`` (optimizers, schedules, clipping, accumulation, frozen masks) and
``flops`` (a model's FLOPs per token, counted from its config).
"""
