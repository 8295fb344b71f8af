"""``PoplarExecutor``: what ``poptorch.trainingModel`` / ``inferenceModel`` return, on
`popxl_fx.training_model` / `popxl_fx.inference_model`.

As in PopTorch, the device holds its own copy of the model's weights and buffers, written on
attach and copied to and from the model as PopTorch copies it (`executor_weights`).
"""

from __future__ import annotations

import copy
import datetime
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

import popxl_fx

from . import (
    _logging,
    batch_norm,
    batching,
    begin_block,
    binding,
    blocks,
    group_norm,
    optim,
    optim_attrs,
    optim_map,
    wrapping,
)
from .build_checks import check_broadcast_buffers, check_updatable_buffers, checked_build
from .call_plan import CallPlan
from .device_copy import DeviceCopy
from .dtypes import ipu_outputs
from .enums import ConnectionType, OutputMode, ReductionType
from .errors import Error, eager_errors
from .executor_device import DeviceLink
from .executor_optim import OptimizerLink
from .executor_outputs import TrainingOutputs, fetches_outputs
from .executor_weights import WeightsLink
from .fx_options import fx_options
from .input_checks import InputSignature
from .options import Options
from .synthetic import SyntheticInputs
from .wrapper import Wrapped, flat_call

__all__ = ["PoplarExecutor", "registerPostCompileHook", "registerPreCompileHook"]

_PRE_COMPILE: OrderedDict = OrderedDict()  # RemovableHandle keeps a weak reference
_POST_COMPILE: OrderedDict = OrderedDict()


def registerPreCompileHook(hook) -> torch.utils.hooks.RemovableHandle:
    """Call ``hook()`` before each executor compiles its program."""
    if not callable(hook):
        raise RuntimeError("Pre-compile hook must be callable")
    handle = torch.utils.hooks.RemovableHandle(_PRE_COMPILE)
    _PRE_COMPILE[handle.id] = hook
    return handle


def registerPostCompileHook(hook) -> torch.utils.hooks.RemovableHandle:
    """Call ``hook()`` after each executor has compiled its program."""
    if not callable(hook):
        raise RuntimeError("Post-compile hook must be callable")
    handle = torch.utils.hooks.RemovableHandle(_POST_COMPILE)
    _POST_COMPILE[handle.id] = hook
    return handle


class PoplarExecutor(OptimizerLink, TrainingOutputs, WeightsLink, DeviceLink):
    """A PopTorch model on the simulated IPU: call it like the model."""

    def __init__(
        self,
        model: nn.Module,
        options: Options | None,
        training: bool,
        optimizer: torch.optim.Optimizer | None = None,
        user_model: nn.Module | None = None,
    ) -> None:
        self._user_model = user_model or model
        self._attached = False
        self._device = DeviceCopy(model)  # PopTorch's IPU memory (`executor_weights`)
        self._training = training
        self._options = _frozen_copy(options, training)
        if training and optimizer is None:
            optimizer = optim.SGD(self._user_model.parameters(), lr=0.01)  # PopTorch's default
        self._optimizer = optimizer
        self._attrs = optim_attrs.AttributeTracker(self._options._relax_optimizer_attributes_checks)
        if training:
            self._take_optimizer(optimizer, compiled=False)
            wrapping.wrap(self._user_model, self)
        rules = group_norm.rules(self._options._Popart.options) + batch_norm.rules(training)
        self._wrapped = Wrapped(model, training, _loss_factor(self._options, training), rules)
        self._impl = None  # the popxl_fx trainer / inference model, made on compile
        self._plan: CallPlan | None = None  # the last full call's, for calls like it
        self._outputs_supported = True
        self._synthetic = SyntheticInputs(self._options.random_seed)

    # PopTorch's API ----------------------------------------------------------------------
    @eager_errors
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plan = self._plan
        if plan is not None and plan.repeats and self._attached:
            if plan.holds(self._impl, args, kwargs):
                return self._repeat(plan, args)
        swap = self._to_device()
        try:
            if plan is not None and plan.holds(self._impl, args, kwargs):
                out = self._planned_call(plan, args)
            else:
                raw = self._call(*args, **kwargs)
                self._plan = CallPlan.after(self, args, kwargs, raw)
                out = ipu_outputs(raw)
        except BaseException:
            self._off_device(swap)
            raise
        # a training call leaves the host stale until it is read: the device's tensors stay
        self._off_device(swap, park=self._training)
        self._dirty_host_weights = self._training
        return self._wrapped.custom.rebuild(out)

    def _repeat(self, plan: CallPlan, args: tuple) -> Any:
        """An attached training call like the planned one whose outputs the plan's getter
        gives (`CallPlan.repeats`: no rows to move, no 64-bit or custom-typed outputs): the
        work of `__call__` without the cases it does not have, for a step of a fraction of
        a millisecond. A step that rebuilt its program takes the full path's outputs."""
        impl = plan.impl
        self._busy += 1
        try:
            swap = self._device.swap_in()
            try:
                out = self._planned_call(plan, args)
                if impl._active is not plan.program:  # rebuilt: the full path's outputs
                    out = self._wrapped.custom.rebuild(out)
            except BaseException:
                swap.out()
                raise
            self._device.park(swap)  # the host is stale until it is read (`DeviceCopy.park`)
        finally:
            self._busy -= 1
        self._dirty_host_weights = True
        return out

    def _planned_call(self, plan: CallPlan, args: tuple) -> Any:
        """A call like the planned one (`call_plan`): its inputs need no binding or checks."""
        impl = plan.impl
        loss = self._run(impl, plan.inputs(self, args))
        if impl._active is not plan.program:  # the step rebuilt: the full path's outputs
            return ipu_outputs(self._step_outputs(impl, loss))
        out = self._step_outputs(impl, loss) if plan.outputs is None else plan.outputs(impl.last)
        return ipu_outputs(out) if plan.narrow else out

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        if self._options.connection_type == ConnectionType.Never:  # PopTorch asserts this
            raise AssertionError(
                "Trying to run a model on an offline device (ConnectionType.Never): use "
                "model.compile(inputs) instead of model(inputs)"
            )
        args = self._flat_inputs(args, kwargs)
        impl = self._ensure_impl()
        if impl._active is None:  # PopTorch checks its pipeline when it compiles
            self._build(impl, args)
        return self._step_outputs(impl, self._run(impl, args))

    def _run(self, impl, inputs: tuple) -> Any:
        """One step of ``impl`` on its flat ``inputs`` (attached), as ``impl`` returns it."""
        self._attached = True
        self._take_loaded_state(impl)
        return impl(*inputs)

    def _step_outputs(self, impl, out: Any) -> Any:
        if self._training:
            return self._training_outputs(impl, out)
        if self._options.replication_factor > 1:  # one value per replica, as PopTorch
            leaves = self._per_replica(impl.per_replica, impl.options, False)
            return impl._active.lowered.fxm.unflatten(leaves)
        return batching.select_outputs(out, self._options, self._options.device_iterations)

    @eager_errors
    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Build the program for these inputs without running it."""
        with self._on_device():
            args = self._flat_inputs(args, kwargs)
            self._build(self._ensure_impl(), args)
            self._attached = True

    def _build(self, impl, args: tuple) -> None:
        if self._options._Popart.options["instrumentWithHardwareCycleCounter"]:
            raise Error("Cycle count logging is only supported on actual IPU hardware.")
        for hook in list(_PRE_COMPILE.values()):
            hook()
        updatable = self._options._Popart.options.get("updatableNamedBuffers")
        check_updatable_buffers(updatable, self._user_model)
        start = datetime.datetime.now()
        checked_build(lambda: impl.build(*args), self._wrapped.model)
        check_broadcast_buffers(self._options, impl._active.lowered.fxm)
        self._compilation_time = datetime.datetime.now() - start
        self._share_optimizer_state(impl)
        self._check_blocks()
        self._check_outputs(impl)
        for hook in list(_POST_COMPILE.values()):
            hook()

    def _flat_inputs(self, args: tuple, kwargs: dict) -> tuple:
        """The call's tensors, flat and split by device iteration. Once compiled, the inputs
        must be those compiled for (PopTorch's error); a new structure after ``destroy()``
        gets a new program."""
        tensors, call = flat_call(args, kwargs)
        tensors = [_detached(t) for t in tensors]
        bound = binding.bind(getattr(self._user_model, "forward", self._user_model), args, kwargs)
        if self.isCompiled():
            self._signature.check(tensors, call, bound)
        self._signature: InputSignature = InputSignature(tensors, call, bound)
        if not self._signature.same_call(self._wrapped.call):
            if self._wrapped.call is not None:
                self._impl = None
            self._wrapped.call = call
        if self._options.enable_synthetic_data:  # the device's own inputs, none from the host
            tensors = list(self._synthetic(tuple(tensors)))
        args = batching.split_iterations(tuple(tensors), self._options, self._training)
        return batching.replica_major(args, self._options, self._training)

    def _check_outputs(self, impl) -> None:
        """A phased or batch-serialised training step fetches only the loss: a model
        returning more raises before any step, rather than returning less."""
        if not self._training or fetches_outputs(impl.options):
            return
        outputs = impl._active.lowered.fxm.out_spec.num_leaves - 1
        if outputs > 1:
            raise Error(
                f"{type(self._user_model).__name__}.forward returns {outputs} outputs; with "
                "phased execution, popxl_fx's PopTorch layer returns only the loss of a "
                "trainingModel (its phased step does not fetch the other outputs): return "
                "only the loss."
            )

    def _check_blocks(self) -> None:
        """PopTorch's pipeline rules on the blocks: BeginBlock marks (in module order) and
        the Block scopes the forward entered."""
        seen = begin_block.marked_blocks(self._user_model)
        seen += [b for b in self._wrapped.blocks if b not in seen]
        blocks.check_pipeline(self._options, seen, self._training)

    def isCompiled(self) -> bool:
        return self._impl is not None and self._impl._active is not None

    @property
    def model(self) -> nn.Module:
        return self._user_model

    @property
    def options(self) -> Options:
        return self._options

    @property
    def training(self) -> bool:
        return self._training

    def report(self):
        """The simulator's memory and cycle report (what PopTorch's profiler showed)."""
        if self._impl is None:
            raise Error("the model has not been compiled yet: call it (or compile()) first.")
        return self._impl.report()

    def __repr__(self) -> str:
        """The model's repr with its BeginBlock marks, as PopTorch prints an executor."""
        return begin_block.module_repr(self._user_model)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_user_model", "_impl"):
            raise AttributeError(name)
        return getattr(self._user_model, name)

    def load_state_dict(self, state_dict, strict: bool = True):
        out = self._user_model.load_state_dict(state_dict, strict)
        if self._attached:  # PopTorch writes the loaded weights to the device
            self.copyWeightsToDevice()
        return out

    def state_dict(self, *args, **kwargs):
        return self._user_model.state_dict(*args, **kwargs)

    # building ----------------------------------------------------------------------------
    def _ensure_impl(self):
        if self._impl is not None:
            return self._impl
        if self._options.random_seed is not None:
            torch.manual_seed(self._options.random_seed)
        fx = fx_options(self._options, self._training)
        if not self._training:
            self._impl = popxl_fx.inference_model(self._wrapped, fx)
            return self._impl
        view = optim_map.torch_view(self._optimizer)
        optim_map.check_accum_type(self._optimizer, fx.gradient_accumulation)
        # PopTorch scales every model's loss by the optimizer's loss_scaling
        fx = fx.replace(loss_scaling=optim_map.loss_scaling(self._optimizer))
        outputs = fetches_outputs(fx)
        # PopTorch trains a loss that reaches no trainable parameter (PopART has no
        # gradient to apply): the step runs and updates nothing
        self._impl = popxl_fx.Trainer(
            self._wrapped, view, None, fx, outputs=outputs, untrained_ok=True
        )
        return self._impl


def _loss_factor(options: Options, training: bool) -> float:
    """Sum reduction adds the micro-batches' and replicas' gradients: the mean's gradient
    times their count."""
    if not training or options.reduction() != ReductionType.Sum:
        return 1.0
    return float(options.Training.gradient_accumulation * options.replication_factor)


def _detached(x: Any) -> Any:
    """An input as PopTorch takes it: one that requires grad is detached, saying so."""
    if isinstance(x, torch.Tensor) and x.requires_grad:
        _logging.console().warning(
            "Input tensor has requires_grad=True set. This tensor will be detached because "
            "backward pass via inputs is not supported."
        )
        return x.detach()
    return x


def _frozen_copy(options: Options | None, training: bool) -> Options:
    if options is None:
        options = Options()
    elif not isinstance(options, Options):
        raise Error(
            f"Invalid type: 'options' is of type {type(options)} (Expected poptorch.Options)"
        )
    if options.Distributed.numProcesses > 1:
        raise Error(
            "Options.Distributed: an executor of popxl_fx's PopTorch layer runs one process "
            f"(not {options.Distributed.numProcesses}); its replicas live in it "
            "(replicationFactor), or run popxl_fx itself under torchrun."
        )
    if options.anchored_tensors:
        raise Error(
            "Options.anchorTensor reads a tensor by its PopART name; popxl_fx's PopTorch layer "
            "has no PopART IR, so its tensors have no such names."
        )
    options._freeze()
    options = options.clone()
    if options.defaultOutputMode():  # train: the last result; infer: all of them
        options.outputMode(OutputMode.Final if training else OutputMode.All)
    if not training and options.Training.gradient_accumulation != 1:
        raise Error(
            "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it "
            "as its default value (1) when running a poptorch.inferenceModel()."
            + _pipelined_hint(options)
        )
    options._freeze()
    return options


def _pipelined_hint(options) -> str:
    if not isinstance(options._execution_strategy, blocks.PipelinedExecution):
        return ""
    return (
        " Use poptorch.Options().deviceIterations to process a sufficient number of batches "
        "each run for pipelined execution instead."
    )


def shallow_copy(model: nn.Module) -> nn.Module:
    """PopTorch's copy of the model: the same parameters and submodules, its own flags."""
    return copy.copy(model)
