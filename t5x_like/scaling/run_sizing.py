"""From a compute-optimal ``N`` and ``D`` to a run: the nearest model of the base config's
family, its batch, and what the AOT planner says of it on a topology.

A law gives a parameter count; a run needs a shape. At scale the shape rule is the one
large decoders share (GPT-3 175B, Llama 2 7B and 13B: ``d_model / num_layers = 128``;
Chinchilla 70B: 102), with heads of 128 and the base config's own recipe kept: its
MLP width ratio (4 for GPT-2, 2.75 for SwiGLU), its query heads per key/value head, its
vocabulary, positions and norms; widths are whole groups of heads. ``nearest_shape``
tries the widths around the rule's and gives each the depth that puts its parameter
count (counted from the model's abstract shapes, embeddings included) nearest ``N``; of
those it keeps the one closest to the aspect ratio.

The batch and peak learning rate follow DeepSeek-AI's fitted laws (DeepSeek LLM, 2024,
eq. 1): ``B_opt = 0.2920 C**0.3271`` tokens and ``lr_opt = 0.3118 C**-0.1250``, the
only published fit of both against compute; the batch is rounded to whole sequences, a
multiple of the chip count.

With ``--chip_hours`` the budget is ``chip-hours x 3600 x peak FLOP/s x MFU``: the MFU
assumed (``--mfu``), or the planner's roofline bound where that is lower (no run beats
its roofline), and the shape is chosen again for the lower budget (at most
``MAX_ROUNDS`` shapes compiled; the budget ends at the MFU the reported shape can
reach). The tokens the run gets are the budget over ``flops.py``'s FLOPs per token of
the chosen model (attention and the vocabulary projection included), not ``6 N``.
"""

from __future__ import annotations

import dataclasses
import math

from t5x_like import structures
from t5x_like.config import spec_of
from t5x_like.engine import flops
from t5x_like.errors import UserError
from t5x_like.planner import aot_planner
from t5x_like.scaling import sweep
from t5x_like.system import hardware

ASPECT = 128  # d_model / num_layers of large decoders (GPT-3, Llama 2)
HEAD_DIM = 128
WIDTH_STEP = 128  # MLP widths are multiples of this (TPU lanes)
WIDTHS_TRIED = 5  # widths around the rule's, each given its best depth
BATCH_COEFFICIENT, BATCH_EXPONENT = 0.2920, 0.3271  # DeepSeek LLM: B_opt tokens
LR_COEFFICIENT, LR_EXPONENT = 0.3118, -0.1250  # DeepSeek LLM: peak learning rate
# Assumed model FLOPs utilisation of a run (PaLM reported 46.2% on TPU v4, Chowdhery et al.
# 2022; a first run on a new stack seldom does better): give what your runs measure.
ASSUMED_MFU = 0.4
MAX_ROUNDS = 3  # budget -> shape -> plan -> (roofline MFU lowers the budget) -> ...
FIT_COMPILES = 4  # compiles with more microbatches after a plan that does not fit


@dataclasses.dataclass(frozen=True)
class Shape:
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    params: int
    non_embedding_params: int

    def model_config(self, base_model):
        """The base's model spec at this shape."""
        keys = structures.structure_class(base_model.family).depth_keys
        model = base_model.replace(d_model=self.d_model, num_heads=self.num_heads,
                                   head_dim=HEAD_DIM, d_ff=self.d_ff,
                                   **dict.fromkeys(keys, self.num_layers))
        if "num_kv_heads" in model.attention:  # grouped-query attention (decoders)
            model = model.replace(attention=model.attention.replace(
                num_kv_heads=self.num_kv_heads))
        return model

    def describe(self) -> str:
        kv = "" if self.num_kv_heads == self.num_heads else f" ({self.num_kv_heads} key/value)"
        return (f"d_model {self.d_model}, {self.num_layers} layers, {self.num_heads} heads of "
                f"{HEAD_DIM}{kv}, d_ff {self.d_ff}")


def _group(base_model) -> int:
    """Query heads per key/value head in the base recipe (1: multi-head attention)."""
    kv = base_model.attention.get("num_kv_heads") or base_model.num_heads
    return max(1, base_model.num_heads // kv)


def _width_step(base_model) -> int:
    """Widths are whole groups of 128-wide heads, so the base's grouping is kept exactly."""
    return HEAD_DIM * _group(base_model)


def _shape(base, d_model: int, num_layers: int) -> Shape:
    heads = d_model // HEAD_DIM
    kv = heads // _group(base.model)
    ratio = base.model.d_ff / base.model.d_model
    d_ff = max(WIDTH_STEP, round(ratio * d_model / WIDTH_STEP) * WIDTH_STEP)
    shape = Shape(d_model, num_layers, heads, kv, d_ff, 0, 0)
    params, non_embedding = sweep.count_params(shape.model_config(base.model),
                                               dict(base.task_feature_lengths))
    return dataclasses.replace(shape, params=params, non_embedding_params=non_embedding)


def nearest_shape(base, target_params: float) -> Shape:
    """The shape of the rule whose parameter count is nearest ``target_params``."""
    sweep.depth_keys(base)
    if target_params <= 0:
        raise UserError(f"cannot shape a model of {target_params:.3g} parameters.")
    # 12 d^2 parameters a layer (attention 4 d^2, MLP 8 d^2) and d / ASPECT layers.
    guess = (ASPECT * target_params / 12) ** (1 / 3)
    step = _width_step(base.model)
    centre = max(1, round(guess / step))
    widths = [step * k for k in range(max(1, centre - WIDTHS_TRIED // 2),
                                      centre + WIDTHS_TRIED // 2 + 1)]
    best = []
    for width in widths:
        one, two = _shape(base, width, 1), _shape(base, width, 2)
        per_layer = two.params - one.params
        fixed = one.params - per_layer  # embeddings, final norm, output projection
        layers = max(1, round((target_params - fixed) / per_layer))
        shape = dataclasses.replace(one, num_layers=layers, params=fixed + layers * per_layer,
                                    non_embedding_params=one.non_embedding_params
                                    + (layers - 1) * per_layer)
        best.append(shape)
    # Depth hits the count within a layer at every width: the aspect ratio decides.
    return min(best, key=lambda s: (abs(math.log(s.d_model / s.num_layers / ASPECT)),
                                    abs(math.log(s.params / target_params))))


def batch_rule(flops_budget: float, sequence_tokens: int, chips: int) -> tuple[int, float]:
    """(sequences per step, peak learning rate) for a budget, by DeepSeek LLM's laws."""
    tokens = BATCH_COEFFICIENT * flops_budget ** BATCH_EXPONENT
    sequences = max(chips, round(tokens / sequence_tokens / chips) * chips)
    return sequences, LR_COEFFICIENT * flops_budget ** LR_EXPONENT


def run_config(base, shape: Shape, batch_size: int, learning_rate: float, steps: int,
               microbatches: int):
    """``base`` with the chosen shape, batch, peak learning rate and length (the planner
    compiles one step: the length only sets the schedule), sharded as the large configs
    are (``configs/_bases.shard_fully``): parameters and optimizer state over every chip
    (FSDP, MaxText's default), activations in bfloat16. The base's remat and scan stay."""
    model = shape.model_config(base.model)
    model = model.replace(numerics=model.numerics.replace(dtype="bfloat16"))
    run = base.replace(model=model, mesh=base.mesh.replace(data=1, fsdp=-1, tensor=1),
                       partitioning=base.partitioning.replace(rules="fsdp"),
                       batch_size=batch_size, num_train_steps=max(1, steps),
                       optimizer=base.optimizer.replace(learning_rate=learning_rate,
                                                        microbatches=microbatches))
    return spec_of(run.to_dict())  # checked as a config file's would be


@dataclasses.dataclass
class Budget:
    """A budget in FLOPs, and where it came from."""

    flops: float
    chip_hours: float | None = None
    peak_flops: float | None = None  # per chip
    mfu: float | None = None
    mfu_source: str = ""


def chip_hours_budget(chip_hours: float, topology: str, mfu: float) -> Budget:
    """FLOPs that ``chip_hours`` of the topology's chips deliver at ``mfu``."""
    if not (math.isfinite(chip_hours) and chip_hours > 0):
        raise UserError(f"--chip_hours={chip_hours}: give a positive number of chip-hours.")
    kind = device_kind(topology)
    peak = hardware.peak_flops(kind)
    if peak is None:
        raise UserError(f"--chip_hours on {topology}: no peak FLOP/s is known for {kind!r}; give "
                        "a TPU topology (v5p:4x4x4, v5e:4x4, ...) or the budget as --flops.")
    return Budget(chip_hours * 3600 * peak * mfu, chip_hours, peak, mfu, "--mfu")


def device_kind(topology: str) -> str:
    return aot_planner.topology_devices(topology)[0].device_kind


def microbatches_to_fit(plans: list[tuple[int, dict]]) -> int | None:
    """The power of two of microbatches whose temporaries should fit beside the state,
    from the plans compiled so far (``(microbatches, report)``, in order, the last not
    fitting); None where the state alone does not fit, or more microbatches did not
    shrink the temporaries.

    From one plan the temporaries are taken to shrink as ``1 / k``. They do not quite:
    part of them is the same at any ``k`` (the optimizer update, the logits' share, the
    gathered weights of a layer), and the compiler picks other fusions per microbatch
    size, so a second plan is compiled and read: through the last two plans
    ``temporaries = fixed + scaled / k``. (``decoder_modern_1b``'s 1.6B shape on v5p:2x2x1
    at batch 736: 332, 162, 105, 55 GiB at 1, 2, 4, 8 microbatches; ``1 / k`` from the
    first asked for 4, which needs 110 of 95 GiB; the two-plan fit asks for 8.) Always
    at least twice the last plan's microbatches."""
    k, report = plans[-1]
    memory = report["memory_per_device"]
    room = report["hbm_per_device"] - (memory["total"] - memory["temporaries"])
    if room <= 0:
        return None
    if len(plans) == 1:
        scaled, fixed = memory["temporaries"] * k, 0.0
    else:
        k0, report0 = plans[-2]
        t0, t1 = report0["memory_per_device"]["temporaries"], memory["temporaries"]
        scaled = (t0 - t1) / (1 / k0 - 1 / k)
        fixed = t1 - scaled / k
        if scaled <= 0:
            return None  # more microbatches did not shrink the temporaries
    needed = scaled / (room - fixed) if room > fixed else math.inf
    if not math.isfinite(needed):
        return None  # what does not shrink with k alone fills the room
    return max(2 * k, 2 ** math.ceil(math.log2(max(2.0, needed))))


def _compile(base, shape: Shape, budget_flops: float, length: int, topology: str, chips: int,
             log) -> tuple:
    """(config, planner report) for ``shape`` at the budget's batch; when that does not
    fit, with the microbatches ``microbatches_to_fit`` reads from the compiles so far,
    compiled again until one fits (at most ``FIT_COMPILES`` more; each microbatch keeps a
    row a chip). The report says whether the last fits: the compiler decides, not the
    estimate."""
    batch, learning_rate = batch_rule(budget_flops, length, chips)
    k = base.optimizer.microbatches
    config = run_config(base, shape, batch, learning_rate, 1, k)
    log(f"compiling {shape.describe()} at batch {batch} for {topology} ...")
    report = aot_planner.plan(config, topology)
    plans = [(k, report)]
    for _ in range(FIT_COMPILES):
        if report["fits"] is not False:
            break
        k = microbatches_to_fit(plans)
        if k is None or chips * k > batch:
            log("  does not fit, and more microbatches would not make it fit")
            break
        # Each microbatch splits over every chip: whole multiples of chips x k.
        microbatched = max(1, round(batch / (chips * k))) * chips * k
        config = run_config(base, shape, microbatched, learning_rate, 1, k)
        log(f"  does not fit; compiling again with {k} microbatches of {microbatched // k} ...")
        report = aot_planner.plan(config, topology)
        plans.append((k, report))
    return config, report


def plan_run(base, law, budget: Budget, topology: str, log=print) -> dict:
    """The compute-optimal run for ``budget`` on ``topology``: shape, batch, and the
    planner's report (compiled for real; with more microbatches when the first does not
    fit). A chip-hours budget is lowered to the roofline's MFU where that is lower."""
    sweep.depth_keys(base)
    devices = aot_planner.topology_devices(topology)
    chips = len(devices)
    length = sum(dict(base.task_feature_lengths).values())
    compiled = {}  # shape -> (config, report)
    assumed = budget.mfu
    for round_ in range(MAX_ROUNDS):
        shape = nearest_shape(base, law.optimum(budget.flops)[0])
        if shape not in compiled:
            compiled[shape] = _compile(base, shape, budget.flops, length, topology, chips, log)
        # A shape planned before keeps its compiled batch at a slightly other budget: the
        # batch law's optimum is broad, and the report stays the one of the config given.
        config, report = compiled[shape]
        bound = report.get("roofline", {}).get("mfu")
        if budget.chip_hours is None or bound is None:
            break
        mfu = min(assumed, bound)
        if mfu == budget.mfu:
            break  # the budget is what this shape can use: consistent
        budget = Budget(budget.chip_hours * 3600 * budget.peak_flops * mfu, budget.chip_hours,
                        budget.peak_flops, mfu,
                        "--mfu" if mfu == assumed else "the roofline bound (below --mfu)")
        if round_ == MAX_ROUNDS - 1:
            break  # no round left to re-plan: the shape stays, the budget is its bound
    n_opt, d_opt = law.optimum(budget.flops)
    batch = int(config.batch_size)
    per_token = flops.train_flops_per_step(config.model, dict(base.task_feature_lengths),
                                           1) / length
    tokens = budget.flops / per_token
    steps = max(1, round(tokens / (batch * length)))
    step_s = report.get("roofline", {}).get("step_s")
    return {
        "budget": dataclasses.asdict(budget), "N_opt": n_opt, "D_opt": d_opt,
        "shape": dataclasses.asdict(shape), "batch_size": batch, "sequence_tokens": length,
        "learning_rate": float(config.optimizer.learning_rate), "flops_per_token": per_token,
        "tokens": tokens,
        "steps": steps, "microbatches": int(config.optimizer.microbatches),
        "chips": chips, "plan": report,
        "roofline_hours": steps * step_s / 3600 if step_s else None,
    }
