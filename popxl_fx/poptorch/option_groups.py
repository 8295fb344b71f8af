"""The option groups of `poptorch.Options`: ``Training``, ``Precision``, ``TensorLocations``
(with `TensorLocationSettings`), ``Jit``, ``_Popart`` and ``Distributed``.

Each keeps its values under PopTorch's names (``opts.Training.gradient_accumulation``,
``opts.TensorLocations.location_weight``); settings that PopTorch hands to PopART go into
``opts._Popart.options`` under PopART's names, as PopTorch does.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from . import _notes
from .enums import MeanReductionStrategy, ReductionType
from .options_dict import OptionsDict

__all__ = [
    "TensorLocationSettings",
    "_DistributedOptions",
    "_JitOptions",
    "_PopartOptions",
    "_PrecisionOptions",
    "_TensorLocationOptions",
    "_TrainingOptions",
]


class _PopartOptions:
    """``opts._Popart``: PopART session options by PopART's names, kept but not applied."""

    def __init__(self) -> None:
        self._is_frozen = False
        self.options: dict[str, Any] = {}
        self._store("instrumentWithHardwareCycleCounter", False)
        self._store("rearrangeAnchorsOnHost", False)

    def _changeFreezeState(self, frozen: bool) -> None:
        self._is_frozen = frozen

    def __deepcopy__(self, memo: dict) -> _PopartOptions:
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        twin._is_frozen = False
        twin.options = copy.deepcopy(self.options, memo)
        return twin

    def checkIsFrozen(self, option: str | None = None) -> None:
        if self._is_frozen:
            raise AttributeError("Can't modify frozen Options")

    def _store(self, key: str, value: Any) -> _PopartOptions:
        """What PopTorch's own setters put here (they note for themselves)."""
        self.checkIsFrozen()
        self.options[key] = value
        return self

    def set(self, key: str, value: Any) -> _PopartOptions:
        _notes.note("Options._Popart.set", "there is no PopART session here")
        return self._store(key, value)

    def setEngineOptions(self, engine_options: dict) -> _PopartOptions:
        _notes.note("Options._Popart.setEngineOptions", "there is no Poplar engine here")
        return self._store("engineOptions", engine_options)

    def setPatterns(self, patterns: dict, level: int = 2) -> _PopartOptions:
        assert isinstance(level, int)
        assert isinstance(patterns, dict)
        _notes.note("Options._Popart.setPatterns", "there are no PopART patterns here")
        self._store("patterns_level", level)
        return self._store("patterns", patterns)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({body})"


class _TrainingOptions(OptionsDict):
    """``opts.Training``: gradient accumulation and how gradients and losses combine."""

    def __init__(self, popart_options: _PopartOptions) -> None:
        self._popart_options = popart_options
        super().__init__(
            gradient_accumulation=1,
            accumulation_and_replication_reduction_type=ReductionType.Mean,
            meanAccumulationAndReplicationReductionStrategy=MeanReductionStrategy.Post,
        )

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        """Micro-batches whose gradients are combined before each optimizer step."""
        value = gradient_accumulation
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Training.gradientAccumulation({value!r}): give a positive int.")
        self.set(gradient_accumulation=value)
        return self

    def accumulationAndReplicationReductionType(self, reduction_type) -> _TrainingOptions:
        """Mean (default) or Sum of the gradients over micro-batches and replicas."""
        if not isinstance(reduction_type, ReductionType) or (
            reduction_type == ReductionType.NoReduction
        ):
            raise ValueError(
                "accumulationAndReplicationReductionType must be set to "
                "poptorch.ReductionType.Mean or poptorch.ReductionType.Sum"
            )
        self.set(accumulation_and_replication_reduction_type=reduction_type)
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(self, strategy) -> _TrainingOptions:
        """Running or Post mean: the same numbers here up to rounding."""
        self.set(meanAccumulationAndReplicationReductionStrategy=MeanReductionStrategy(strategy))
        return self

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        if enabled:
            _notes.note(
                "Training.setAutomaticLossScaling(True)",
                "float32 needs no loss scale, and half precision runs a static one",
            )
        self._popart_options._store("automaticLossScalingSettings.enabled", enabled)
        return self

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:
        _notes.note("Training.setConvolutionDithering")
        self._popart_options._store("convolutionOptions", {"enableConvDithering": enabled})
        return self


class _PrecisionOptions(OptionsDict):
    """``opts.Precision``: partials, stochastic rounding, floating-point exceptions (all
    PopART settings, kept in ``opts._Popart``)."""

    def __init__(self, popart_options: _PopartOptions) -> None:
        self._popart_options = popart_options
        super().__init__()

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:
        names = {torch.float32: "float", torch.float16: "half"}
        if dtype not in names:
            raise ValueError(
                "parameter to setPartialsType should be either torch.float or torch.half"
            )
        if dtype is torch.float16:
            _notes.note(
                "Precision.setPartialsType(torch.half)",
                "the simulator's matmuls and convolutions sum in float32 (float partials)",
            )
        self._popart_options._store("partialsTypeMatMuls", names[dtype])
        self._popart_options._store("convolutionOptions", {"partialsType": names[dtype]})
        return self

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        if enabled:
            _notes.note(
                "Precision.enableStochasticRounding(True)",
                "the simulator rounds to nearest, as torch does, so results stay eager's",
            )
        self._popart_options._store("enableStochasticRounding", enabled)
        return self

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:
        assert isinstance(enabled, bool), "enableFloatingPointExceptions needs to be set to a bool"
        _notes.note("Precision.enableFloatingPointExceptions")
        self._popart_options._store("enableFloatingPointChecks", enabled)
        return self

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:
        if not isinstance(value, bool):
            raise ValueError("runningStatisticsAlwaysFloat needs to be set to a bool")
        _notes.note("Precision.runningStatisticsAlwaysFloat")
        return self

    def halfFloatCasting(self, behaviour) -> _PrecisionOptions:
        _notes.note("Precision.halfFloatCasting", "half and float mix as torch's promotion says")
        return self


class TensorLocationSettings(OptionsDict):
    """Where one kind of tensor lives: on chip, off chip (Streaming Memory), or sharded
    over the replicas (replicated tensor sharding); PopART's names, flags as ints."""

    def _flag(self, name: str, use: bool | None) -> TensorLocationSettings:
        if use is None:
            self.deleteIfExists(name)
            return self
        assert isinstance(use, bool)
        return self._set(name, int(use))

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:
        assert isinstance(min_elements, int)
        return self._set("minElementsForOffChip", min_elements)

    def minElementsForReplicatedTensorSharding(self, min_elements: int):
        assert isinstance(min_elements, int)
        return self._set("minElementsForReplicatedTensorSharding", min_elements)

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:
        return self._flag("onChip", use)

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        return self._flag("useReplicatedTensorSharding", use)

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:
        return self._flag("useIOTilesToLoad", use)

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:
        return self._flag("useIOTilesToStore", use)


class _TensorLocationOptions(OptionsDict):
    """``opts.TensorLocations``: ``location_activation``, ``location_weight``,
    ``location_optimizer`` and ``location_accumulator``, each a settings dict."""

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:
        assert isinstance(num_tiles, int)
        why = "numIOTiles must be an even number between 32 and 192."
        assert 32 <= num_tiles <= 192 and num_tiles % 2 == 0, why
        _notes.note("TensorLocations.numIOTiles", "the simulator plans no tiles")
        return self._set("numIOTiles", num_tiles)

    def _location(self, kind: str, location: TensorLocationSettings):
        assert isinstance(location, TensorLocationSettings)
        return self._set(f"location_{kind}", location.toDict())

    def setActivationLocation(self, location: TensorLocationSettings):
        return self._location("activation", location)

    def setWeightLocation(self, location: TensorLocationSettings):
        return self._location("weight", location)

    def setOptimizerLocation(self, location: TensorLocationSettings):
        return self._location("optimizer", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings):
        return self._location("accumulator", location)


class _JitOptions(OptionsDict):
    """``opts.Jit``: PopTorch's old tracing front end (only ``traceModel(False)`` here)."""

    def traceModel(self, trace_model: bool) -> _JitOptions:
        if trace_model:
            raise ValueError(
                "options.Jit.traceModel(True) is no longer supported: the model is captured "
                "with torch.fx here (PopTorch 3 dropped torch.jit tracing too)."
            )
        return self


class _DistributedOptions(OptionsDict):
    """``opts.Distributed``: the process id and count (data loaders split the dataset by
    them; executors run one process). Read from OpenMPI's variables by default."""

    def __init__(self) -> None:
        super().__init__(num_distributed_processes=1, distributed_process_id=0, ipuof_configs={})
        self.setEnvVarNames("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")

    def disable(self) -> _DistributedOptions:
        self.set(num_distributed_processes=1, distributed_process_id=0)
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str):
        """The process id and count from these environment variables."""
        return self.configureProcessId(
            int(os.environ.get(var_process_id, "0")), int(os.environ.get(var_num_processes, "1"))
        )

    def configureProcessId(self, process_id: int, num_processes: int):
        """This process's share: `poptorch.DataLoader` gives it its block of the dataset; an
        executor refuses more than one process (`executor`)."""
        if not 0 <= process_id < num_processes:
            raise ValueError(
                f"Distributed.configureProcessId({process_id}, {num_processes}): the process "
                "id must be in [0, num_processes)."
            )
        self.set(distributed_process_id=process_id, num_distributed_processes=num_processes)
        return self

    @property
    def processId(self) -> int:
        return self.distributed_process_id

    @property
    def numProcesses(self) -> int:
        return self.num_distributed_processes
