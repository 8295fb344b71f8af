"""`poptorch.Options`: PopTorch's option setters, stored as PopTorch stores them.

Values live under PopTorch's names (``opts.device_iterations``,
``opts.Training.gradient_accumulation``, PopART's names in ``opts._Popart.options``), so code
that reads them back, prints them, copies them or serialises them with `toDict` sees what it
would under PopTorch. `fx_options` is the one place where they become popxl_fx's options;
setters that tune only Poplar/PopART are kept and note once that they do nothing here.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from . import _notes, blocks
from .enums import ConnectionType, MeanReductionStrategy, OutputMode, ReductionType, SyncPattern
from .errors import Error
from .option_files import ConfigFileError, from_json, load_from_file
from .option_groups import (
    TensorLocationSettings,
    _DistributedOptions,
    _JitOptions,
    _PopartOptions,
    _PrecisionOptions,
    _TensorLocationOptions,
    _TrainingOptions,
)
from .options_dict import OptionsDict

__all__ = [
    "ConfigFileError",
    "Options",
    "TensorLocationSettings",
    "_DistributedOptions",
    "_JitOptions",
    "_PopartOptions",
    "_PrecisionOptions",
    "_TensorLocationOptions",
    "_TrainingOptions",
]

_GROUPS = ("Distributed", "Jit", "Precision", "TensorLocations", "Training", "_Popart")


class Options(OptionsDict):
    """PopTorch's ``poptorch.Options`` (device iterations, replication, accumulation, output
    mode, seed, precision, tensor locations, execution strategy, and the PopART/Poplar
    settings kept with a note). ``POPTORCH_DEFAULT_OPTIONS`` (JSON) presets them."""

    def __init__(self) -> None:
        self._popart = _PopartOptions()
        self._jit = _JitOptions()
        self._precision = _PrecisionOptions(self._popart)
        self._training = _TrainingOptions(self._popart)
        self._distributed = _DistributedOptions()
        self._tensor_locations = _TensorLocationOptions()
        # PopTorch's default
        self._execution_strategy: blocks.ExecutionStrategy = blocks.PipelinedExecution()
        self._source_location_excludes = ["install/poptorch", "site-packages/torch"]
        self._relax_optimizer_attributes_checks = False
        self._show_compilation_progress_bar = True
        self._module_namescope_enabled = True
        super().__init__(**_defaults())
        if os.environ.get("POPTORCH_CACHE_DIR"):
            self.enableExecutableCaching(os.environ["POPTORCH_CACHE_DIR"])
        self.from_json(os.environ.get("POPTORCH_DEFAULT_OPTIONS", "{}"))

    # the groups ------------------------------------------------------------------------
    @property
    def Training(self) -> _TrainingOptions:
        return self._training

    @property
    def Precision(self) -> _PrecisionOptions:
        return self._precision

    @property
    def TensorLocations(self) -> _TensorLocationOptions:
        return self._tensor_locations

    @property
    def Jit(self) -> _JitOptions:
        return self._jit

    @property
    def Distributed(self) -> _DistributedOptions:
        return self._distributed

    @property
    def _Popart(self) -> _PopartOptions:
        return self._popart

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
            assert output_return_period and output_return_period > 0, (
                "EveryN anchor must have output_return_period set to valid positive integer"
            )
        # a period given with another mode is not used, as in PopTorch
        self.set(output_mode=mode, output_return_period=output_return_period or 1)
        return self

    anchorMode = outputMode  # PopTorch's older name

    def defaultOutputMode(self) -> bool:
        """True while the output mode is left at Default (Final to train, All to infer)."""
        return self.output_mode == OutputMode.Default

    def anchorTensor(self, short_name: str, long_name: str, output_mode=None, period=1):
        """Kept, as PopTorch keeps it; an executor refuses it (PopART tensor names)."""
        if output_mode != OutputMode.EveryN:
            period = 1
        self.checkIsFrozen()
        self.anchored_tensors[short_name] = [long_name, output_mode is None, output_mode, period]

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

    @property
    def random_seed(self) -> int | None:
        """The seed set (None: not set; PopTorch adds the option only when it is set)."""
        return self._values.get("random_seed")

    def setAvailableMemoryProportion(self, available_memory_proportion: dict) -> Options:
        if not isinstance(available_memory_proportion, dict):
            raise ValueError("setAvailableMemoryProportion takes a dict such as {'IPU0': 0.3}.")
        for key in available_memory_proportion:
            assert key.startswith("IPU"), (
                'Available memory proportions are expected to be in a dictionary of {"IPU0": '
                f"0.5}} where the 0 in IPU is the index of the IPU. Invalid key: {key}"
            )
        _notes.note("Options.setAvailableMemoryProportion", "the simulator plans no tiles")
        by_ipu = {int(k[3:]): v for k, v in available_memory_proportion.items()}
        return self._set("available_memory_proportion", by_ipu)

    def setExecutionStrategy(self, strategy) -> Options:
        """Pipelined, Sharded or Phased execution of the model's blocks (`blocks`)."""
        from .blocks import ExecutionStrategy

        if not isinstance(strategy, ExecutionStrategy):
            raise TypeError(
                "setExecutionStrategy takes poptorch.PipelinedExecution, ShardedExecution, "
                f"SerialPhasedExecution or ParallelPhasedExecution, not {type(strategy).__name__}."
            )
        self._execution_strategy = strategy
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:
        return self._set("auto_round_num_ipus", auto_round_num_ipus)

    def connectionType(self, connection_type: ConnectionType) -> Options:
        assert isinstance(connection_type, ConnectionType)
        return self._set("connection_type", connection_type)

    def syncPattern(self, sync_pattern: SyncPattern) -> Options:
        assert isinstance(sync_pattern, SyncPattern)
        return self._set("sync_pattern", sync_pattern)

    def useIpuId(self, ipu_id: int) -> Options:
        assert isinstance(ipu_id, int)
        _notes.note("Options.useIpuId", "there is one simulated device")
        return self._set("ipu_id", ipu_id)

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Options:
        """Compile only: a call raises PopTorch's offline-device error."""
        self.connectionType(ConnectionType.Never)
        return self._set("ipu_version", ipu_version)

    def enableSyntheticData(self, enabled: bool) -> Options:
        self._popart._store("syntheticDataMode", 2 if enabled else 0)  # RandomNormal / Off
        return self

    @property
    def enable_synthetic_data(self) -> bool:
        return self._popart.options.get("syntheticDataMode", 0) == 2

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Options:
        return self._set("broadcast_buffers", broadcast_buffers)

    def modelName(self, name: str) -> Options:
        return self._set("model_name", name)

    # kept, with a note ------------------------------------------------------------------
    def enableExecutableCaching(self, path: str | None) -> Options:
        _notes.note("Options.enableExecutableCaching", "programs are cached in the process")
        if path is not None:
            self._popart._store("cachePath", path)
        self._popart._store("enableEngineCaching", path is not None)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> Options:
        _notes.note("Options.logCycleCount", "read the estimate from the executor's report()")
        self._popart._store("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def logDir(self, log_dir: str) -> Options:
        _notes.note("Options.logDir", "there are no PopART/Poplar logs to write")
        return self._set("log_dir", log_dir)

    def maxRepeatLogs(self, max_lines: int | None) -> Options:
        return self._set("max_repeat_logs", (1 << 64) - 1 if max_lines is None else max_lines)

    def enableStableNorm(self, enabled: bool) -> Options:
        _notes.note("Options.enableStableNorm", "the norms are torch's")
        self._popart._store("enableStableNorm", enabled)
        return self

    def enableProfiling(self, profile_dir: str | None = None) -> Options:
        _notes.note("Options.enableProfiling", "read the simulator's report() instead")
        engine = dict(self._popart.options.get("engineOptions", {}))
        engine.update({"debug.allowOutOfMemory": "true", "autoReport.all": "true"})
        engine["autoReport.directory"] = profile_dir or "."
        self._popart._store("engineOptions", engine)
        return self

    def updatableNamedBuffers(self, buffers: list) -> Options:
        self._popart._store("updatableNamedBuffers", buffers)
        return self

    def showCompilationProgressBar(self, show: bool = True) -> Options:
        self._show_compilation_progress_bar = show
        return self

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> Options:
        self._relax_optimizer_attributes_checks = relax
        return self

    def disableModuleNamescope(self) -> Options:
        self._module_namescope_enabled = False
        return self

    def sourceLocationExcludes(self, excludes: list) -> Options:
        self._source_location_excludes = list(excludes)
        return self

    def appendToLocationExcludes(self, *excludes: str) -> Options:
        self._source_location_excludes += excludes
        return self

    # files and serialisation ------------------------------------------------------------
    def loadFromFile(self, filepath: str) -> Options:
        """Run each line of ``filepath`` as a setter call (``deviceIterations(2)``)."""
        load_from_file(self, filepath)
        return self

    def from_json(self, string: str) -> Options:
        """Call the setters named by a JSON object's keys (``"Training.gradientAccumulation"``)
        with its values (a list is spread into the arguments)."""
        from_json(self, string)
        return self

    def toDict(self) -> dict[str, Any]:
        """Every option in one dict, as PopTorch hands them to its C++ backend."""
        assert not self.defaultOutputMode(), "An output mode must be picked before serialisation"
        out = _backend_options(self._execution_strategy)
        out.update(self._popart.options)
        for group in (self, self._training, self._distributed, self._tensor_locations):
            out = OptionsDict.update(group, out)
        if self._show_compilation_progress_bar:
            out["compilation_progress_bar_fn"] = _no_progress_bar
        return out

    def clone(self) -> Options:
        """An unfrozen deep copy."""
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        values = [f"{k}={v!r}" for k, v in self._values.items()]
        groups = [f"{name}={getattr(self, name)!r}" for name in _GROUPS]
        return f"Options({', '.join(values + groups)})"

    # read by popxl_fx's mapping ----------------------------------------------------------
    def _get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def reduction(self) -> ReductionType:
        return self.Training.accumulation_and_replication_reduction_type

    def mean_strategy(self) -> MeanReductionStrategy:
        return self.Training.meanAccumulationAndReplicationReductionStrategy


def _defaults() -> dict[str, Any]:
    from .enums import CommGroupType

    return dict(
        replication_factor=1,
        input_group_size=1,
        input_cgt=CommGroupType.Consecutive,
        broadcast_buffers=True,
        device_iterations=1,
        log_dir=".",
        max_repeat_logs=4,
        auto_round_num_ipus=False,
        anchored_tensors={},
        output_mode=OutputMode.Default,
        output_return_period=1,
        connection_type=ConnectionType.Always,
        sync_pattern=SyncPattern.Full,
        available_memory_proportion={},
    )


def _backend_options(strategy) -> dict[str, Any]:
    """PopTorch's execution-mode entries (0 pipelined, the default; 1 sharded; 2 phased)."""
    return strategy.backendOptions()


def _no_progress_bar(progress: int, total: int) -> None:
    """PopTorch shows Poplar's compilation progress here; the simulator reports none."""


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Options.{name}({value!r}): give a positive int.")
    return value
