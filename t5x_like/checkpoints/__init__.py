"""Engine: checkpoints written and read back. ``checkpoint_store`` (orbax checkpoints of the
train state, the data iterators' state and the config: manifests, fallback restore, guarded
rotation, the local-first tier), ``checkpoint_per_host`` (a multi-process run's local tier:
each host its own shards), ``param_sources`` (where params come from: a run, a step, a
pretrained folder; one ``load_params``; what PEFT checkpoints hold), ``int8_weights``
(int8 kernels saved beside a checkpoint for eval, infer and the harness), ``run_commands``
(the commands that launched a run, kept in its workdir), ``pretrained``
(the params-only folder conversion writes and fine-tuning starts from) and ``hf_io``
(Hugging Face folders: ``config.json`` and safetensors, read and written).
"""
