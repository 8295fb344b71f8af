"""`NamedTensors`: a DotTree of popxl tensors; `NamedTensorData`: a DotTree of host arrays."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from popxl_core import Tensor

from .dot_tree import DotTree

__all__ = ["NamedTensorData", "NamedTensors", "print_named_tensors"]


class NamedTensors(DotTree[Tensor]):
    """Tensors addressed by dotted names (``variables.fc1.weight``)."""

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor, sorted by **tensor name** (not by key)."""
        return tuple(sorted(self.values_flat(), key=lambda t: t.name))

    @property
    def named_tensors(self) -> dict[str, Tensor]:
        """The flattened ``{dotted key: tensor}`` dict (same as `to_dict`)."""
        return self.to_dict()

    def remap(self, mapping: Mapping[Tensor, Tensor]) -> NamedTensors:
        """A tree of the same keys with each tensor replaced by ``mapping[tensor]``.

        Tensors missing from ``mapping`` are dropped (their keys are left out).
        """
        return NamedTensors.from_dict(
            {k: mapping[t] for k, t in self.to_dict().items() if t in mapping}
        )


class NamedTensorData(DotTree[np.ndarray]):
    """Host arrays addressed by dotted names, e.g. the data of a NamedTensors."""


def print_named_tensors(nt: DotTree) -> None:
    """Print one ``key: value`` line per leaf, sorted by key."""
    keys, values = nt.unpack()
    width = max((len(k) for k in keys), default=0)
    for k, v in zip(keys, values):
        print(f"{k:<{width}} : {v!r}")
