"""`poptorch.Options`: PopTorch's option setters, stored, and turned into a `popxl_fx.Options`.

Each setter returns the options (PopTorch chains them) and keeps its value under PopTorch's
attribute name (``opts.device_iterations``, ``opts.Training.gradient_accumulation``), so code
that reads them back works. `fx_options` is the one place where they become popxl_fx's
options; setters that tune only Poplar/PopART are accepted and note once that they do nothing.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import torch

from . import _notes
from .enums import (
    ConnectionType,
    MeanReductionStrategy,
    OutputMode,
    ReductionType,
    SyncPattern,
)
from .errors import Error
from .option_groups import (
    DistributedOptions,
    JitOptions,
    PopartOptions,
    PrecisionOptions,
    TensorLocationOptions,
    TrainingOptions,
    Values,
)

__all__ = ["Options"]


class Options(Values):
    """PopTorch's ``poptorch.Options`` (device iterations, replication, accumulation, output
    mode, seed, precision, tensor locations, execution strategy, and the PopART/Poplar
    settings accepted with a note)."""

    def __init__(self) -> None:
        super().__init__(
            device_iterations=1,
            replication_factor=1,
            output_mode=OutputMode.Default,
            output_return_period=1,
            random_seed=None,
            use_model=False,
            connection_type=ConnectionType.Always,
            sync_pattern=SyncPattern.Full,
            available_memory_proportion={},
            auto_round_num_ipus=False,
            enable_synthetic_data=False,
            log_cycle_count=False,
            executable_cache_dir="",
            model_name="",
            anchored_tensors={},
            input_group_size=1,
            broadcast_buffers=True,
        )
        object.__setattr__(self, "_frozen", False)
        object.__setattr__(self, "_execution_strategy", None)
        object.__setattr__(self, "Training", TrainingOptions())
        object.__setattr__(self, "Precision", PrecisionOptions())
        object.__setattr__(self, "TensorLocations", TensorLocationOptions())
        object.__setattr__(self, "Jit", JitOptions())
        object.__setattr__(self, "_Popart", PopartOptions())
        object.__setattr__(self, "Distributed", DistributedOptions())

    # the counts --------------------------------------------------------------------------
    def deviceIterations(self, device_iterations: int) -> Options:
        """Run this many steps (or forwards) per call; the inputs hold all their batches."""
        return self._set("device_iterations", _count("deviceIterations", device_iterations))

    def replicationFactor(self, replication_factor: int) -> Options:
        """Data-parallel replicas, each on its share of the batch."""
        return self._set("replication_factor", _count("replicationFactor", replication_factor))

    def inputReplicaGrouping(self, input_group_size: int, input_group_type=None) -> Options:
        if input_group_size != 1:
            raise Error(
                "Options.inputReplicaGrouping with a group size above 1 (replicas sharing "
                "their inputs) is not available in popxl_fx's PopTorch layer."
            )
        return self._set("input_group_size", 1)

    # outputs ---------------------------------------------------------------------------
    def outputMode(self, output_mode: OutputMode, output_return_period: int | None = None):
        """Which iterations' outputs a call returns (All, Final, EveryN, Sum, Default)."""
        mode = OutputMode(output_mode)
        if mode == OutputMode.EveryN:
            if output_return_period is None or output_return_period < 1:
                raise ValueError(
                    "OutputMode.EveryN needs output_return_period, a positive number of "
                    "iterations between the outputs returned."
                )
        self._set("output_mode", mode)  # a period given with another mode is not used
        return self._set("output_return_period", output_return_period or 1)

    anchorMode = outputMode  # PopTorch's older name

    def defaultOutputMode(self) -> bool:
        """True while the output mode is left at Default (Final to train, All to infer)."""
        return self.output_mode == OutputMode.Default

    def anchorTensor(self, short_name: str, long_name: str, output_mode=None, period=1):
        raise Error(
            "Options.anchorTensor reads a tensor by its PopART name; popxl_fx's PopTorch layer "
            "has no PopART IR, so its tensors have no such names."
        )

    # the device -------------------------------------------------------------------------
    def useIpuModel(self, use_model: bool) -> Options:
        """True: popxl_fx's ``device="ipu_model"`` (runs when over an IPU's memory, with a
        warning); False: ``"ipu_hw"`` (a program over the memory raises)."""
        return self._set("use_model", bool(use_model))

    def randomSeed(self, random_seed: int) -> Options:
        """Seed torch's generator before the first run, which the program's random ops use."""
        if not isinstance(random_seed, int) or isinstance(random_seed, bool):
            raise ValueError(f"randomSeed({random_seed!r}): give an int.")
        return self._set("random_seed", random_seed)

    def setAvailableMemoryProportion(self, available_memory_proportion: dict) -> Options:
        if not isinstance(available_memory_proportion, dict):
            raise ValueError("setAvailableMemoryProportion takes a dict such as {'IPU0': 0.3}.")
        _notes.note("Options.setAvailableMemoryProportion", "the simulator plans no tiles")
        return self._set("available_memory_proportion", dict(available_memory_proportion))

    def setExecutionStrategy(self, strategy) -> Options:
        """Pipelined, Sharded or Phased execution of the model's blocks (`blocks`)."""
        from .blocks import ExecutionStrategy

        if not isinstance(strategy, ExecutionStrategy):
            raise TypeError(
                "setExecutionStrategy takes poptorch.PipelinedExecution, ShardedExecution, "
                f"SerialPhasedExecution or ParallelPhasedExecution, not {type(strategy).__name__}."
            )
        self._check_not_frozen()
        object.__setattr__(self, "_execution_strategy", strategy)
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:
        return self._set("auto_round_num_ipus", bool(auto_round_num_ipus))

    def connectionType(self, connection_type: ConnectionType) -> Options:
        return self._set("connection_type", ConnectionType(connection_type))

    def syncPattern(self, sync_pattern: SyncPattern) -> Options:
        return self._set("sync_pattern", SyncPattern(sync_pattern))

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Options:
        _notes.note("Options.useOfflineIpuTarget", "the simulator always compiles offline")
        return self._set("connection_type", ConnectionType.Never)

    def enableSyntheticData(self, enabled: bool) -> Options:
        if enabled:
            raise Error(
                "Options.enableSyntheticData(True) makes PopTorch skip the host transfers and "
                "return no real outputs; popxl_fx's PopTorch layer always streams the data."
            )
        return self._set("enable_synthetic_data", False)

    # accepted, with a note --------------------------------------------------------------
    def enableExecutableCaching(self, path: str) -> Options:
        _notes.note("Options.enableExecutableCaching", "programs are cached in the process")
        return self._set("executable_cache_dir", path)

    def logCycleCount(self, log_cycle_count: bool) -> Options:
        _notes.note("Options.logCycleCount", "read the estimate from the executor's report()")
        return self._set("log_cycle_count", bool(log_cycle_count))

    def modelName(self, name: str) -> Options:
        return self._set("model_name", name)

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Options:
        return self._set("broadcast_buffers", bool(broadcast_buffers))

    def _accepted(self, name: str, why: str | None = None):
        def setter(*args, **kwargs) -> Options:
            _notes.note(f"Options.{name}", *(() if why is None else (why,)))
            return self

        return setter

    def __getattr__(self, name: str) -> Any:
        if name in _ACCEPTED:
            return self._accepted(name, _ACCEPTED[name])
        return super().__getattr__(name)

    # PopTorch's bookkeeping -------------------------------------------------------------
    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    def _check_not_frozen(self) -> None:
        if self._frozen:
            raise AttributeError(
                "These options are frozen: they belong to a compiled PopTorch model; call "
                "opts.clone() and change the copy."
            )

    def _set(self, name: str, value: Any) -> Options:
        self._check_not_frozen()
        return super()._set(name, value)

    def __deepcopy__(self, memo: dict) -> Options:
        """A deep copy is unfrozen, as PopTorch's is (a copy is the user's to change)."""
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        for key, value in self.__dict__.items():
            value = False if key == "_frozen" else copy.deepcopy(value, memo)
            object.__setattr__(twin, key, value)
        return twin

    def clone(self) -> Options:
        """An unfrozen deep copy."""
        twin = copy.deepcopy(self)
        object.__setattr__(twin, "_frozen", False)
        return twin

    def toDict(self) -> dict[str, Any]:
        """The values set, PopTorch-style (for logging)."""
        out = dict(self._settings)
        for group in ("Training", "Precision", "TensorLocations", "Distributed"):
            out.update({f"{group}.{k}": v for k, v in getattr(self, group)._settings.items()})
        return out

    def from_json(self, string: str) -> None:
        for key, value in json.loads(string).items():
            self._settings[key] = value

    # the mapping ------------------------------------------------------------------------
    @property
    def effective_output_mode(self) -> OutputMode:
        return self.output_mode

    def reduction(self) -> ReductionType:
        return self.Training.accumulation_and_replication_reduction_type

    def mean_strategy(self) -> MeanReductionStrategy:
        return self.Training.mean_accumulation_and_replication_reduction_strategy

    def partials_type(self) -> torch.dtype | None:
        return self.Precision.partials_type


# setters that tune only PopART/Poplar (or the log): accepted with a once-only note
_ACCEPTED = {
    "sourceLocationExcludes": "it filters PopART's debug locations",
    "appendToLocationExcludes": "it filters PopART's debug locations",
    "showCompilationProgressBar": None,
    "relaxOptimizerAttributesChecks": None,
    "logDir": None,
    "maxRepeatLogs": None,
    "enableStableNorm": None,
    "enableProfiling": "read the simulator's report() instead",
    "disableModuleNamescope": None,
    "updatableNamedBuffers": None,
    "useIpuId": "there is one simulated device",
    "loadFromFile": None,
}


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Options.{name}({value!r}): give a positive int.")
    return value
