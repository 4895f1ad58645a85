"""Config files, command-line overrides and validation, all before any compilation.

A config file is a Python module with ``get_config() -> ml_collections.ConfigDict``
that starts from :func:`default_config`. Every key a run may use exists there, so
a typo is an unknown key, caught here with a suggestion, not a silent default.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import math
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import ml_collections

from t5x_like.errors import ConfigError


def default_config() -> ml_collections.ConfigDict:
    """Every known key with its default; the schema that validation checks against."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_train_steps = 1000
    c.batch_size = 32                  # global, over all hosts and devices
    c.log_every_steps = 10
    c.checkpoint_every_steps = 200
    c.eval_every_steps = 200           # 0: no held-out evaluation while training
    c.eval_batches = 8                 # held-out batches per evaluation
    c.keep_checkpoints = 3             # the newest K checkpoints are kept...
    c.keep_checkpoints_every_steps = 0 # ...plus every M-th step for good (0: none)
    c.on_nonfinite_loss = "stop"       # stop | skip_update (NaN/Inf loss or gradient)
    # Divergence beyond NaN: stop like on_nonfinite_loss=stop (nothing saved after the
    # first bad step; checkpoints saved after it are moved aside).
    c.divergence = ml_collections.ConfigDict(dict(
        zero_grad_steps=3,             # gradient norm exactly 0 this many steps in a row; 0: off
        loss_spike_factor=0.0,         # loss above k x the running median; 0: off (e.g. 5.0)
        median_window=100,             # steps in that running median
    ))
    # Pod-scale resilience (docs/training_engine.md, "One writer per workdir, hangs and
    # start-up"). WORKDIR/train.lock names the running train; a lock without a heartbeat
    # for this long (or whose pid is gone on the same host) is taken over.
    c.lock_stale_after_s = 300.0
    # No train step, evaluation or checkpoint save finished for this long: every process
    # writes its threads' stacks to WORKDIR/hangs/ and the run exits 75. 0: off; -1: 1800
    # on TPU and GPU, off on CPU.
    c.hang_timeout_s = -1.0
    # jax.distributed start-up of a multi-process run: the processes that never arrived
    # are named, exit 2 (JAX's own timeout is 300 s).
    c.startup_timeout_s = 300.0
    # Local-first checkpoints: saves land in this local folder (a fast disk, as on TPU VMs)
    # and are copied to WORKDIR/checkpoints in the background; restores prefer a valid
    # local copy. "": save to the workdir directly. Single-process runs only for now.
    c.checkpoint = ml_collections.ConfigDict(dict(local_dir=""))
    # Fingerprint keys a resume may change (vocabulary, task, task_feature_lengths,
    # optimizer, model, head, or a sub-key like model.dropout_rate); others are refused.
    c.allow_resume_changes = ()
    c.init_from = ""                   # params-only pretrained folder to fine-tune from
    c.peak_flops_per_device = 0.0      # for MFU; 0 looks the device kind up in a table

    c.task = "embedded_en_span_corruption"
    # "": the task's own vocabulary. "checkpoint": the tokenizer init_from carries (an
    # imported GPT-2's BPE); or a tokenizer folder / tokenizer.json / .model path. Every
    # text feature of the task is then tokenized with it (copied into WORKDIR/tokenizer).
    c.vocabulary = ""
    c.task_feature_lengths = ml_collections.ConfigDict({"inputs": 512, "targets": 114})
    c.pack = False                     # pack several examples per row (segment ids, positions)
    # Input streams V the global batch is drawn from: stream v reads shard v of V of the data
    # and fills B/V rows of each batch; each process runs V/P of them. Batches depend on V, not
    # on the process count. 0: the checkpoint's count when resuming; for a new run 8 streams
    # (or the largest count up to 8 dividing batch_size) when the process count divides that,
    # so 1, 2, 4 or 8 processes see the same batches; else one stream per process.
    c.data_streams = 0

    # Every key of the family's model dataclass, at these values (a small T5 v1.1).
    c.model = model_defaults("encoder_decoder")
    c.model.update(dict(vocab_size=8192, d_model=512, num_heads=6, head_dim=64, d_ff=1024,
                        num_encoder_layers=8, num_decoder_layers=8))

    c.optimizer = ml_collections.ConfigDict(dict(
        name="adafactor",              # adafactor | adamw | muon | schedule_free_adamw
        learning_rate=1e-2,
        schedule="rsqrt",              # constant | rsqrt | linear | cosine | wsd
        warmup_steps=100,
        final_learning_rate_fraction=0.0,  # linear, cosine and wsd decay end at this x the peak
        decay_fraction=0.1,            # wsd: the last fraction of steps after warmup decays
        muon_momentum=0.95,            # muon: Nesterov momentum of the orthogonalised matrices
        weight_decay=0.0,
        grad_clip_norm=0.0,            # 0 disables global-norm clipping
        b1=0.9,
        b2=0.999,
        microbatches=1,                # gradient accumulation: slices of each batch
    ))
    c.loss = ml_collections.ConfigDict(dict(
        z_loss=1e-4,
        label_smoothing=0.0,
        normalization="tokens",        # tokens (real target tokens) | constant
        normalizing_constant=0.0,      # the divisor when normalization="constant"
    ))

    # Decoders given inputs and targets train as a prefix LM: "bidirectional" (seqio's prefix
    # LM: the prefix attends both ways) or "causal" (GPT fine-tuning, lm-evaluation-harness).
    c.prefix_attention = "bidirectional"
    # Benchmark evaluation inside train (the evaluator of python -m t5x_like.eval).
    c.eval = ml_collections.ConfigDict(dict(
        mixture="",                    # a task or mixture with metrics; "" = none
        every_steps=0,                 # 0: at eval_every_steps
        max_examples=0,                # per task; 0 = the whole split
        split="validation",
        batch_size=0,                  # 0: batch_size
        max_decode_length=0,           # 0: task_feature_lengths.targets
        # lm-evaluation-harness tasks run on the training params at the same steps as the
        # mixture (decoders; the lm_eval extra): comma-separated task, group or tag names
        # of its catalogue or of the YAML files under harness_include_path.
        harness_tasks="",
        harness_include_path="",
        harness_num_fewshot=-1,        # -1: each task's own
        harness_limit=0,               # examples per task; 0 = all
        harness_max_gen_toks=256,      # new tokens for generation tasks without their own
    ))
    _add_fine_tuning_sections(c)

    # Device mesh; -1 takes the remaining devices. Axis rules name the sharding strategy.
    # dcn: data parallelism across TPU slices (multi-slice); 0 = the number of slices
    # the devices span, which is 1 off multi-slice TPU, so one config runs anywhere.
    c.mesh = ml_collections.ConfigDict(dict(dcn=0, data=-1, fsdp=1, expert=1, tensor=1))
    c.partitioning = ml_collections.ConfigDict(dict(rules="fsdp"))
    return c


def _add_fine_tuning_sections(c: ml_collections.ConfigDict) -> None:
    """``head``, ``peft`` and ``distill``: what fine-tuning adds to a pretraining config."""
    # Fine-tuning with a task head (models.heads) on an encoder or decoder body instead of
    # its pretraining objective: the body loads from init_from, the head starts fresh.
    c.head = ml_collections.ConfigDict(dict(
        kind="",                       # "" (none) | classification | regression |
                                       # token_classification | span_extraction
        pooling="cls",                 # classification: cls | last | mean
        dropout_rate=0.1,
        labels=(),                     # label names; () = from the task (resolved at start)
        max_answer_length=30,          # span_extraction: longest predicted answer, in tokens
    ))

    # Parameter-efficient tuning (models/peft.py): new small parameters or a chosen subset
    # train, the rest stay frozen with no optimizer state. With init_from, checkpoints
    # hold only what trains plus the base's identity (path, step, digest).
    c.peft = ml_collections.ConfigDict(dict(
        bitfit=False,                  # only bias terms (and a head) train (Ben Zaken et al.)
        lora=dict(                     # low-rank updates W + (alpha/rank) A B (Hu et al.)
            rank=0,                    # 0: off; 8 is the usual start
            alpha=8.0,
            dropout=0.0,               # on the LoRA branch's input, while training
            targets=r"(^|/)(query|value)/kernel$",  # regex over kernel paths (summary lists them)
        ),
        adapter=dict(                  # bottleneck adapters (Houlsby et al.)
            size=0,                    # 0: off; the bottleneck width, e.g. 64
            activation="gelu",
            placement="houlsby",       # houlsby: after attention and MLP | pfeiffer: MLP only
        ),
        prefix=dict(                   # learned keys/values in every attention (Li & Liang)
            length=0,                  # 0: off; prefix positions per attention block, e.g. 10
            reparameterize=False,      # through a per-layer MLP over a learned table
            hidden=512,                # that MLP's width
        ),
        prompt=dict(                   # soft prompt before the encoder's input (Lester et al.)
            length=0,                  # 0: off; prompt embeddings, e.g. 20 (BERT, T5 encoders)
        ),
    ))

    # Knowledge distillation (distill.py): a frozen teacher inside the train step.
    c.distill = ml_collections.ConfigDict(dict(
        teacher="",                    # pretrained folder or run of the same vocabulary; "": off
        temperature=2.0,               # T of the softened distributions
        soft_weight=5.0,               # T^2 KL(teacher || student) (Sanh et al.: 5)
        hard_weight=2.0,               # the student's own MLM / LM loss (2)
        cosine_weight=1.0,             # 1 - cos of the final hidden states (1; same width)
        student_init="teacher_layers",  # teacher_layers (evenly spaced, DistilBERT) | fresh
    ))


def model_defaults(family: str) -> ml_collections.ConfigDict:
    """The ``model`` section for ``family`` with every key at its default.

    Decoder configs start with ``config.model = config_lib.model_defaults("decoder")``.
    """
    from t5x_like import models  # deferred: imports flax
    try:
        fields = models.family_config_fields(family)
    except ValueError as e:
        raise ConfigError(f"model.family: {e}") from None
    return ml_collections.ConfigDict({"family": family, **fields})


def t5_pretraining_config() -> ml_collections.ConfigDict:
    """T5's pretraining recipe: C4-style span corruption at 512/114, batch 128,
    Adafactor at 1e-2 with 10k warmup steps then 1/sqrt(step), 2^19 steps.
    Size configs in ``configs/`` start here and set the model dimensions."""
    c = default_config()
    c.task_feature_lengths = {"inputs": 512, "targets": 114}
    c.batch_size = 128
    c.num_train_steps = 2**19
    c.log_every_steps = 100
    c.eval_every_steps = 5000
    c.checkpoint_every_steps = 5000
    c.model.vocab_size = 32128  # T5's SentencePiece (32000) + 100 sentinels, padded to 128
    c.optimizer.name = "adafactor"
    c.optimizer.learning_rate = 1e-2
    c.optimizer.schedule = "rsqrt"
    c.optimizer.warmup_steps = 10_000
    return c


ENUMS = {
    "optimizer.name": ("adafactor", "adamw", "muon", "schedule_free_adamw"),
    "optimizer.schedule": ("constant", "rsqrt", "linear", "cosine", "wsd"),
    "partitioning.rules": ("data_parallel", "fsdp", "fsdp_tensor"),
    "model.dtype": ("float32", "bfloat16"),
    "model.remat_policy": ("none", "full", "dots", "dots_no_batch"),
    "model.attention_impl": ("auto", "xla", "flash", "chunked"),
    "model.norm": ("layernorm", "rmsnorm"),
    "model.position_embedding": ("learned", "rotary"),
    "loss.normalization": ("tokens", "constant"),
    "on_nonfinite_loss": ("stop", "skip_update"),
    "prefix_attention": ("bidirectional", "causal"),
    "head.kind": ("", "classification", "regression", "token_classification",
                  "span_extraction"),
    "head.pooling": ("cls", "last", "mean"),
    "peft.adapter.placement": ("houlsby", "pfeiffer"),
    "peft.adapter.activation": ("gelu", "gelu_exact", "relu", "silu"),
    "distill.student_init": ("teacher_layers", "fresh"),
}
POSITIVE_INTS = ("num_train_steps", "batch_size", "log_every_steps", "checkpoint_every_steps",
                 "eval_batches", "keep_checkpoints", "optimizer.microbatches")


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """``path`` or ``path:ARG`` (ml_collections' convention: ``get_config(ARG)``)."""
    argument = None
    if not pathlib.Path(path).is_file() and ":" in path:
        head, argument = path.rsplit(":", 1)
        if pathlib.Path(head).is_file():
            path = head
        else:
            argument = None
    file = pathlib.Path(path)
    if not file.is_file():
        raise ConfigError(f"Config file {path!r} does not exist. Pass --config=configs/quickstart.py "
                          "or another file in configs/.")
    spec = importlib.util.spec_from_file_location(f"_t5x_like_config_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"Config file {path!r} has a syntax error at line {e.lineno}: {e.msg}"
                          f"{': ' + e.text.strip() if e.text else ''}. Fix the file.") from None
    except ImportError as e:
        raise ConfigError(f"Config file {path!r} imports what is not installed or not "
                          f"importable ({e}).") from None
    except Exception as e:  # noqa: BLE001 - any error running the user's file is theirs
        raise ConfigError(f"Running config file {path!r} raised {type(e).__name__}: {e} "
                          f"(line {_user_line(e, file)}). Fix the file.") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"Config file {path!r} has no get_config() function; define one that "
                          "returns an ml_collections.ConfigDict.")
    if argument is not None and not inspect.signature(module.get_config).parameters:
        raise ConfigError(f"Config file {path!r} takes no argument, but --config gave it "
                          f"{argument!r}; drop ':{argument}'.")
    try:
        config = module.get_config() if argument is None else module.get_config(argument)
    except TypeError as e:
        # ConfigDict refuses to change a field's type, e.g. an int key set to a string.
        raise ConfigError(f"In {path}: {e}. Use a value of the key's type "
                          "(see t5x_like.config_lib.default_config).") from None
    except (AttributeError, KeyError) as e:
        # A key the defaults lack (ConfigDict raises AttributeError on a locked dict).
        raise ConfigError(f"In {path}, get_config() (line {_user_line(e, file)}): {e}. Use only "
                          "keys of t5x_like.config_lib.default_config().") from None
    except ValueError as e:  # the file's own refusal of its argument (an unknown preset)
        raise ConfigError(f"{path}:{argument}: {e}.") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config() in {path!r} returned {type(config).__name__}; return "
                          "an ml_collections.ConfigDict built from config_lib.default_config().")
    return config


def _user_line(error: BaseException, file: pathlib.Path) -> int | str:
    """The line of the user's config file the error was raised under."""
    import traceback
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if pathlib.Path(f.filename).resolve() == file.resolve()]
    return frames[-1].lineno if frames else "?"


def _suggest(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _unknown_key(path: str, parent: ml_collections.ConfigDict | dict, context: str) -> ConfigError:
    prefix, _, leaf = path.rpartition(".")
    siblings = [f"{prefix}.{k}" if prefix else k for k in parent.keys()]
    return ConfigError(
        f"Unknown config key {path!r}{context}.{_suggest(path, siblings)} "
        f"Known keys{' under ' + repr(prefix) if prefix else ''}: {', '.join(sorted(siblings))}.")


def parse_value(text: str, current: Any, key: str) -> Any:
    """Command-line text -> a value of the same type as ``current``."""
    if isinstance(current, bool):
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"--config.{key}={text}: expected true or false.")
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--config.{key}={text}: expected an integer, e.g. "
                              f"--config.{key}={current}.") from None
    if isinstance(current, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--config.{key}={text}: expected a number, e.g. "
                              f"--config.{key}={current}.") from None
    if isinstance(current, str):
        return text
    if isinstance(current, (tuple, list)):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = tuple(part.strip() for part in text.split(",") if part.strip())
        if isinstance(value, str):
            value = (value,)
        return type(current)(value)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(other flags, config overrides)``: ``--config.KEY=VALUE`` become ``KEY=VALUE``
    (the override syntax of train, eval and infer)."""
    overrides = [a[len("--config."):] for a in argv if a.startswith("--config.")]
    return [a for a in argv if not a.startswith("--config.")], overrides


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
    """Applies ``key.path=value`` strings (from ``--config.key.path=value``) in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--config.{item} needs a value: --config.{item}=VALUE.")
        path, text = item.split("=", 1)
        node = config
        parts = path.split(".")
        for depth, part in enumerate(parts):
            sub_path = ".".join(parts[: depth + 1])
            if part not in node:
                raise _unknown_key(sub_path, node, f" (from --config.{item})")
            if depth < len(parts) - 1:
                node = node[part]
                if not isinstance(node, ml_collections.ConfigDict):
                    raise ConfigError(f"--config.{item}: {sub_path!r} is a value, not a section.")
        leaf = parts[-1]
        if isinstance(node[leaf], ml_collections.ConfigDict):
            raise ConfigError(f"--config.{item}: {path!r} is a section; set one of its keys, "
                              f"e.g. --config.{path}.{next(iter(node[leaf].keys()))}=...")
        with node.unlocked():
            node[leaf] = parse_value(text, node[leaf], path)


def _type_ok(value: Any, expected: Any) -> bool:
    if isinstance(expected, bool):
        return isinstance(value, bool)
    if isinstance(expected, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(expected, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(expected, (tuple, list)):
        return isinstance(value, (tuple, list))
    if expected is None:
        return True
    return isinstance(value, type(expected))


def _check_against_schema(config, schema, prefix: str = "", context: str = " in the config") \
        -> None:
    for key in config.keys():
        path = f"{prefix}{key}"
        if key not in schema:
            raise _unknown_key(path, schema, context)
        value, expected = config[key], schema[key]
        if isinstance(expected, ml_collections.ConfigDict):
            if not isinstance(value, (ml_collections.ConfigDict, dict)):
                raise ConfigError(f"Config key {path!r} must be a section (ConfigDict), got "
                                  f"{type(value).__name__}.")
            if key == "task_feature_lengths":
                continue  # feature names depend on the task
            sub_context = context
            if key == "model" and not prefix:
                family = value.get("family", "encoder_decoder")
                expected = model_defaults(family)
                from t5x_like import structures
                example = structures.EXAMPLE_CONFIGS.get(family)
                sub_context = (
                    f": model.family={family!r} has no such key. The model section holds "
                    "another family's keys; if you changed model.family on the command line, "
                    "start from a config written for that family instead"
                    + (f" (e.g. --config={example})" if example else ""))
            _check_against_schema(value, expected, path + ".", sub_context)
        elif not _type_ok(value, expected):
            raise ConfigError(f"Config key {path!r} must be {type(expected).__name__} (like "
                              f"{expected!r}), got {type(value).__name__} {value!r}.")


_ABSENT = object()


def _lookup(config, path: str):
    """The value at ``path``, or ``_ABSENT`` where this config has no such key (model keys
    exist only for the families that have them)."""
    node = config
    for part in path.split("."):
        if part not in node:
            return _ABSENT
        node = node[part]
    return node


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks that need no devices: keys, types, ranges, enum values, lengths."""
    _check_against_schema(config, default_config())
    for key in POSITIVE_INTS:
        if _lookup(config, key) <= 0:
            raise ConfigError(f"Config key {key!r} must be positive, got {_lookup(config, key)}.")
    if config.vocabulary == "checkpoint" and not config.init_from:
        raise ConfigError("vocabulary='checkpoint' takes the tokenizer of the checkpoint the run "
                          "starts from, and init_from is empty; set --config.init_from=FOLDER or "
                          "give the tokenizer's path.")
    if config.eval_every_steps < 0:
        raise ConfigError(f"eval_every_steps={config.eval_every_steps}; use a positive interval "
                          "or 0 (no held-out evaluation during training).")
    if config.keep_checkpoints_every_steps < 0:
        raise ConfigError(f"keep_checkpoints_every_steps={config.keep_checkpoints_every_steps}: "
                          "use 0 (keep only the newest keep_checkpoints) or a positive period.")
    if config.keep_checkpoints_every_steps % config.checkpoint_every_steps:
        raise ConfigError(
            f"keep_checkpoints_every_steps={config.keep_checkpoints_every_steps} is not a multiple "
            f"of checkpoint_every_steps={config.checkpoint_every_steps}, so no saved step would be "
            "kept; use a multiple of checkpoint_every_steps.")
    if not 0.0 <= config.loss.label_smoothing < 1.0:
        raise ConfigError(f"loss.label_smoothing={config.loss.label_smoothing} must be in [0, 1), "
                          "e.g. 0.1.")
    if config.loss.normalization == "constant" and config.loss.normalizing_constant <= 0:
        raise ConfigError("loss.normalization='constant' needs a positive "
                          "loss.normalizing_constant, e.g. batch_size * target length "
                          f"(got {config.loss.normalizing_constant}).")
    if config.data_streams < 0:
        raise ConfigError(f"data_streams={config.data_streams} must be >= 0 (0: chosen from the "
                          "batch and the processes), e.g. --config.data_streams=8.")
    if config.data_streams and config.batch_size % config.data_streams:
        raise ConfigError(
            f"batch_size={config.batch_size} does not split into data_streams="
            f"{config.data_streams} equal parts; use a batch_size that is a multiple of "
            f"{config.data_streams} or a data_streams that divides {config.batch_size}.")
    for key in ("eval.every_steps", "eval.max_examples", "eval.batch_size",
                "eval.max_decode_length", "eval.harness_limit", "eval.harness_max_gen_toks"):
        if _lookup(config, key) is not _ABSENT and _lookup(config, key) < 0:
            raise ConfigError(f"Config key {key!r} must be >= 0 (0 picks the default), got "
                              f"{_lookup(config, key)}.")
    if config.peak_flops_per_device < 0:
        raise ConfigError(f"peak_flops_per_device={config.peak_flops_per_device} must be >= 0 "
                          "(0 looks the device up in t5x_like.flops.PEAK_FLOPS).")
    for path, allowed in ENUMS.items():
        value = _lookup(config, path)
        if value is not _ABSENT and value not in allowed:
            raise ConfigError(f"Config key {path!r} is {value!r}; choose one of {allowed}."
                              f"{_suggest(str(value), allowed)}")
    # Each structure's own part (encoder-decoders take no task head, ELECTRA's and the
    # biLM's keys, ...): imports the models, so after the cheap checks above.
    from t5x_like import structures
    structures.validate_config(config)
    _validate_head(config)
    _validate_optimizer_numbers(config)
    _validate_divergence(config)
    _validate_resilience(config)
    _validate_peft(config)
    _validate_distill(config)
    for name in config.allow_resume_changes:
        if not any(name == k or name.startswith(k + ".") for k in RESUME_CHANGE_KEYS):
            raise ConfigError(
                f"allow_resume_changes names {name!r}, which no resume checks; use some of "
                f"{', '.join(RESUME_CHANGE_KEYS)} (or a sub-key such as model.dropout_rate)."
                f"{_suggest(name, RESUME_CHANGE_KEYS)}")
    for name, length in config.task_feature_lengths.items():
        if not isinstance(length, int) or length <= 0:
            raise ConfigError(f"task_feature_lengths.{name} must be a positive integer, got {length!r}.")
    for name, size in config.mesh.items():
        if name == "dcn":
            if not isinstance(size, int) or size < 0:
                raise ConfigError(f"mesh.dcn must be the number of slices, or 0 for the slices "
                                  f"the devices span, got {size!r}.")
        elif not isinstance(size, int) or (size < 1 and size != -1):
            raise ConfigError(f"mesh.{name} must be a positive integer or -1 (fill), got {size!r}.")
    if list(config.mesh.values()).count(-1) > 1:
        raise ConfigError("At most one mesh axis may be -1 (fill with the remaining devices); "
                          f"got mesh={dict(config.mesh)}.")


RESUME_CHANGE_KEYS = ("vocabulary", "task", "task_feature_lengths", "optimizer", "model", "head",
                      "peft")


def _finite_at_least(config, key: str, low: float, example: str) -> None:
    value = _lookup(config, key)
    if value is _ABSENT:
        return
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low):
        raise ConfigError(f"{key}={value} must be a finite number >= {low:g}, e.g. "
                          f"--config.{key}={example}.")


def _validate_optimizer_numbers(config) -> None:
    """Numbers that would train nothing or diverge at once, refused before any compile."""
    _finite_at_least(config, "optimizer.learning_rate", 0.0, "1e-3")
    _finite_at_least(config, "optimizer.weight_decay", 0.0, "0.01")
    _finite_at_least(config, "optimizer.grad_clip_norm", 0.0, "1.0")
    _finite_at_least(config, "optimizer.warmup_steps", 0, "1000")
    _finite_at_least(config, "loss.z_loss", 0.0, "1e-4")
    fraction = _lookup(config, "optimizer.final_learning_rate_fraction")
    if fraction is not _ABSENT and not (isinstance(fraction, (int, float))
                                        and math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise ConfigError(f"optimizer.final_learning_rate_fraction={fraction} is a fraction of "
                          "the peak learning rate and must be in [0, 1], e.g. "
                          "--config.optimizer.final_learning_rate_fraction=0.1.")
    decay = _lookup(config, "optimizer.decay_fraction")
    if decay is not _ABSENT and not (isinstance(decay, (int, float)) and math.isfinite(decay)
                                     and 0.0 < decay <= 1.0):
        raise ConfigError(f"optimizer.decay_fraction={decay} is the fraction of the steps after "
                          "warmup that WSD decays over and must be in (0, 1], e.g. "
                          "--config.optimizer.decay_fraction=0.2.")
    if config.optimizer.name == "schedule_free_adamw" and config.optimizer.schedule != "constant":
        raise ConfigError(f"optimizer.name=schedule_free_adamw replaces the learning-rate decay; "
                          f"its schedule is warmup then constant, not "
                          f"{config.optimizer.schedule!r}: set --config.optimizer.schedule=constant.")
    for key, example in (("optimizer.b1", 0.9), ("optimizer.b2", 0.999),
                         ("optimizer.muon_momentum", 0.95)):
        value = _lookup(config, key)
        if value is not _ABSENT and not (math.isfinite(value) and 0.0 <= value < 1.0):
            raise ConfigError(f"{key}={value} is a decay rate and must be in [0, 1), e.g. "
                              f"--config.{key}={example}.")


def _validate_resilience(config) -> None:
    for key, example in (("lock_stale_after_s", "300"), ("startup_timeout_s", "600")):
        value = _lookup(config, key)
        if value is not _ABSENT and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{key}={value} must be a positive number of seconds, e.g. "
                              f"--config.{key}={example}.")
    local_dir = _lookup(config, "checkpoint.local_dir")
    if local_dir is not _ABSENT and local_dir.startswith(("gs://", "s3://")):
        raise ConfigError(f"checkpoint.local_dir={local_dir!r} must be a local folder (a fast "
                          "disk); the workdir is where checkpoints go to a bucket.")
    value = _lookup(config, "hang_timeout_s")
    if value is not _ABSENT and not (math.isfinite(value) and (value >= 0 or value == -1)):
        raise ConfigError(f"hang_timeout_s={value} must be seconds (e.g. 1800), 0 (off) or -1 "
                          "(1800 on TPU and GPU, off on CPU).")


def _validate_divergence(config) -> None:
    _finite_at_least(config, "divergence.zero_grad_steps", 0, "3")
    _finite_at_least(config, "divergence.loss_spike_factor", 0.0, "5.0")
    factor = config.divergence.loss_spike_factor
    if 0 < factor <= 1:
        raise ConfigError(f"divergence.loss_spike_factor={factor} would stop on ordinary noise; "
                          "use a factor above 1 (e.g. 5.0) or 0 to turn the rule off.")
    if config.divergence.median_window < 1:
        raise ConfigError(f"divergence.median_window={config.divergence.median_window} must be "
                          "positive, e.g. 100.")


def _validate_peft(config) -> None:
    lora = config.peft.lora
    if not isinstance(lora.rank, int) or lora.rank < 0:
        raise ConfigError(f"peft.lora.rank={lora.rank!r} must be an integer >= 0 (0: no LoRA), "
                          "e.g. --config.peft.lora.rank=8.")
    if lora.rank:
        _finite_at_least(config, "peft.lora.alpha", 0.0, "16")
        if not 0.0 <= lora.dropout < 1.0:
            raise ConfigError(f"peft.lora.dropout={lora.dropout} must be in [0, 1), e.g. 0.1.")
        try:
            re.compile(lora.targets)
        except re.error as e:
            raise ConfigError(f"peft.lora.targets={lora.targets!r} is not a regular expression "
                              f"({e}); e.g. '(query|value)/kernel$'.") from None
    for key, example in (("adapter.size", 64), ("prefix.length", 10), ("prefix.hidden", 512),
                         ("prompt.length", 20)):
        value = _lookup(config, f"peft.{key}")
        if not isinstance(value, int) or value < 0 or (key == "prefix.hidden" and value < 1):
            raise ConfigError(f"peft.{key}={value!r} must be an integer >= "
                              f"{1 if key == 'prefix.hidden' else 0} (0: off), e.g. "
                              f"--config.peft.{key}={example}.")
    if config.peft.prompt.length:
        if config.pack:
            raise ConfigError("peft.prompt puts its prompt in front of each row, so rows "
                              "cannot be packed; set --config.pack=False.")


def _validate_distill(config) -> None:
    """The distillation settings alone; the teacher is read when training starts
    (``distill.check_teacher``)."""
    d = config.get("distill")
    if d is None or not d.teacher:
        return
    for key in ("temperature", "soft_weight", "hard_weight", "cosine_weight"):
        value = d[key]
        positive = key == "temperature"
        if not (isinstance(value, (int, float)) and math.isfinite(value)
                and (value > 0 if positive else value >= 0)):
            raise ConfigError(f"distill.{key}={value!r} must be a finite number "
                              f"{'> 0' if positive else '>= 0'} (Sanh et al.: temperature 2, "
                              "soft 5, hard 2, cosine 1).")
    if config.init_from and d.student_init == "teacher_layers":
        raise ConfigError("distill.student_init='teacher_layers' starts the student from the "
                          f"teacher, and init_from={config.init_from!r} from elsewhere; pick "
                          "one: --config.init_from= or --config.distill.student_init=fresh.")
    if config.head.kind:
        raise ConfigError("distill distils a pretraining objective (masked LM, LM, seq2seq); "
                          "with head.kind set there are no token distributions to match. "
                          "Distil first, then fine-tune the student's checkpoint.")
    lora, prefix, prompt = config.peft.lora, config.peft.prefix, config.peft.get("prompt")
    if (config.peft.bitfit or lora.rank or config.peft.adapter.size or prefix.length
            or (prompt is not None and prompt.length)):
        raise ConfigError("distill trains the whole student; turn peft off for it.")


def _validate_head(config) -> None:
    """A task head's settings that hold for every body (each structure adds its own)."""
    head = config.get("head")
    if head is None or not head.kind:
        return
    if config.pack:
        raise ConfigError("A fine-tuning head reads one example per row; set "
                          "--config.pack=False.")
    if config.optimizer.microbatches != 1:
        raise ConfigError("Gradient accumulation (optimizer.microbatches > 1) is not built for "
                          "fine-tuning heads; use optimizer.microbatches=1 and a batch_size "
                          "that fits.")
    if "inputs" not in config.task_feature_lengths:
        raise ConfigError("A fine-tuning head reads task_feature_lengths.inputs tokens; set "
                          "--config.task_feature_lengths.inputs=128 (for example).")
    if head.kind == "regression" and head.labels:
        raise ConfigError("head.kind='regression' predicts one number; leave head.labels empty.")


def resolve_mesh_shape(mesh: dict[str, int], num_devices: int, num_slices: int = 1
                       ) -> dict[str, int]:
    """Fills ``-1`` (and ``dcn=0``: the ``num_slices`` found) and checks that the mesh uses
    exactly ``num_devices``."""
    mesh = {"dcn": mesh.get("dcn") or num_slices, **{k: v for k, v in mesh.items() if k != "dcn"}}
    fixed = math.prod(size for size in mesh.values() if size != -1)
    shape = dict(mesh)
    if -1 in mesh.values():
        if num_devices % fixed:
            raise ConfigError(
                f"mesh={dict(mesh)}: the fixed axes use {fixed} devices, which does not divide the "
                f"{num_devices} available; pick axis sizes whose product divides {num_devices}.")
        shape[next(k for k, v in mesh.items() if v == -1)] = num_devices // fixed
    elif fixed != num_devices:
        raise ConfigError(
            f"mesh={dict(mesh)} needs {fixed} devices but {num_devices} are available; set one "
            f"axis to -1 (e.g. --config.mesh.data=-1) or make the product {num_devices}.")
    return shape


def validate_for_devices(config: ml_collections.ConfigDict, num_devices: int,
                         process_count: int = 1, num_slices: int = 1) -> dict[str, int]:
    """Mesh and batch checks that need the device count; returns the resolved mesh shape."""
    shape = resolve_mesh_shape(dict(config.mesh), num_devices, num_slices)
    if num_slices > 1 and shape["dcn"] != num_slices:
        raise ConfigError(f"The devices span {num_slices} slices but mesh.dcn={shape['dcn']}; "
                          f"set --config.mesh.dcn={num_slices} (or 0 to follow the slices).")
    expert = shape.get("expert", 1)  # rows are split over the expert axis too
    batch_parallel = shape["dcn"] * shape["data"] * shape["fsdp"] * expert
    if config.batch_size % batch_parallel:
        fixed = (config.batch_size // batch_parallel + 1) * batch_parallel
        raise ConfigError(
            f"batch_size={config.batch_size} does not divide over the data-parallel mesh size "
            f"{batch_parallel} (mesh.dcn={shape['dcn']} x mesh.data={shape['data']} x "
            f"mesh.fsdp={shape['fsdp']} x mesh.expert={expert}); use a multiple of "
            f"{batch_parallel}, e.g. --config.batch_size={fixed}.")
    num_experts = config.model.get("num_experts") or 0
    if expert > 1 and num_experts % expert:
        raise ConfigError(
            f"mesh.expert={expert} does not divide model.num_experts={num_experts}; each "
            "device along the expert axis holds an equal share of the experts: make "
            f"mesh.expert a divisor of {num_experts}.")
    microbatches = config.optimizer.microbatches
    if config.batch_size % (batch_parallel * microbatches):
        raise ConfigError(
            f"batch_size={config.batch_size} does not split into optimizer.microbatches="
            f"{microbatches} microbatches that each divide over the data-parallel mesh size "
            f"{batch_parallel}; use a batch_size that is a multiple of "
            f"{batch_parallel * microbatches}.")
    if config.batch_size % process_count:
        raise ConfigError(f"batch_size={config.batch_size} does not divide over {process_count} "
                          f"processes; use a multiple of {process_count}.")
    resolve_data_streams(config, process_count)
    return shape


DEFAULT_DATA_STREAMS = 8


def default_data_streams(batch_size: int, process_count: int) -> int:
    """A new run's stream count: one that does not depend on the process count (the
    largest divisor of the batch up to 8) whenever the processes divide it, so a run
    on 1, 2, 4 or 8 processes sees the same batches; else one stream per process."""
    streams = math.gcd(batch_size, DEFAULT_DATA_STREAMS)
    return streams if streams % process_count == 0 else process_count


def resolve_data_streams(config: ml_collections.ConfigDict, process_count: int,
                         saved_config: dict | None = None) -> int:
    """The number of input streams V, checked against the batch and the processes.

    ``saved_config``: the config of the checkpoint being resumed, whose (resolved)
    ``data_streams`` a resumed run must keep; checkpoints from before streams existed
    hold one stream.
    """
    saved = None if saved_config is None else (saved_config.get("data_streams") or 1)
    if config.data_streams and saved is not None and config.data_streams != saved:
        raise ConfigError(
            f"data_streams={config.data_streams}, but the checkpoint being resumed was saved with "
            f"{saved} input streams, which fix the order of the data. Set "
            f"--config.data_streams={saved} (or 0: take the checkpoint's) to resume, or use a "
            "new --workdir.")
    streams = config.data_streams or saved or default_data_streams(config.batch_size,
                                                                    process_count)
    origin = (f"data_streams={config.data_streams}" if config.data_streams else
              f"data_streams=0 resumes with the checkpoint's {saved} streams" if saved else
              f"data_streams=0 gives {streams} streams here")
    if config.batch_size % streams:
        raise ConfigError(
            f"batch_size={config.batch_size} does not split over the input streams ({origin}); "
            f"use a batch_size that is a multiple of {streams}, or set --config.data_streams to a "
            f"divisor of {config.batch_size} that the process count divides.")
    if streams % process_count:
        hint = (f"run on a process count that divides {saved}" if saved else
                f"set --config.data_streams to a multiple of {process_count}")
        raise ConfigError(f"The input streams ({origin}) do not divide over {process_count} "
                          f"processes; {hint}.")
    return streams
