"""PopTorch's API on popxl_fx: ``import poptorch`` resolves here once `popxl_fx.compat` is
installed (``python -m popxl_fx.compat SCRIPT``).

`trainingModel` and `inferenceModel` return a `PoplarExecutor` running the model through
`popxl_fx.training_model` / `popxl_fx.inference_model`; `Options`, `optim`, `DataLoader`,
blocks and ops keep PopTorch's names and conventions. docs/poptorch.md lists what maps to what.
"""

from __future__ import annotations

import copy

import torch

from . import _impl, _logging, enums, optim, poptorch_core
from .args import ICustomArgParser, registerCustomArgParser
from .begin_block import BeginBlock, module_repr, removeBlocks
from .blocks import (
    Block,
    BlockFunction,
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
)
from .data import AsynchronousDataAccessor, DataLoader
from .enums import (
    AnchorMode,
    AutoStage,
    CommGroupType,
    ConnectionType,
    DataLoaderMode,
    HalfFloatCastingBehavior,
    Liveness,
    MatMulSerializationMode,
    MeanReductionStrategy,
    MultiConvPlanType,
    OutputMode,
    OverlapMode,
    ReductionType,
    SharingStrategy,
    SyncPattern,
    VariableRetrievalMode,
)
from .errors import Error, RecoverableError, UnrecoverableError
from .executor import PoplarExecutor, registerPostCompileHook, registerPreCompileHook
from .ops import (
    CPU,
    MultiConv,
    NameScope,
    cond,
    ctc_beam_search_decoder,
    custom_op,
    for_loop,
    identity_loss,
    ipu_print_tensor,
    nop,
    recomputationCheckpoint,
    serializedMatMul,
    set_available_memory,
    set_overlap_for_input,
    set_overlap_for_output,
)
from .option_groups import TensorLocationSettings
from .options import Options
from .slices import dynamic_slice, dynamic_update

__version__ = "3.3.0+popxl_fx"

__all__ = [
    "CPU",
    "ICustomArgParser",
    "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "AnchorMode",
    "AsynchronousDataAccessor",
    "AutoStage",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "CommGroupType",
    "ConnectionType",
    "DataLoader",
    "DataLoaderMode",
    "Error",
    "HalfFloatCastingBehavior",
    "Liveness",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConv",
    "MultiConvPlanType",
    "NameScope",
    "Options",
    "OutputMode",
    "OverlapMode",
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "PoplarExecutor",
    "RecoverableError",
    "ReductionType",
    "SerialPhasedExecution",
    "ShardedExecution",
    "SharingStrategy",
    "Stage",
    "SyncPattern",
    "TensorLocationSettings",
    "UnrecoverableError",
    "VariableRetrievalMode",
    "cond",
    "ctc_beam_search_decoder",
    "custom_op",
    "dynamic_slice",
    "dynamic_update",
    "enums",
    "for_loop",
    "identity_loss",
    "inferenceModel",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "ipu_print_tensor",
    "load",
    "isRunningOnIpu",
    "module_repr",
    "nop",
    "optim",
    "poptorch_core",
    "recomputationCheckpoint",
    "removeBlocks",
    "serializedMatMul",
    "setLogLevel",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
    "trainingModel",
]

isRunningOnIpu = _impl.isRunningOnIpu
setLogLevel = _logging.setLogLevel
_logging._configure()  # PopTorch's log lines, at the level POPTORCH_LOG_LEVEL names


def _user_model(model) -> torch.nn.Module:
    if isinstance(model, PoplarExecutor):
        return model._user_model
    if not isinstance(model, torch.nn.Module):
        raise Error(f"poptorch expects a torch.nn.Module, got {type(model).__name__}.")
    return model


def trainingModel(
    model, options: Options | None = None, optimizer: torch.optim.Optimizer | None = None
) -> PoplarExecutor:
    """The model's training step on the simulated IPU (default optimizer: SGD, lr=0.01)."""
    model = _user_model(model)
    return PoplarExecutor(copy.copy(model), options, True, optimizer, user_model=model)


def inferenceModel(model, options: Options | None = None) -> PoplarExecutor:
    """The model's forward on the simulated IPU."""
    model = _user_model(model)
    return PoplarExecutor(copy.copy(model), options, False, user_model=model)


def load(filename: str, edit_opts_fn=None) -> PoplarExecutor:
    """PopTorch loads a saved Poplar executable; there are none here."""
    raise Error(
        "poptorch.load is not available in popxl_fx's PopTorch layer: there are no Poplar "
        "executables to load; build the model and wrap it with trainingModel/inferenceModel."
    )


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """False: popxl_fx simulates the IPU (tests marked for hardware skip themselves)."""
    return False


def ipuHardwareVersion() -> int:
    """0: no IPU hardware."""
    return 0
