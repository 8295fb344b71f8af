"""The option groups of `poptorch.Options`: ``Training``, ``Precision``, ``TensorLocations``
(with `TensorLocationSettings`), ``Jit``, ``_Popart`` and ``Distributed``."""

from __future__ import annotations

from typing import Any

import torch

from . import _notes
from .enums import MeanReductionStrategy, ReductionType

__all__ = [
    "DistributedOptions",
    "JitOptions",
    "PopartOptions",
    "PrecisionOptions",
    "TensorLocationOptions",
    "TensorLocationSettings",
    "TrainingOptions",
    "Values",
]


class Values:
    """Values kept under PopTorch's attribute names, read back as attributes."""

    def __init__(self, **values: Any) -> None:
        object.__setattr__(self, "_settings", dict(values))

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_settings", {})
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no option or attribute {name!r}.")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"set PopTorch options through their setters, not by assigning {name!r}."
        )

    def _set(self, name: str, value: Any):
        self._settings[name] = value
        return self

    def exists(self, name: str) -> bool:
        return self._settings.get(name) is not None

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._settings.items())
        return f"{type(self).__name__}({inner})"


class TrainingOptions(Values):
    """``opts.Training``: gradient accumulation and how gradients and losses combine."""

    def __init__(self) -> None:
        super().__init__(
            gradient_accumulation=1,
            accumulation_and_replication_reduction_type=ReductionType.Mean,
            mean_accumulation_and_replication_reduction_strategy=MeanReductionStrategy.Post,
            auto_loss_scaling=False,
            convolution_dithering=False,
        )

    def gradientAccumulation(self, gradient_accumulation: int) -> TrainingOptions:
        """Micro-batches whose gradients are combined before each optimizer step."""
        value = gradient_accumulation
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Training.gradientAccumulation({value!r}): give a positive int.")
        return self._set("gradient_accumulation", value)

    def accumulationAndReplicationReductionType(self, reduction_type) -> TrainingOptions:
        """Mean (default) or Sum of the gradients over micro-batches and replicas."""
        kind = ReductionType(reduction_type)
        if kind == ReductionType.NoReduction:
            raise ValueError(
                "accumulationAndReplicationReductionType: NoReduction is not a valid way to "
                "combine gradients; use ReductionType.Mean or ReductionType.Sum."
            )
        return self._set("accumulation_and_replication_reduction_type", kind)

    def setMeanAccumulationAndReplicationReductionStrategy(self, strategy) -> TrainingOptions:
        """Running or Post mean: the same numbers here up to rounding (the mean is taken once
        after the sum, i.e. Post)."""
        return self._set(
            "mean_accumulation_and_replication_reduction_strategy", MeanReductionStrategy(strategy)
        )

    @property
    def meanAccumulationAndReplicationReductionStrategy(self) -> MeanReductionStrategy:
        """The strategy set (PopTorch's name for reading it back)."""
        return self._settings["mean_accumulation_and_replication_reduction_strategy"]

    def setAutomaticLossScaling(self, enabled: bool) -> TrainingOptions:
        if enabled:
            _notes.note(
                "Training.setAutomaticLossScaling(True)",
                "float32 needs no loss scale, and half precision runs a static one",
            )
        return self._set("auto_loss_scaling", bool(enabled))

    def setConvolutionDithering(self, enabled) -> TrainingOptions:
        _notes.note("Training.setConvolutionDithering")
        return self._set("convolution_dithering", enabled)


class PrecisionOptions(Values):
    """``opts.Precision``: partials, stochastic rounding, floating-point exceptions."""

    def __init__(self) -> None:
        super().__init__(
            partials_type=None,
            stochastic_rounding=False,
            fp_exceptions=False,
            running_statistics_always_float=False,
            half_float_casting=None,
        )

    def setPartialsType(self, dtype: torch.dtype) -> PrecisionOptions:
        if dtype not in (torch.float32, torch.float16, torch.half, torch.float):
            raise ValueError(f"Precision.setPartialsType({dtype}): give torch.float or torch.half.")
        _notes.note(
            "Precision.setPartialsType",
            "the simulator's matmuls and convolutions accumulate as torch's kernels do",
        )
        return self._set("partials_type", dtype)

    def enableStochasticRounding(self, enabled: bool) -> PrecisionOptions:
        if enabled:
            _notes.note(
                "Precision.enableStochasticRounding(True)",
                "the simulator rounds to nearest, as torch does, so results stay eager's",
            )
        return self._set("stochastic_rounding", bool(enabled))

    def enableFloatingPointExceptions(self, enabled: bool) -> PrecisionOptions:
        _notes.note("Precision.enableFloatingPointExceptions")
        return self._set("fp_exceptions", bool(enabled))

    def runningStatisticsAlwaysFloat(self, value: bool) -> PrecisionOptions:
        _notes.note("Precision.runningStatisticsAlwaysFloat")
        return self._set("running_statistics_always_float", bool(value))

    def halfFloatCasting(self, behaviour) -> PrecisionOptions:
        _notes.note("Precision.halfFloatCasting", "half and float mix as torch's promotion says")
        return self._set("half_float_casting", behaviour)


class TensorLocationSettings(Values):
    """Where one kind of tensor lives: on chip, off chip (Streaming Memory), or sharded
    over the replicas (replicated tensor sharding)."""

    def __init__(self) -> None:
        super().__init__(on_chip=None, use_replicated_tensor_sharding=None)

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:
        return self._set("min_elements_off_chip", int(min_elements))

    def minElementsForReplicatedTensorSharding(self, min_elements: int):
        return self._set("min_elements_rts", int(min_elements))

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:
        return self._set("on_chip", bool(use))

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        return self._set("use_replicated_tensor_sharding", bool(use))

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:
        return self._set("io_tiles_load", bool(use))

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:
        return self._set("io_tiles_store", bool(use))


class TensorLocationOptions(Values):
    """``opts.TensorLocations``: settings per kind of tensor (activations, weights, optimizer
    state, accumulators)."""

    def __init__(self) -> None:
        super().__init__(
            num_io_tiles=0, activation=None, weight=None, optimizer=None, accumulator=None
        )

    def numIOTiles(self, num_tiles: int) -> TensorLocationOptions:
        _notes.note("TensorLocations.numIOTiles", "the simulator plans no tiles")
        return self._set("num_io_tiles", int(num_tiles))

    def _location(self, kind: str, location: TensorLocationSettings) -> TensorLocationOptions:
        if not isinstance(location, TensorLocationSettings):
            raise TypeError(
                f"give a poptorch.TensorLocationSettings, not {type(location).__name__}."
            )
        return self._set(kind, location)

    def setActivationLocation(self, location: TensorLocationSettings):
        return self._location("activation", location)

    def setWeightLocation(self, location: TensorLocationSettings):
        return self._location("weight", location)

    def setOptimizerLocation(self, location: TensorLocationSettings):
        return self._location("optimizer", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings):
        return self._location("accumulator", location)


class JitOptions(Values):
    """``opts.Jit``: PopTorch's old tracing front end (only ``traceModel(False)`` here)."""

    def __init__(self) -> None:
        super().__init__(trace_model=False)

    def traceModel(self, trace_model: bool) -> JitOptions:
        if trace_model:
            raise ValueError(
                "Jit.traceModel(True): PopTorch's torch.jit tracing front end is gone (as in "
                "PopTorch 3); the model is captured with torch.fx here."
            )
        return self._set("trace_model", False)


class PopartOptions:
    """``opts._Popart``: PopART session options, kept but not applied (there is no PopART)."""

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> PopartOptions:
        _notes.note("Options._Popart.set", "there is no PopART session here")
        self.options[key] = value
        return self

    def setEngineOptions(self, engine_options: dict) -> PopartOptions:
        _notes.note("Options._Popart.setEngineOptions", "there is no Poplar engine here")
        self.options["engine_options"] = dict(engine_options)
        return self

    def setPatterns(self, patterns: dict, level: int = 2) -> PopartOptions:
        _notes.note("Options._Popart.setPatterns", "there are no PopART patterns here")
        self.options["patterns"] = dict(patterns)
        return self


class DistributedOptions(Values):
    """``opts.Distributed``: the process id and count (data loaders split the dataset by
    them; executors run one process)."""

    def __init__(self) -> None:
        super().__init__(process_id=0, num_processes=1)

    def disable(self) -> DistributedOptions:
        return self._set("num_processes", 1)

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str):
        return self

    def configureProcessId(self, process_id: int, num_processes: int):
        """This process's share: `poptorch.DataLoader` gives it its block of the dataset; an
        executor refuses more than one process (`executor`)."""
        if not 0 <= process_id < num_processes:
            raise ValueError(
                f"Distributed.configureProcessId({process_id}, {num_processes}): the process "
                "id must be in [0, num_processes)."
            )
        self._set("process_id", process_id)
        return self._set("num_processes", num_processes)

    @property
    def processId(self) -> int:
        return self._settings["process_id"]

    @property
    def numProcesses(self) -> int:
        return self._settings["num_processes"]
