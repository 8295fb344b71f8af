"""`poptorch.Options` -> `popxl_fx.Options`: the one place where PopTorch's settings become
popxl_fx's (docs/poptorch.md has the table)."""

from __future__ import annotations

import torch

import popxl_fx

from . import _notes
from .blocks import _PhasedExecution
from .enums import MeanReductionStrategy

__all__ = ["fx_options", "implicit_mean_strategy"]


def fx_options(options, training: bool) -> popxl_fx.Options:
    """What popxl_fx runs for ``options`` (a training or an inference executor's)."""
    return popxl_fx.Options(
        device="ipu_model" if options._get("use_model", False) else "ipu_hw",
        device_iterations=options.device_iterations,
        replication_factor=options.replication_factor,
        gradient_accumulation=options.Training.gradient_accumulation if training else 1,
        replicated_tensor_sharding=training and _rts(options),
        narrow_64bit=True,  # the IPU has no 64-bit types (`dtypes`)
        **_phased(options),
    )


def _rts(options) -> bool:
    """Optimizer state sharded over replicas (TensorLocationSettings'
    useReplicatedTensorSharding on the optimizer location) with 2 or more replicas."""
    where = options.TensorLocations._values.get("location_optimizer", {})
    wanted = bool(where.get("useReplicatedTensorSharding", 0))
    if wanted and options.replication_factor < 2:
        _notes.note("useReplicatedTensorSharding with one replica", "there is nothing to shard")
    _off_chip_note(options)
    return wanted and options.replication_factor > 1


def _off_chip_note(options) -> None:
    locations = options.TensorLocations
    for kind in ("activation", "weight", "optimizer", "accumulator"):
        where = locations._values.get(f"location_{kind}", {})
        if where.get("onChip") == 0:
            _notes.note(
                f"TensorLocations.set{kind.capitalize()}Location(useOnChipStorage(False))",
                "popxl_fx keeps tensors in Streaming Memory only with phased execution "
                "(Options(phased_execution=...)); the values are the same",
            )


def _phased(options) -> dict:
    strategy = options._execution_strategy
    if isinstance(strategy, _PhasedExecution):
        _notes.note(
            f"{type(strategy).__name__}",
            "the phases run as one program on one simulated chip (the same values); "
            "popxl_fx's own phased execution is Options(phased_execution='marked')",
        )
    return {}


def implicit_mean_strategy(options, optimizer) -> None:
    """PopTorch's Mean strategy follows the optimizer: half accumulators keep a running mean
    (Running), unless they are the combined accumulator, which only Post supports."""
    half = _ipu_argument(optimizer, "accum_type") == torch.float16
    if half and not _ipu_argument(optimizer, "use_combined_accum"):
        options._unfreeze()
        options.Training.setMeanAccumulationAndReplicationReductionStrategy(
            MeanReductionStrategy.Running
        )
        options._freeze()


def _ipu_argument(optimizer, name: str):
    """A poptorch.optim argument (kept in ``defaults``); None for torch's optimizers."""
    return getattr(optimizer, "defaults", {}).get(name, getattr(optimizer, name, None))
