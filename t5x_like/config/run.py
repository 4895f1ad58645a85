"""The run spec: every section of a run, frozen and typed, each checking itself.

``RunSpec.from_mapping(config)`` builds one from a config (a ``ConfigDict`` in the
layout ``schema.default_config`` gives, old spellings moved first by
``legacy.migrate``); what needs devices, files or the task registry is checked
by the run service (``t5x_like.resolving``) before anything runs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import ClassVar

from t5x_like.config import evals as evals_lib
from t5x_like.config import mode_specs
from t5x_like.config.model_parts import ModelSpec, finite
from t5x_like.config.model_specs import model_spec_class
from t5x_like.config.sections import FrozenMap, Section, field, require, section
from t5x_like.errors import ConfigError

OPTIMIZERS = ("adafactor", "adamw", "muon", "schedule_free_adamw")
SCHEDULES = ("constant", "rsqrt", "linear", "cosine", "wsd")
HEAD_KINDS = ("", "classification", "regression", "token_classification", "span_extraction")
# Fingerprint keys a resume may be allowed to change (and their sub-keys).
RESUME_CHANGE_KEYS = ("vocabulary", "task", "task_feature_lengths", "optimizer", "model", "head",
                      "peft")


@section
class DataSpec(Section):
    """How the task's examples become rows. ``streams``: the input streams V the global
    batch is drawn from (stream v reads shard v of V and fills B/V rows of each batch);
    0: the checkpoint's count when resuming, else 8 (or the largest count up to 8 dividing
    batch_size) when the process count divides it, else one per process.
    ``prefix_attention``: decoders given inputs and targets train as a prefix LM whose
    prefix attends both ways (seqio) or causally (GPT fine-tuning, lm-eval)."""

    pack: bool = False
    streams: int = field(0, minimum=0)
    prefix_attention: str = field("bidirectional", choices=("bidirectional", "causal"))


@section
class OptimizerSpec(Section):
    name: str = field("adafactor", choices=OPTIMIZERS)
    learning_rate: float = field(1e-2, minimum=0.0)
    schedule: str = field("rsqrt", choices=SCHEDULES)
    warmup_steps: int = field(100, minimum=0)
    final_learning_rate_fraction: float = field(0.0, doc="linear, cosine, wsd end at this x peak")
    decay_fraction: float = field(0.1, doc="wsd: the last fraction of steps after warmup")
    muon_momentum: float = 0.95
    weight_decay: float = field(0.0, minimum=0.0)
    grad_clip_norm: float = field(0.0, minimum=0.0, doc="0: no global-norm clipping")
    b1: float = 0.9
    b2: float = 0.999
    microbatches: int = field(1, minimum=1, doc="gradient accumulation: slices of each batch")

    def check(self, path):
        fraction = self.final_learning_rate_fraction
        require(finite(fraction) and 0.0 <= fraction <= 1.0,
                f"optimizer.final_learning_rate_fraction={fraction} is a fraction of the peak "
                "learning rate and must be in [0, 1], e.g. "
                "--config.optimizer.final_learning_rate_fraction=0.1.")
        require(finite(self.decay_fraction) and 0.0 < self.decay_fraction <= 1.0,
                f"optimizer.decay_fraction={self.decay_fraction} is the fraction of the steps "
                "after warmup that WSD decays over and must be in (0, 1], e.g. "
                "--config.optimizer.decay_fraction=0.2.")
        require(self.name != "schedule_free_adamw" or self.schedule == "constant",
                "optimizer.name=schedule_free_adamw replaces the learning-rate decay; its "
                f"schedule is warmup then constant, not {self.schedule!r}: set "
                "--config.optimizer.schedule=constant.")
        for key, example in (("b1", 0.9), ("b2", 0.999), ("muon_momentum", 0.95)):
            value = getattr(self, key)
            require(finite(value) and 0.0 <= value < 1.0,
                    f"optimizer.{key}={value} is a decay rate and must be in [0, 1), e.g. "
                    f"--config.optimizer.{key}={example}.")


@section
class LossSpec(Section):
    z_loss: float = field(1e-4, minimum=0.0)
    label_smoothing: float = 0.0
    normalization: str = field("tokens", choices=("tokens", "constant"))
    normalizing_constant: float = field(0.0, doc="the divisor when normalization='constant'")
    logit_chunks: int = field(
        1, minimum=1, doc="the output layer and cross entropy run over this many slices of "
        "the positions, each recomputed in the backward pass, so a step holds one slice's "
        "float32 logits, not the batch's (MaxText's num_vocab_tiling); 1: all at once")

    def check(self, path):
        require(0.0 <= self.label_smoothing < 1.0,
                f"loss.label_smoothing={self.label_smoothing} must be in [0, 1), e.g. 0.1.")
        require(self.normalization != "constant" or self.normalizing_constant > 0,
                "loss.normalization='constant' needs a positive loss.normalizing_constant, e.g. "
                f"batch_size * target length (got {self.normalizing_constant}).")


@section
class LoggingSpec(Section):
    """``every_steps``: train metrics are averaged and written this often;
    ``peak_flops_per_device`` for MFU (0: the device kind's, from ``hardware``);
    ``batch_checksum``: log a checksum of the batches since the last log (the same rows
    give the same number on any mesh or process count: two runs compared batch by
    batch, ``docs/parallelism.md``)."""

    every_steps: int = field(10, minimum=1)
    peak_flops_per_device: float = field(0.0, minimum=0.0)
    batch_checksum: bool = False


TRACKERS = ("tensorboard", "wandb", "mlflow")


@section
class TrackingSpec(Section):
    """What the ``trackers`` (``trackers.py``) name the run. ``project``: the W&B project
    and the MLflow experiment ("": t5x_like); ``name``: the run's name ("": the workdir's
    last part). ``wandb_mode``: "" follows WANDB_MODE (online when unset); ``offline``
    writes the run under WORKDIR/wandb for ``wandb sync``. ``mlflow_uri``: "" follows
    MLFLOW_TRACKING_URI, else MLflow's default (``sqlite:///mlflow.db`` in the working
    directory). A resumed run continues the same tracker runs (``WORKDIR/trackers.json``)."""

    project: str = ""
    name: str = ""
    wandb_entity: str = ""
    wandb_mode: str = field("", choices=("", "online", "offline"))
    mlflow_uri: str = ""


@section
class CheckpointSpec(Section):
    """Saved ``every_steps``; the newest ``keep`` are kept, plus every ``keep_every_steps``-th
    step for good. ``local_dir``: saves land on this local disk first and are copied to the
    workdir in the background (single-process runs). ``allow_resume_changes``: fingerprint
    keys a resume may change (``vocabulary``, ``task``, ``optimizer``, a sub-key such as
    ``model.dropout_rate``, ...); others are refused."""

    every_steps: int = field(200, minimum=1)
    keep: int = field(3, minimum=1)
    keep_every_steps: int = field(0, minimum=0)
    local_dir: str = ""
    allow_resume_changes: tuple[str, ...] = ()

    def check(self, path):
        require(self.keep_every_steps % self.every_steps == 0,
                f"checkpoint.keep_every_steps={self.keep_every_steps} is not a multiple of "
                f"checkpoint.every_steps={self.every_steps}, so no saved step would be kept; use "
                "a multiple of checkpoint.every_steps.")
        require(not self.local_dir.startswith(("gs://", "s3://")),
                f"checkpoint.local_dir={self.local_dir!r} must be a local folder (a fast disk); "
                "the workdir is where checkpoints go to a bucket.")
        for name in self.allow_resume_changes:
            close = difflib.get_close_matches(name, RESUME_CHANGE_KEYS, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            require(any(name == k or name.startswith(k + ".") for k in RESUME_CHANGE_KEYS),
                    f"checkpoint.allow_resume_changes names {name!r}, which no resume checks. "
                    f"{hint}Use some of {', '.join(RESUME_CHANGE_KEYS)} (or a sub-key such as "
                    "model.dropout_rate).")


@section
class DivergenceSpec(Section):
    """Stopping a run that went wrong before anything of it is saved: a NaN/Inf loss or
    gradient (``on_nonfinite_loss``: stop, or skip that update), a gradient norm exactly 0
    for ``zero_grad_steps`` steps (0: off), a loss above ``loss_spike_factor`` x the median
    of the last ``median_window`` (0: off)."""

    on_nonfinite_loss: str = field("stop", choices=("stop", "skip_update"))
    zero_grad_steps: int = field(3, minimum=0)
    loss_spike_factor: float = field(0.0, minimum=0.0)
    median_window: int = field(100, minimum=1)

    def check(self, path):
        factor = self.loss_spike_factor
        require(not 0 < factor <= 1,
                f"divergence.loss_spike_factor={factor} would stop on ordinary noise; use a "
                "factor above 1 (e.g. 5.0) or 0 to turn the rule off.")


@section
class ResilienceSpec(Section):
    """Pod-scale safety (``docs/training_engine.md``): a lock without a heartbeat for
    ``lock_stale_after_s`` is taken over; no step, evaluation or save for
    ``hang_timeout_s`` stops the run (exit 75; 0: off, -1: 1800 s on TPU and GPU, off on
    CPU), the first step (which compiles) after ``first_step_timeout_s`` (-1: 3 times
    ``hang_timeout_s``; a large model's compile can take far longer than its steps);
    processes that do not arrive within ``startup_timeout_s`` are named (exit 2)."""

    lock_stale_after_s: float = 300.0
    hang_timeout_s: float = -1.0
    first_step_timeout_s: float = -1.0
    startup_timeout_s: float = 300.0

    def check(self, path):
        for key, example in (("lock_stale_after_s", "300"), ("startup_timeout_s", "600")):
            value = getattr(self, key)
            require(finite(value) and value > 0,
                    f"resilience.{key}={value} must be a positive number of seconds, e.g. "
                    f"--config.resilience.{key}={example}.")
        value = self.hang_timeout_s
        require(finite(value) and (value >= 0 or value == -1),
                f"resilience.hang_timeout_s={value} must be seconds (e.g. 1800), 0 (off) or -1 "
                "(1800 on TPU and GPU, off on CPU).")
        value = self.first_step_timeout_s
        require(finite(value) and (value > 0 or value == -1),
                f"resilience.first_step_timeout_s={value} must be seconds (e.g. 3600) or -1 "
                "(3 times hang_timeout_s).")


@section
class HeadSpec(Section):
    """A fine-tuning head on an encoder or decoder body instead of its pretraining
    objective (``models/heads.py``): the body loads from init_from, the head starts
    fresh. ``labels``: () takes the task's (resolved when the run starts)."""

    kind: str = field("", choices=HEAD_KINDS)
    pooling: str = field("cls", choices=("cls", "last", "mean"))
    dropout_rate: float = field(0.1, minimum=0.0)
    labels: tuple[str, ...] = ()
    max_answer_length: int = field(30, minimum=1)

    def check(self, path):
        require(not (self.kind == "regression" and self.labels),
                "head.kind='regression' predicts one number; leave head.labels empty.")


@section
class LoraSpec(Section):
    """Low-rank updates W + (alpha/rank) A B (Hu et al.) on kernels whose path matches
    ``targets`` (``summary`` lists the paths); rank 0: off."""

    rank: int = field(0, minimum=0)
    alpha: float = field(8.0, minimum=0.0)
    dropout: float = 0.0
    targets: str = r"(^|/)(query|value)/kernel$"

    def check(self, path):
        require(0.0 <= self.dropout < 1.0,
                f"peft.lora.dropout={self.dropout} must be in [0, 1), e.g. 0.1.")
        try:
            re.compile(self.targets)
        except re.error as e:
            raise ConfigError(f"peft.lora.targets={self.targets!r} is not a regular expression "
                              f"({e}); e.g. '(query|value)/kernel$'.") from None


@section
class AdapterSpec(Section):
    """Bottleneck adapters (Houlsby et al.); size 0: off."""

    size: int = field(0, minimum=0)
    activation: str = field("gelu", choices=("gelu", "gelu_exact", "relu", "silu"))
    placement: str = field("houlsby", choices=("houlsby", "pfeiffer"))


@section
class PrefixSpec(Section):
    """Learned keys and values in every attention (Li & Liang); length 0: off."""

    length: int = field(0, minimum=0)
    reparameterize: bool = False
    hidden: int = field(512, minimum=1)


@section
class PromptSpec(Section):
    """A soft prompt before the encoder's input (Lester et al.); length 0: off."""

    length: int = field(0, minimum=0)


@section
class PeftSpec(Section):
    """Parameter-efficient tuning (``models/peft_modules.py``): new small parameters or a chosen
    subset train, the rest stay frozen with no optimizer state."""

    bitfit: bool = False
    lora: LoraSpec = field(LoraSpec())
    adapter: AdapterSpec = field(AdapterSpec())
    prefix: PrefixSpec = field(PrefixSpec())
    prompt: PromptSpec = field(PromptSpec())

    @property
    def enabled(self) -> bool:
        return bool(self.bitfit or self.lora.rank or self.adapter.size or self.prefix.length
                    or self.prompt.length)


@section
class DistillSpec(Section):
    """Knowledge distillation (``distill.py``): a frozen teacher inside the train step;
    teacher "" is off. Sanh et al.'s weights: temperature 2, soft 5, hard 2, cosine 1."""

    teacher: str = ""
    temperature: float = 2.0
    soft_weight: float = field(5.0, minimum=0.0)
    hard_weight: float = field(2.0, minimum=0.0)
    cosine_weight: float = field(1.0, minimum=0.0)
    student_init: str = field("teacher_layers", choices=("teacher_layers", "fresh"))

    def check(self, path):
        require(not self.teacher or (finite(self.temperature) and self.temperature > 0),
                f"distill.temperature={self.temperature!r} must be a finite number > 0 (Sanh "
                "et al.: temperature 2, soft 5, hard 2, cosine 1).")


PREFERENCE_OBJECTIVES = ("", "dpo", "simpo", "orpo", "reward_model")
DPO_LOSS_TYPES = ("sigmoid", "robust", "ipo", "hinge")


@section
class PreferenceSpec(Section):
    """Learning from preference pairs (``structures/preference.py``, ``docs/
    preference_tuning.md``); ``objective`` "" is off. ``dpo``: a policy against a frozen
    ``reference`` ("" takes init_from, the model it starts from); ``simpo`` and ``orpo``
    need none; ``reward_model``: a scalar head trained with the Bradley-Terry loss.
    TRL's defaults: beta 0.1 (SimPO's paper uses 2.0 with gamma 0.5 x beta)."""

    objective: str = field("", choices=PREFERENCE_OBJECTIVES)
    loss_type: str = field("sigmoid", choices=DPO_LOSS_TYPES, doc="dpo's loss")
    beta: float = field(0.1, minimum=0.0)
    label_smoothing: float = field(0.0, minimum=0.0,
                                   doc="sigmoid: cDPO; robust: the label flip rate")
    simpo_gamma: float = field(0.5, minimum=0.0, doc="simpo: the target reward margin")
    reference: str = field("", doc="dpo: the frozen reference; '' is init_from")
    center_rewards: float = field(0.0, minimum=0.0,
                                  doc="reward_model: weight of (r_chosen + r_rejected)^2")

    def check(self, path):
        require(finite(self.beta) and (self.beta > 0 or self.objective in ("", "reward_model")),
                f"preference.beta={self.beta!r} must be a finite number > 0 (TRL's default "
                "0.1).")
        require(self.label_smoothing < 0.5,
                f"preference.label_smoothing={self.label_smoothing} is the chance a label is "
                "wrong and must be below 0.5, e.g. 0.1.")


QUANTIZATION_KINDS = ("", "int8", "fp8")
QUANTIZED_LAYERS = ("attention", "mlp", "experts", "output")


@section
class QuantizationSpec(Section):
    """Quantized training through Qwix (``models/quantization.py``, ``docs/
    low_precision.md``); ``kind`` "" is off. ``int8``: weights, activations and
    gradients in int8; ``fp8``: weights and activations in float8_e4m3fn, gradients in
    float8_e5m2. Scales are computed in the step from each tensor (absmax), per channel
    or per tensor (``scales``). ``layers``: the matmuls quantized, found by module type in
    any family: ``attention`` projections, ``mlp`` projections, ``experts`` (a mixture
    of experts' expert matmuls, with dropless dispatch), ``output`` (the vocabulary
    projection). The checkpoint keeps float weights: quantization is in the step.
    ``weights``: ``int8`` makes eval, infer and the harness read the attention and MLP
    kernels in int8 (``int8_weights.py``), their scales saved beside the checkpoint."""

    kind: str = field("", choices=QUANTIZATION_KINDS)
    scales: str = field("per_channel", choices=("per_channel", "per_tensor"))
    layers: tuple[str, ...] = ("attention", "mlp", "experts")
    weights: str = field("", choices=("", "int8"), doc="int8: eval/infer/harness weights")

    def check(self, path):
        unknown = sorted(set(self.layers) - set(QUANTIZED_LAYERS))
        require(not unknown, f"quantization.layers names {unknown}, which are not layers Qwix "
                             f"quantizes here; choose from {list(QUANTIZED_LAYERS)}.")
        require(not self.kind or self.layers,
                f"quantization.kind={self.kind!r} with no quantization.layers quantizes "
                "nothing; name some, e.g. --config.quantization.layers=\"('attention', "
                "'mlp')\", or set --config.quantization.kind=.")


RL_ALGORITHMS = ("", "grpo", "ppo")
GRPO_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
GRPO_RATIO_LEVELS = ("token", "sequence")


@section
class RlSpec(Section):
    """Online reinforcement learning (``rl.py``, ``structures/reinforcement.py``):
    ``algorithm`` "" is off; ``grpo`` samples ``num_generations`` completions of each
    prompt with our own decoding (batch_size counts completions), scores them with the
    registered ``rewards`` (weighted by ``reward_weights``, 1 each by default) and a
    ``reward_model`` checkpoint, and takes ``iterations`` clipped-ratio steps on each
    rollout batch's group-normalised advantages with ``beta`` times a KL estimate to the
    frozen ``reference`` ("" is init_from). TRL's defaults: 8 generations, epsilon 0.2,
    beta 0, loss_type dapo, one iteration.

    ``ppo`` (InstructGPT's RLHF; ``objectives/ppo.py``) samples one completion a prompt,
    scores it the same way, folds ``kl_coef`` times a per-token KL estimate to the
    reference into the rewards, and trains the policy with a value model beside it
    (started from ``value_model``, "" is ``reward_model``; with neither, from the policy's
    trunk with a fresh head) on GAE advantages for ``iterations`` epochs of each rollout
    batch (TRL's num_ppo_epochs), each epoch ``num_mini_batches`` steps of ``batch_size``
    rows (a rollout samples ``batch_size`` x ``num_mini_batches`` prompts; an epoch's
    minibatches are a fresh shuffle of them). TRL's PPOConfig defaults: kl_coef 0.05, k1,
    gamma 1, lam 0.95, epsilon (its cliprange) 0.2, value_epsilon 0.2, vf_coef 0.1, 4
    epochs, 1 minibatch."""

    algorithm: str = field("", choices=RL_ALGORITHMS)
    num_generations: int = field(8, minimum=2)
    temperature: float = field(1.0, minimum=0.0)
    top_p: float = field(1.0, minimum=0.0)
    top_k: int = field(0, minimum=0)
    sampler: str = field("static", choices=evals_lib.SAMPLERS, doc=(
        "how rollouts are sampled: static (one padded batch to the longest completion, "
        "decoding.generate_padded) or engine (the continuous-batching engine of "
        "generation/engine.py: a finished completion frees its slot, a group's prompt is "
        "prefilled once; one process)"))
    beta: float = field(0.0, minimum=0.0, doc="weight of the KL term to the reference")
    epsilon: float = field(0.2, minimum=0.0)
    epsilon_high: float = field(0.0, minimum=0.0, doc="0: epsilon (DAPO raises it)")
    scale_rewards: str = field("group", choices=("group", "batch", "none"))
    loss_type: str = field("dapo", choices=GRPO_LOSS_TYPES)
    ratio_level: str = field("token", choices=GRPO_RATIO_LEVELS, doc=(
        "TRL's importance_sampling_level: sequence is GSPO's one clipped ratio per "
        "completion (its tokens' mean log-ratio); GSPO pairs it with loss_type grpo"))
    iterations: int = field(1, minimum=1, doc=(
        "updates per rollout batch (TRL's num_iterations, the paper's mu); > 1 keeps the "
        "sampling policy's log-probs as the ratio's denominator, and num_train_steps and "
        "checkpoint.every_steps must be multiples of it"))
    num_mini_batches: int = field(1, minimum=1, doc=(
        "ppo: optimizer steps per epoch of a rollout (TRL's num_mini_batches); a rollout "
        "holds batch_size x num_mini_batches completions, shuffled into minibatches of "
        "batch_size each epoch"))
    dynamic_sampling_rounds: int = field(0, minimum=0, doc=(
        "DAPO's dynamic sampling: groups whose rewards are all equal (no gradient) are "
        "dropped and refilled from the next prompts, in up to this many more rounds of "
        "sampling a step; groups still missing after them are filled with dropped ones; "
        "0 is off"))
    rewards: tuple[str, ...] = ("exact_answer",)
    reward_weights: tuple[float, ...] = ()
    reward_model: str = field("", doc="a reward_model run whose scores join the rewards")
    value_model: str = field("", doc="ppo: the reward_model run the value model starts from; "
                                     "'' is reward_model")
    reference: str = field("", doc="beta > 0: the frozen reference; '' is init_from")
    # PPO's (TRL's PPOConfig names and defaults; objectives/ppo.py): the KL penalty folded
    # into each completion token's reward, GAE, the value loss and its clip.
    kl_coef: float = field(0.05, minimum=0.0, doc="ppo: weight of the KL penalty in the reward")
    kl_estimator: str = field("k1", choices=("k1", "k3"))
    gamma: float = field(1.0, minimum=0.0, doc="ppo: GAE's discount")
    lam: float = field(0.95, minimum=0.0, doc="ppo: GAE's lambda")
    value_epsilon: float = field(0.2, minimum=0.0, doc="ppo: the value's clip range")
    vf_coef: float = field(0.1, minimum=0.0, doc="ppo: weight of the value loss")
    whiten_rewards: bool = False
    missing_eos_penalty: float = field(0.0, minimum=0.0, doc=(
        "ppo: subtracted from the score of a completion cut off before its EOS (TRL's "
        "option, None there; 0 is off)"))

    def check(self, path):
        if not self.algorithm:
            return
        require(finite(self.temperature) and self.temperature > 0,
                f"rl.temperature={self.temperature} must be > 0: the group's completions are "
                "sampled (TRL's default 1.0).")
        require(0.0 < self.top_p <= 1.0, f"rl.top_p={self.top_p} must be in (0, 1].")
        require(self.algorithm != "ppo" or not self.dynamic_sampling_rounds,
                "rl.dynamic_sampling_rounds refills GRPO's groups without signal; PPO samples "
                "one completion a prompt (no groups). Set it to 0, or rl.algorithm=grpo.")
        require(self.algorithm == "ppo" or self.num_mini_batches == 1,
                f"rl.num_mini_batches={self.num_mini_batches} splits PPO's rollout into "
                "minibatches; a GRPO rollout is one step's batch (rl.iterations reuses it). "
                "Set it to 1, or rl.algorithm=ppo.")
        require(self.rewards or self.reward_model,
                f"rl.algorithm={self.algorithm!r} needs something to score completions: rl.rewards (names "
                "registered with t5x_like.metrics.rewards.RewardRegistry) or rl.reward_model.")
        require(not self.reward_weights or len(self.reward_weights) == len(self.rewards)
                + bool(self.reward_model),
                f"rl.reward_weights has {len(self.reward_weights)} weights for "
                f"{len(self.rewards) + bool(self.reward_model)} rewards (rl.rewards, then "
                "rl.reward_model); give one each, or none for 1 each.")

    @property
    def epsilon_upper(self) -> float:
        return self.epsilon_high or self.epsilon

    @property
    def updates_per_rollout(self) -> int:
        """Optimizer steps one rollout serves: its epochs (``iterations``) of
        ``num_mini_batches`` steps each."""
        return self.iterations * self.num_mini_batches

    @property
    def samples_per_prompt(self) -> int:
        """Completions sampled of each prompt: GRPO's group, PPO's one."""
        return 1 if self.algorithm == "ppo" else self.num_generations


MESH_AXES = ("dcn", "stage", "data", "fsdp", "expert", "context", "tensor")


@section
class MeshSpec(Section):
    """Device mesh axes; -1 takes the remaining devices. ``dcn``: data parallelism across
    TPU slices (multi-slice); 0: the number of slices the devices span (1 off multi-slice
    TPU), so one config runs anywhere. ``stage`` holds pipeline stages (a scanned
    stack's layers split into consecutive groups); ``context`` splits every row's
    positions (``docs/parallelism.md``)."""

    dcn: int = 0
    stage: int = 1
    data: int = -1
    fsdp: int = 1
    expert: int = 1
    context: int = 1
    tensor: int = 1

    def check(self, path):
        require(self.dcn >= 0, f"mesh.dcn must be the number of slices, or 0 for the slices the "
                               f"devices span, got {self.dcn!r}.")
        for name in MESH_AXES[1:]:
            size = getattr(self, name)
            require(size >= 1 or size == -1,
                    f"mesh.{name} must be a positive integer or -1 (fill), got {size!r}.")
        require(list(self.to_dict().values()).count(-1) <= 1,
                "At most one mesh axis may be -1 (fill with the remaining devices); got "
                f"mesh={self.to_dict()}.")


@section
class PartitioningSpec(Section):
    """How arrays map onto the mesh: the rule set for parameters, and how attention
    works across a ``mesh.context`` axis (``models/context_parallel.py``):
    ``all_gather`` gathers every layer's keys and values, ``ring`` passes them around
    the axis with a running softmax (less memory, the same bytes moved);
    ``context_load_balance`` gives each device of a causal model an early and a late
    part of every row, so each has as many visible keys as another.

    Pipeline stages (``mesh.stage``, ``models/pipeline_parallel.py``): each batch (each
    optimizer microbatch) is cut into ``pipeline_microbatches`` (0: one per stage)
    that flow through the stages; ``gpipe`` gives each stage one run of consecutive
    layers, ``circular`` gives it ``pipeline_layers_per_stage`` at a time, visited
    repeatedly (MaxText's interleaved schedule: a smaller bubble for more hops).
    ``pipeline_over_dcn``: the slices (``mesh.dcn``) hold stages instead of rows.
    ``fsdp_over_dcn``: the FSDP rule sets shard parameters (and the optimizer state) over
    the slices too, each slice holding 1/``mesh.dcn`` of them (MaxText's
    ``dcn_fsdp_parallelism``): the memory of FSDP over every chip, for every layer's
    gather and gradient reduction crossing the data-center network."""

    rules: str = field("fsdp", choices=("data_parallel", "fsdp", "fsdp_tensor"))
    context_attention: str = field("all_gather", choices=("all_gather", "ring"))
    context_load_balance: bool = True
    pipeline_schedule: str = field("gpipe", choices=("gpipe", "circular"))
    pipeline_microbatches: int = field(0, minimum=0)
    pipeline_layers_per_stage: int = field(1, minimum=1, doc="circular: layers a stage runs a visit")
    pipeline_over_dcn: bool = False
    fsdp_over_dcn: bool = False
    split_physical_axes: bool = field(
        False, doc="a mesh axis may take part of a torus dimension (MaxText's "
        "allow_split_physical_axes), e.g. expert 4 x fsdp 64 on v6e:16x16")

    def check(self, path):
        require(not (self.fsdp_over_dcn and self.pipeline_over_dcn),
                f"{path}.fsdp_over_dcn and {path}.pipeline_over_dcn both claim the slices; "
                "choose one.")
        require(not self.fsdp_over_dcn or self.rules != "data_parallel",
                f"{path}.fsdp_over_dcn shards parameters over the slices as the FSDP rule sets "
                f"do, and {path}.rules='data_parallel' shards none; set "
                f"--config.{path}.rules=fsdp.")


@section
class RunSpec(Section):
    """One run, every section resolved and checked (``docs/configs.md``)."""

    seed: int = 0
    num_train_steps: int = field(1000, minimum=1)
    batch_size: int = field(32, minimum=1, doc="global, over all hosts and devices")
    task: str = "embedded_en_span_corruption"
    # "": the task's own vocabulary; "checkpoint": the tokenizer init_from carries; or a
    # tokenizer folder / tokenizer.json / .model path (copied into WORKDIR/tokenizer).
    vocabulary: str = ""
    init_from: str = field("", doc="params-only pretrained folder or run to start from")
    task_feature_lengths: FrozenMap = field(FrozenMap(inputs=512, targets=114))
    data: DataSpec = field(DataSpec())
    model: ModelSpec
    optimizer: OptimizerSpec = field(OptimizerSpec())
    loss: LossSpec = field(LossSpec())
    logging: LoggingSpec = field(LoggingSpec())
    trackers: tuple[str, ...] = field(("tensorboard",), doc="any of tensorboard, wandb, mlflow")
    tracking: TrackingSpec = field(TrackingSpec())
    checkpoint: CheckpointSpec = field(CheckpointSpec())
    evals: FrozenMap = field(evals_lib.default_evals())
    divergence: DivergenceSpec = field(DivergenceSpec())
    resilience: ResilienceSpec = field(ResilienceSpec())
    head: HeadSpec = field(HeadSpec())
    peft: PeftSpec = field(PeftSpec())
    distill: DistillSpec = field(DistillSpec())
    preference: PreferenceSpec = field(PreferenceSpec())
    rl: RlSpec = field(RlSpec())
    modes: FrozenMap = field(FrozenMap(), doc="modes of your own by name (config/mode_specs.py)")
    quantization: QuantizationSpec = field(QuantizationSpec())
    mesh: MeshSpec = field(MeshSpec())
    partitioning: PartitioningSpec = field(PartitioningSpec())

    # Families whose encoder takes a soft prompt (peft.prompt) in front of its input.
    SOFT_PROMPT_FAMILIES: ClassVar[tuple[str, ...]] = ("encoder", "encoder_decoder")

    @classmethod
    def sub_section(cls, name, value):
        if name == "model":
            return model_spec_class(value.get("family", "encoder_decoder"))
        return super().sub_section(name, value)

    @classmethod
    def _value(cls, f, value, key):
        if f.name == "evals":
            return evals_lib.evals_from_mapping(value, key)
        if f.name == "modes":
            return mode_specs.modes_from_mapping(value, key)
        if f.name == "task_feature_lengths":
            lengths = super()._value(f, value, key)
            for name, length in lengths.items():
                require(isinstance(length, int) and not isinstance(length, bool) and length > 0,
                        f"task_feature_lengths.{name} must be a positive integer, got "
                        f"{length!r}.")
            return lengths
        return super()._value(f, value, key)

    def check(self, path=""):
        require(self.vocabulary != "checkpoint" or self.init_from,
                "vocabulary='checkpoint' takes the tokenizer of the checkpoint the run starts "
                "from, and init_from is empty; set --config.init_from=FOLDER or give the "
                "tokenizer's path.")
        require(not self.data.streams or self.batch_size % self.data.streams == 0,
                f"batch_size={self.batch_size} does not split into data.streams="
                f"{self.data.streams} equal parts; use a batch_size that is a multiple of "
                f"{self.data.streams} or a data.streams that divides {self.batch_size}.")
        unknown = sorted(set(self.trackers) - set(TRACKERS))
        require(not unknown, f"trackers names {unknown}; choose any of {list(TRACKERS)}, e.g. "
                             "--config.trackers=tensorboard,wandb.")
        self._check_head()
        self._check_peft()
        self._check_distill()
        self._check_preference()
        self._check_rl()
        self.model.check_run(self)

    def _check_head(self) -> None:
        if not self.head.kind:
            return
        require(not self.data.pack, "A fine-tuning head reads one example per row; set "
                                    "--config.data.pack=False.")
        require(self.optimizer.microbatches == 1,
                "Gradient accumulation (optimizer.microbatches > 1) is not built for fine-tuning "
                "heads; use optimizer.microbatches=1 and a batch_size that fits.")
        require("inputs" in self.task_feature_lengths,
                "A fine-tuning head reads task_feature_lengths.inputs tokens; set "
                "--config.task_feature_lengths.inputs=128 (for example).")

    def _check_peft(self) -> None:
        if self.peft.prompt.length:
            require(not self.data.pack, "peft.prompt puts its prompt in front of each row, so "
                                        "rows cannot be packed; set --config.data.pack=False.")
            require(self.model.family in self.SOFT_PROMPT_FAMILIES,
                    "peft.prompt puts a soft prompt in front of the input of a BERT-style "
                    f"encoder or T5's encoder; it is not built for model.family="
                    f"{self.model.family!r}. Use prefix tuning, which works with cached decoding: "
                    "--config.peft.prompt.length=0 --config.peft.prefix.length=10.")

    def _check_distill(self) -> None:
        if not self.distill.teacher:
            return
        require(not (self.init_from and self.distill.student_init == "teacher_layers"),
                "distill.student_init='teacher_layers' starts the student from the teacher, and "
                f"init_from={self.init_from!r} from elsewhere; pick one: --config.init_from= or "
                "--config.distill.student_init=fresh.")
        require(not self.head.kind,
                "distill distils a pretraining objective (masked LM, LM, seq2seq); with head.kind "
                "set there are no token distributions to match. Distil first, then fine-tune the "
                "student's checkpoint.")
        require(not self.peft.enabled, "distill trains the whole student; turn peft off for it.")

    def _check_preference(self) -> None:
        objective = self.preference.objective
        if not objective:
            return
        key = f"preference.objective={objective!r}"
        require(not self.head.kind and not self.distill.teacher,
                f"{key} trains on preference pairs; leave head.kind and distill.teacher empty.")
        require(not self.data.pack, f"{key}: pairs are batched, not packed; set "
                                    "--config.data.pack=False.")
        require({"inputs", "targets"} <= set(self.task_feature_lengths),
                f"{key} reads a prompt (task_feature_lengths.inputs, the start id included) "
                "and a response (targets); set both, e.g. --config.task_feature_lengths="
                "\"{'inputs': 128, 'targets': 128}\".")
        require(objective != "dpo" or self.preference.reference or self.init_from,
                "preference.objective='dpo' compares the policy with a frozen reference, and "
                "neither preference.reference nor init_from names one; set "
                "--config.init_from=SFT_CHECKPOINT (the reference by default).")
        require(objective != "orpo" or self.optimizer.microbatches == 1,
                "preference.objective='orpo' averages its NLL over the batch's tokens, which "
                "microbatches would split; use optimizer.microbatches=1.")
        require(self.preference.loss_type != "robust" or objective != "dpo"
                or self.preference.label_smoothing > 0,
                "preference.loss_type='robust' models flipped labels; give it "
                "preference.label_smoothing > 0 (the flip rate, e.g. 0.1).")

    def _check_rl(self) -> None:
        rl = self.rl
        if not rl.algorithm:
            return
        key = f"rl.algorithm={rl.algorithm!r}"
        require(not (self.head.kind or self.distill.teacher or self.preference.objective),
                f"{key} trains the policy on its own rollouts; leave head.kind, "
                "distill.teacher and preference.objective empty.")
        require(not self.data.pack, f"{key}: rollouts are one prompt per row; set "
                                    "--config.data.pack=False.")
        require({"inputs", "targets"} <= set(self.task_feature_lengths),
                f"{key} reads prompts of task_feature_lengths.inputs tokens and samples "
                "completions of task_feature_lengths.targets; set both.")
        require(self.batch_size % rl.samples_per_prompt == 0,
                f"batch_size={self.batch_size} counts completions and must be a multiple of "
                f"rl.num_generations={rl.num_generations} (the completions of one prompt).")
        if rl.algorithm == "ppo":
            what = ("peft" if self.peft.enabled else
                    f"quantization.kind={self.quantization.kind!r}" if self.quantization.kind
                    else "")
            require(not what, f"rl.algorithm='ppo' trains the policy and its value model in "
                              f"full precision, without {what}; turn it off (GRPO takes it).")
            require(self.init_from, "rl.algorithm='ppo' starts the policy from a decoder (the "
                                    "SFT model): set init_from to its run or folder.")
        require(not rl.beta or rl.reference or self.init_from,
                f"rl.beta={rl.beta} keeps the policy near a frozen reference, and neither "
                "rl.reference nor init_from names one; set --config.init_from=SFT_CHECKPOINT.")
        self._check_rollout_boundaries()
        held_out = [name for name, e in self.evals.items()
                    if e.kind == "held_out_loss" and e.enabled]
        require(not held_out,
                f"{key} trains on rollouts, which evals.{held_out[0] if held_out else ''} "
                "(the held-out loss of the task's rows) does not read; evaluate with "
                "--config.evals.held_out.kind=rollouts (greedy completions of validation "
                "prompts, their rewards) or turn it off with "
                "--config.evals.held_out.every_steps=0.")

    def _check_rollout_boundaries(self) -> None:
        """With ``rl.iterations`` > 1 (or PPO's ``rl.num_mini_batches`` > 1) a rollout
        serves that many consecutive updates, and a run stops or saves only between
        rollouts: a checkpoint inside one could not resume it (the rollout and the policy
        that sampled it are not saved), so the steps that end a run or save one must end
        a rollout's updates."""
        updates = self.rl.updates_per_rollout
        what = (f"rl.iterations={self.rl.iterations}" if self.rl.num_mini_batches == 1 else
                f"rl.iterations x rl.num_mini_batches={updates}")
        for key, steps in (("num_train_steps", self.num_train_steps),
                           ("checkpoint.every_steps", self.checkpoint.every_steps)):
            fix = -(-steps // updates) * updates
            require(steps % updates == 0,
                    f"{key}={steps} is not a multiple of {what} (a rollout's updates are "
                    f"never split by a checkpoint); use --config.{key}={fix}.")

    def prompts_per_step(self) -> int:
        """The task's rows one step reads: every one is sampled ``rl.samples_per_prompt``
        times in RL (GRPO's group, PPO's one), once otherwise."""
        return self.batch_size // (self.rl.samples_per_prompt if self.rl.algorithm else 1)

    def evaluators(self, kind: str) -> dict:
        """``{name: spec}`` of the evaluators of ``kind``."""
        return {name: spec for name, spec in self.evals.items() if spec.kind == kind}


def run_spec(config: Mapping) -> RunSpec:
    """The run spec of a config already in the current layout (``legacy.migrate`` moves
    old spellings first)."""
    if isinstance(config, RunSpec):
        return config
    to_dict = getattr(config, "to_dict", None)
    return RunSpec.from_mapping(to_dict() if to_dict is not None else dict(config))
