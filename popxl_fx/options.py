"""`Options`: how popxl_fx builds and runs a traced model on the simulated IPU.

Each field but ``device`` switches on one IR transform of the build pipeline; the PopTorch /
PopXL name each corresponds to is given beside it. Fields are checked when the `Options` is
made (types, ranges, combinations); sizes that depend on the model or batch are checked when
the program is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from popxl_core.sim.options import DEFAULT as DEFAULT_COMPILE
from popxl_core.sim.options import CompileOptions

from .refusals import AUTO_CHOOSES, refuse

__all__ = [
    "AUTO_CHOOSES",
    "DEVICES",
    "KERNELS",
    "NUMERICS",
    "PARTIALS",
    "PHASE_KINDS",
    "PRECISIONS",
    "RNGS",
    "Options",
    "resolve",
]

DEVICES = ("ipu_hw", "ipu_model", "cpu")
PRECISIONS = ("float32", "float16")
RNGS = ("torch", "ipu")
KERNELS = ("table", "inductor")
NUMERICS = ("torch", "ipu")
PARTIALS = ("", "float", "half")
_COUNTS = (
    "gradient_accumulation",
    "device_iterations",
    "batch_serialisation",
    "replication_factor",
)


@dataclass(frozen=True)
class Options:
    """Build and run options for `training_model`, `inference_model` and `compile`.

    Args:
        device: the Session's target. ``"ipu_hw"`` (default) is as faithful as the simulator
            can be: a program that does not fit one IPU raises an out-of-memory error when it is
            compiled, before any step. ``"ipu_model"`` runs anyway and warns; ``"cpu"`` ignores
            IPU limits.
        outline: ``"auto"``: repeated identical submodules (same class, parameter shapes and
            dtypes, input specs) become one graph called once per instance, each call with its
            own variables bound (PopXL outlining, addons ``Module.call_module``/``bind``); a
            list of module names or classes outlines those; ``False`` (default) inlines all.
            Outlining runs the same kernels; the default stays ``False`` (bit for bit with
            eager for every model) because a block given one tensor twice sums that
            tensor's gradients in another order (last bit) and each block draws dropout
            masks from its own seed. See `popxl_fx.outline`.
        recompute: rebuild each outlined block's forward in its backward instead of keeping
            its activations (PopXL ``recompute_graph``; PopTorch ``recomputationCheckpoint``).
        gradient_accumulation: split each batch into this many consecutive micro-batches,
            mean-accumulate their gradients, one optimizer step per call; the loss returned is
            the mean of the micro-batch losses; batch norm normalises per micro-batch
            (PopTorch ``gradientAccumulation``; `training_model` only).
        device_iterations: run this many steps per call; inputs carry a leading dimension of
            this size and one loss per step is returned; hyper-parameters are read once per
            call (PopTorch ``deviceIterations``; `training_model` and `inference_model`, whose
            outputs then have the leading dimension too).
        batch_serialisation: process each micro-batch in this many slices, activations through
            remote buffers, gradients mean-accumulated over the slices, one optimizer step
            (PopXL batch serialisation, addons ``batch_serialise_fwd_and_grad``;
            `popxl_fx.batch_serial`). Batch norm statistics are per slice.
        replication_factor: data-parallel replicas; each gets its share of the batch (dim 0
            of every input, in batch order), the gradients are mean all-reduced and every
            replica applies the same update; the loss returned is the mean of the replicas'
            losses, inference outputs come back concatenated in batch order, BatchNorm
            statistics are per replica and the torch model gets replica 0's (PopTorch
            ``replicationFactor``, PopXL ``Ir(replication=)``). Not for ``compile``. Under
            torchrun (P processes) each process runs R/P replicas and passes its own share
            of the batch, split over its replicas; loss and outputs are all R replicas'
            (`popxl_core.distributed`, examples/fx_distributed.py).
        replicated_tensor_sharding: shard optimizer state across the replicas, ``ceil(n/R)``
            elements each (reduce-scatter gradients, sharded update, all-gather weights;
            PopXL RTS, ``addons.rts``); training_model only.
        precision: ``"float32"`` (default, bit for bit with eager) or ``"float16"``: the model
            traced in float16 (PopTorch ``model.half()``), its weights cast per step from
            float32 master variables, gradients accumulated and the optimizer (and its state)
            in float32 (`popxl_fx.precision`).
        loss_scaling: static loss scale: the backward starts from ``loss_scaling`` and the
            gradients are divided by it in float32 before the optimizer (PopTorch's optimizers'
            ``loss_scaling``, for every model: with ``precision="float16"`` or a
            ``model.half()`` model the float16 gradients are computed scaled).
        phased_execution: keep each phase's parameters and optimizer state in Streaming
            Memory (remote buffers) and run the step phase by phase: load a phase's weights,
            run its forward; then, in reverse, reload them, run its backward and its optimizer
            update on loaded state, store weights and state back (PopXL phased execution,
            addons ``named_variable_buffers``/``remote_load``/``remote_store``). Phases:
            ``"blocks"`` (the repeated blocks ``outline="auto"`` finds), ``"children"`` (the
            model's top-level children; a ModuleList's items in its place), ``"marked"`` (the
            modules marked with ``popxl_fx.phase(module)``) or a list of module names; the
            code between phases runs as phases of its own. ``False`` (default): everything on chip.
        memory: ``"auto"``: when the program does not fit the device's IPU memory, search
            phased execution, RTS (with replication), outlining with recomputation and
            gradient accumulation with the simulator's planner (weightless what-if builds)
            and train with the plan that fits with the lowest estimated step time
            (`popxl_fx.auto`); a model that fits is left unchanged, and when nothing fits the
            error gives the best plan's shortfall. It chooses those options itself: setting
            them too raises. The default (an empty mapping) plans nothing.
        rng: where random ops in train mode (dropout, ``torch.rand*``, ``bernoulli``) draw
            from. ``"torch"`` (default): torch's default generator, in eager's order, so with
            the same ``torch.manual_seed`` the masks equal eager's and train-mode results are
            eager's bit for bit. ``"ipu"``: the simulator's own seeded stream (PopXL's seed
            tensors, split per op: the same numbers every run for a given seed, whatever torch
            does; its masks differ from eager's).
        compiler: the simulator's compile passes (`popxl_core.sim.CompileOptions`, every
            pass on by default, each bit for bit with the reference interpreter);
            ``CompileOptions(interpret=True)`` runs the plain interpreter instead (tests).
        kernels: ``"table"`` (default): the op table's kernels, eager's numbers bit for bit.
            ``"inductor"``: the whole step (forward, backward and optimizer update) is handed
            to ``torch.compile`` as one function (inductor fuses its elementwise chains); a
            program with a random draw, a collective or a remote transfer compiles only its
            called graphs without them, and its update keeps the table kernels. Not bitwise:
            inductor rounds fused arithmetic its own way (tolerance in
            tests/test_inductor_kernels.py); the first step compiles (seconds to minutes;
            cached on disk across processes as torch.compile's compilations are).
        numerics: ``"torch"`` (default): torch's own kernels, eager's numbers bit for bit.
            ``"ipu"``: what a PopXL program computes on the IPU: the simulator's IPU numerics
            (``popxl_core.Ir.numerics``: a MatMul row independent of the batch size,
            transcendental ops on whole SIMD blocks, float16 computed in float32),
            ``nn.Linear`` as MatMul then Add, and ``F.cross_entropy``'s gradient in one op
            (PopART's NlllWithSoftmaxGradDirect, `popxl_core.ops.nll_direct`); eager to
            float32 round-off. With it seed 003's MLP as an ``nn.Sequential`` trains bit for
            bit like the hand-written seed (tests/test_fx_seed003_torch.py).
        narrow_64bit: ``True``: the IPU's types, as PopTorch has them. int64 and float64
            inputs enter the program as int32 and float32, so a float64 input compares and
            computes as float32. The model is still traced on the inputs as given, so an op
            that wants int64 indices gets them. ``False`` (default): inputs keep their dtype,
            eager's numbers. `training_model` and `inference_model` only (not phased yet).
        partials_type: what float16 convolutions (and their gradients) accumulate in, PopART's
            ``convolutionOptions`` ``partialsType``. ``""`` (default): as ``numerics`` says
            (``"torch"``: torch's float16 kernels, eager's bits). ``"float"``: computed in
            float32 from the float16 operands and rounded once, as Poplar's default float
            partials (PopTorch's `Precision.setPartialsType`); much faster on the CPU than
            torch's float16 weight gradient. ``"half"``: as ``"float"``: the simulator
            does not round partial sums to float16 (`popxl_core.ops._conv_partials`).

    Example:
        >>> Options(device="cpu").device
        'cpu'
        >>> Options(gradient_accumulation=4, replication_factor=2).batch_divisor
        8
    """

    device: str = "ipu_hw"
    outline: bool | str | tuple = False
    recompute: bool = False
    gradient_accumulation: int = 1
    device_iterations: int = 1
    batch_serialisation: int = 1
    replication_factor: int = 1
    replicated_tensor_sharding: bool = False
    precision: str = "float32"
    loss_scaling: float = 1.0
    phased_execution: bool | str | tuple = False
    memory: dict[str, Any] | str = field(default_factory=dict)
    rng: str = "torch"
    kernels: str = "table"
    numerics: str = "torch"
    partials_type: str = ""
    compiler: CompileOptions = DEFAULT_COMPILE
    narrow_64bit: bool = False

    def __post_init__(self) -> None:
        _check_choice("device", self.device, DEVICES)
        _check_choice("rng", self.rng, RNGS)
        _check_choice("kernels", self.kernels, KERNELS)
        _check_choice("numerics", self.numerics, NUMERICS)
        _check_choice("partials_type", self.partials_type, PARTIALS)
        _check_choice("precision", self.precision, PRECISIONS)
        if not isinstance(self.compiler, CompileOptions):
            raise TypeError(
                f"Options(compiler={self.compiler!r}): give a popxl_core.sim.CompileOptions."
            )
        for name in _COUNTS:
            _check_count(name, getattr(self, name))
        for name in ("recompute", "replicated_tensor_sharding", "narrow_64bit"):
            _check_bool(name, getattr(self, name))
        object.__setattr__(self, "outline", _outline_value(self.outline))
        object.__setattr__(self, "phased_execution", _phases_value(self.phased_execution))
        self._check_combinations()
        _check_memory(self)

    def _check_combinations(self) -> None:
        if isinstance(self.loss_scaling, bool) or not isinstance(self.loss_scaling, (int, float)):
            raise TypeError(f"Options(loss_scaling={self.loss_scaling!r}): give a number.")
        if not self.loss_scaling > 0:
            raise ValueError(f"Options(loss_scaling={self.loss_scaling}): must be > 0.")
        refuse("options", self)  # fields that contradict each other: `refusals`

    @property
    def batch_divisor(self) -> int:
        """What a training batch must divide by: micro-batches x slices x replicas."""
        return self.gradient_accumulation * self.batch_serialisation * self.replication_factor

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes`` (checked like a new `Options`)."""
        return dataclasses.replace(self, **changes)

    def key(self) -> tuple:
        """What a compiled program depends on (part of the compile cache key)."""
        values = [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "memory"]
        memory = self.memory if isinstance(self.memory, str) else tuple(sorted(self.memory.items()))
        return (*values, memory)


def _check_choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"Options({name}={value!r}): must be one of {choices}.")


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Options({name}={value!r}): give a positive int.")
    if value < 1:
        raise ValueError(f"Options({name}={value}): must be 1 or more (1 switches it off).")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"Options({name}={value!r}): give True or False.")


def _outline_value(value: object) -> bool | str | tuple:
    """``False``, ``"auto"`` or a tuple of module names (str) and classes."""
    if value is False or value == "auto":
        return value
    if value is True:
        return "auto"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(
            f"Options(outline={value!r}): give 'auto', False, or a non-empty list of module "
            "names (as in model.named_modules()) or nn.Module classes."
        )
    for item in value:
        if not isinstance(item, (str, type)):
            raise TypeError(f"Options(outline=...): {item!r} is neither a module name nor a class.")
    return tuple(value)


PHASE_KINDS = ("blocks", "children", "marked")


def _check_memory(options: Options) -> None:
    """Only the value: what memory='auto' combines with is in `refusals`."""
    memory = options.memory
    if memory != "auto" and not (isinstance(memory, dict) and not memory):
        raise ValueError(f"Options(memory={memory!r}): give 'auto' (or leave it unset).")


def _phases_value(value: object) -> bool | str | tuple:
    """``False``, ``"blocks"``, ``"children"`` or a tuple of module names (checked against the
    model when the program is built)."""
    if value is False or value in PHASE_KINDS:
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(
            f"Options(phased_execution={value!r}): give 'blocks', 'children', 'marked', False, "
            "or a non-empty list of module names (as in model.named_modules())."
        )
    for item in value:
        if not isinstance(item, str) or not item:
            raise TypeError(
                f"Options(phased_execution=...): {item!r} is not a module name (a non-empty str)."
            )
    return tuple(value)


def resolve(options: Options | None) -> Options:
    """``options`` or the defaults; rejects anything that is not an `Options` (what the
    pipeline cannot honour yet is refused by `refusals`, never silently ignored)."""
    if options is None:
        return Options()
    if not isinstance(options, Options):
        raise TypeError(f"options must be a popxl_fx.Options, got {type(options).__name__}.")
    return options
