"""Resolve first: every config mistake is found while the run resolves, before the
workdir lock, before any checkpoint is restored and before anything compiles. A matrix
of bad settings (one per check, across train, eval, infer, distillation, PEFT and the
evaluators) runs against a workdir holding a checkpoint; each must exit 2 with one
line naming the key, leave no lock, restore nothing, compile nothing and change
nothing in the workdir."""

import pathlib
import shutil

import jax
import pytest

from t5x_like import eval as eval_cli
from t5x_like import infer, peft, train
from t5x_like.checkpoints import checkpoint_store, param_sources, pretrained

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "before_spec"

# The fixture run (tests/fixtures/before_spec/t5_run, saved at step 2 on 8 devices), as
# a config file in today's spelling: it resumes (the positive control below).
CONFIG = '''
from t5x_like import config_lib


def get_config():
    c = config_lib.default_config()
    c.task_feature_lengths = {"inputs": 32, "targets": 8}
    c.model.update(dict(d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1,
                        num_decoder_layers=1, positions=dict(num_buckets=16)))
    c.evals.benchmark = dict(kind="benchmark", mixture="embedded_austen_cloze",
                             max_examples=4, every_steps=2)
    c.num_train_steps = 4
    c.batch_size = 8
    c.logging.every_steps = 1
    c.checkpoint.update(every_steps=2, keep=1)
    c.evals.held_out.update(every_steps=2, batches=1)
    c.optimizer.warmup_steps = 1
    return c
'''
OTHER_MODEL = CONFIG.replace("d_model=16", "d_model=24")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resolve_first")
    workdir = root / "run"
    shutil.copytree(FIXTURES / "t5_run", workdir)
    (root / "config.py").write_text(CONFIG)
    (root / "other.py").write_text(OTHER_MODEL)
    (root / "a_file").write_text("not a folder")
    return root


def _snapshot(folder: pathlib.Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")}


@pytest.fixture
def guarded(setup, monkeypatch):
    """Restoring any array fails the test (reading a checkpoint's saved config is part of
    resolving); XLA compiles are counted (tracing shapes is not compiling)."""
    def refuse(*args, **kwargs):
        raise AssertionError("arrays were restored before the config was resolved")
    for name in ("restore", "restore_newest"):
        monkeypatch.setattr(checkpoint_store.Checkpointer, name, refuse)
    monkeypatch.setattr(param_sources.Source, "restore_params", refuse)
    monkeypatch.setattr(pretrained, "load_pretrained", refuse)
    compiles = []

    def listen(event, duration, **kwargs):
        if "backend_compile" in event:
            compiles.append(event)
    jax.monitoring.register_event_duration_secs_listener(listen)
    before = _snapshot(setup / "run")
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert not (setup / "run" / "train.lock").exists()
    assert _snapshot(setup / "run") == before


def _refused(capsys, code: int, fragment: str):
    out = capsys.readouterr()
    assert code == 2, out.err
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1, out.err
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in out.err


TRAIN = [
    # keys, types, enums, ranges
    ("no_such_key=1", "Unknown config key 'no_such_key'"),
    ("model.num_kv_heads=2", "model.family='encoder_decoder' has no such key"),
    ("batch_size=abc", "expected an integer"),
    ("optimizer.name=sgd", "'optimizer.name' is 'sgd'; choose one of"),
    ("num_train_steps=0", "'num_train_steps' must be a finite number >= 1, got 0"),
    ("optimizer.final_learning_rate_fraction=2", "is a fraction of the peak learning rate and must be in [0, 1]"),
    ("optimizer.name=schedule_free_adamw", "optimizer.schedule=constant"),
    ("loss.label_smoothing=1.0", "loss.label_smoothing=1.0 must be in [0, 1)"),
    ("loss.normalization=constant", "needs a positive loss.normalizing_constant"),
    ("checkpoint.keep_every_steps=3", "is not a multiple of checkpoint.every_steps=2"),
    ("checkpoint.local_dir=gs://bucket/x", "must be a local folder"),
    ("checkpoint.allow_resume_changes=nonsense", "names 'nonsense', which no resume checks"),
    ("divergence.loss_spike_factor=0.5", "would stop on ordinary noise"),
    ("resilience.hang_timeout_s=-5", "must be seconds (e.g. 1800), 0 (off) or -1"),
    ("task_feature_lengths.inputs=0", "task_feature_lengths.inputs must be a positive integer, got 0"),
    ("model.family=decoder", "model.family='decoder'"),
    ("model.experts.num_experts=2 model.experts.num_experts_per_token=3",
     "num_experts_per_token=3 must be in [1, num_experts=2]"),
    ("evals.held_out.batches=0", "'evals.held_out.batches' must be a finite number >= 1, got 0"),
    # the task, the vocabulary, the head, the family's capabilities
    ("task=no_such_task", "task: No task or mixture named 'no_such_task'"),
    ("vocabulary=checkpoint", "vocabulary='checkpoint'"),
    ("vocabulary=/no/such/tokenizer", "no such tokenizer folder or file"),
    ("head.kind=classification", "head.kind='classification' needs an encoder or decoder"),
    # devices and streams
    ("mesh.data=3", "needs 3 devices but 8 are available"),
    ("mesh.data=-1 mesh.fsdp=-1", "At most one mesh axis may be -1"),
    ("batch_size=12", "does not divide over the data-parallel mesh"),
    ("mesh.data=2 mesh.context=4", "does not split its rows over a context axis"),
    ("data.streams=3", "does not split into data.streams=3 equal parts"),
    # the workdir's checkpoint: streams and the run fingerprint
    ("data.streams=4", "saved with 8 input streams"),
    ("model.d_model=24", "different settings (model.d_model"),
    ("optimizer.name=adamw", "different settings (optimizer.name"),
    # checkpoint.local_dir that cannot be a folder (a 38-line traceback before)
    ("checkpoint.local_dir={root}/a_file", "is a file, not a folder"),
    # PEFT
    ("peft.lora.rank=4 peft.lora.targets=nomatch", "matches none of the model's"),
    ("peft.lora.targets=(bad", "is not a regular expression"),
    ("peft.bitfit=true", "peft.bitfit trains only bias terms"),
    ("peft.prompt.length=4 data.pack=true", "rows cannot be packed; set --config.data.pack=False"),
    # init_from and distillation
    ("init_from=/no/such/folder", "init_from='/no/such/folder' is not a pretrained folder"),
    ("init_from={fixtures}/decoder_run", "holds a different model"),
    ("distill.teacher=/no/such/teacher", "distill.teacher=/no/such/teacher: no such folder"),
    ("distill.teacher={fixtures}/bert_head_run", "the two must read the same batches"),
    ("distill.teacher={fixtures}/t5_run init_from={fixtures}/t5_run", "pick one"),
    # evaluators
    ("evals.benchmark.mixture=no_such_mixture", "evals.benchmark.mixture: No task or mixture named 'no_such_mixture'"),
    ("evals.extra.kind=nope", "evals.extra.kind='nope' is not an evaluator kind"),
    ("evals.lm.kind=harness evals.lm.tasks=lambada_openai", "evals.lm:"),
    ("evals.more.kind=benchmark evals.more.mixture=nope", "evals.more.mixture: No task"),
    ("eval.mixture=no_such_mixture", "evals.benchmark.mixture: No task or mixture named"),  # the old spelling
]


@pytest.mark.parametrize("overrides,fragment", TRAIN, ids=[t[0] for t in TRAIN])
def test_train_refuses_before_the_lock_restore_or_compile(setup, guarded, capsys, overrides,
                                                          fragment):
    given = overrides.format(root=setup, fixtures=FIXTURES).split()
    code = train.main([f"--config={setup / 'config.py'}", f"--workdir={setup / 'run'}",
                       "--quiet", *(f"--config.{o}" for o in given)])
    _refused(capsys, code, fragment)
    assert not guarded, guarded


def test_the_good_config_resolves_without_compiling(setup, guarded):
    """The positive control: the same config without a mistake resolves (its checkpoint's
    fingerprint and streams are this run's) and compiles nothing doing so."""
    from t5x_like import resolving
    from t5x_like.training import preflight
    resolved = preflight.resolve_training(resolving.load_config(str(setup / "config.py"), []),
                                             str(setup / "run"))
    assert resolved.resume is not None and resolved.resume.step == 2
    assert resolved.num_streams == 8
    assert not guarded, guarded


CHECKPOINT_COMMANDS = [
    (eval_cli.main, ["--task=no_such_task", "--output_dir={root}/e1"], "no_such_task"),
    (eval_cli.main, ["--task=embedded_spam", "--output_dir={root}/e2",
                     "--vocabulary=/no/such/tokenizer"], "--vocabulary=/no/such/tokenizer"),
    (eval_cli.main, ["--task=embedded_spam", "--output_dir={root}/e3",
                     "--config={root}/other.py"], "holds a different model"),
    (eval_cli.main, ["--task=embedded_spam", "--output_dir={root}/e4",
                     "--config.data.pack=maybe"], "expected true or false"),
    (infer.main, ["--input_file={root}/no_such_inputs.jsonl", "--output_file={root}/i1.jsonl"],
     "no_such_inputs"),
    (infer.main, ["--task=embedded_spam", "--output_file={root}/i2.jsonl",
                  "--config.no_such_key=1"], "Unknown config key 'no_such_key'"),
]


@pytest.mark.parametrize("command,flags,fragment", CHECKPOINT_COMMANDS,
                         ids=[f"{c.__module__}:{f[0]}" for c, f, _ in CHECKPOINT_COMMANDS])
def test_eval_and_infer_refuse_before_restore_or_compile(setup, guarded, capsys, command,
                                                         flags, fragment):
    code = command([f"--checkpoint={setup / 'run'}",
                    *(f.format(root=setup) for f in flags)])
    _refused(capsys, code, fragment)
    assert not guarded, guarded


def test_peft_merge_of_a_run_without_lora_is_refused_before_restore(setup, guarded, capsys):
    code = peft.main(["merge", f"--peft={setup / 'run'}", f"--out={setup / 'merged'}"])
    _refused(capsys, code, "has no LoRA to merge")
    assert not guarded, guarded
