"""`Options`: how popxl_fx builds and runs a traced model on the simulated IPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEVICES", "Options"]

DEVICES = ("ipu_hw", "ipu_model", "cpu")


@dataclass(frozen=True)
class Options:
    """Build and run options for `training_model`, `inference_model` and `compile`.

    Args:
        device: the Session's target. ``"ipu_hw"`` (default) is as faithful as the simulator
            can be: a program that does not fit one IPU raises an out-of-memory error when it is
            compiled, before any step. ``"ipu_model"`` runs anyway and warns; ``"cpu"`` ignores
            IPU limits.
        memory: reserved for the memory transforms (outlining, recomputation, accumulation,
            batch serialisation, phases); only an empty mapping is accepted today.

    Example:
        >>> Options(device="cpu").device
        'cpu'
    """

    device: str = "ipu_hw"
    memory: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(
                f"Options(device={self.device!r}): the device must be one of {DEVICES}."
            )
        if self.memory:
            raise NotImplementedError(
                f"Options(memory={self.memory!r}): memory transforms are not available yet; "
                "use device='ipu_model' or 'cpu' to run a model that does not fit one IPU."
            )

    def key(self) -> tuple:
        """What a compiled program depends on (part of the compile cache key)."""
        return (self.device, tuple(sorted(self.memory.items())))


def resolve(options: Options | None) -> Options:
    """``options`` or the defaults; rejects anything that is not an `Options`."""
    if options is None:
        return Options()
    if not isinstance(options, Options):
        raise TypeError(f"options must be a popxl_fx.Options, got {type(options).__name__}.")
    return options
