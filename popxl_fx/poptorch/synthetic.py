"""`Options.enableSyntheticData(True)`: the IPU makes its own inputs and the host sends none.

PopTorch (PopART's ``SyntheticDataMode.RandomNormal``) then runs the program on values drawn
on the device, so a benchmark measures compute without host I/O. Here the executor does the
same: each call's tensors are replaced by synthetic ones of the same shape and dtype, drawn once
per shape from a generator seeded by ``randomSeed`` (0 by default) and reused, as the device's
buffers are. Floating-point inputs are standard normal; integer and bool inputs are zeros, so
labels and indices stay in range.
"""

from __future__ import annotations

import torch

__all__ = ["SyntheticInputs"]


class SyntheticInputs:
    """Replaces a call's tensors with synthetic ones, made once per (shape, dtype)."""

    def __init__(self, seed: int | None) -> None:
        self._generator = torch.Generator().manual_seed(0 if seed is None else seed)
        self._made: dict[tuple, torch.Tensor] = {}

    def __call__(self, args: tuple) -> tuple:
        return tuple(self._synthetic(a) if isinstance(a, torch.Tensor) else a for a in args)

    def _synthetic(self, real: torch.Tensor) -> torch.Tensor:
        key = (tuple(real.shape), real.dtype)
        if key not in self._made:
            self._made[key] = self._draw(real)
        return self._made[key]

    def _draw(self, real: torch.Tensor) -> torch.Tensor:
        if not real.is_floating_point():
            return torch.zeros_like(real)
        values = torch.randn(real.shape, generator=self._generator, dtype=torch.float32)
        return values.to(real.dtype)
