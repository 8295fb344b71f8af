"""`poptorch.Options` -> `popxl_fx.Options`: the one place where PopTorch's settings become
popxl_fx's (docs/poptorch.md has the table)."""

from __future__ import annotations

import popxl_fx

from . import _notes
from .blocks import _PhasedExecution

__all__ = ["fx_options"]


def fx_options(options, training: bool) -> popxl_fx.Options:
    """What popxl_fx runs for ``options`` (a training or an inference executor's)."""
    return popxl_fx.Options(
        device="ipu_model" if options._get("use_model", False) else "ipu_hw",
        device_iterations=options.device_iterations,
        replication_factor=options.replication_factor,
        gradient_accumulation=options.Training.gradient_accumulation if training else 1,
        replicated_tensor_sharding=training and _rts(options),
        narrow_64bit=True,  # the IPU has no 64-bit types (`dtypes`)
        partials_type=_conv_partials(options),
        **_phased(options),
    )


def _conv_partials(options) -> str:
    """What half convolutions accumulate in: ``Precision.setPartialsType``'s type, else float,
    Poplar's default for convolutions (poplin's ``partialsType``)."""
    conv_options = options._popart.options.get("convolutionOptions", {})
    return conv_options.get("partialsType", "float")


def _rts(options) -> bool:
    """Optimizer state sharded over replicas (TensorLocationSettings'
    useReplicatedTensorSharding on the optimizer location) with 2 or more replicas."""
    where = options.TensorLocations.toDict().get("location_optimizer", {})
    wanted = bool(where.get("useReplicatedTensorSharding", 0))
    if wanted and options.replication_factor < 2:
        _notes.note("useReplicatedTensorSharding with one replica", "there is nothing to shard")
    _off_chip_note(options)
    return wanted and options.replication_factor > 1


def _off_chip_note(options) -> None:
    locations = options.TensorLocations
    for kind in ("activation", "weight", "optimizer", "accumulator"):
        where = locations.toDict().get(f"location_{kind}", {})
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
