"""Per-run host IO state the compiled program reads streams from and writes streams to."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

__all__ = ["Runtime"]


class Runtime:
    """Stream buffers of the current `Session.run`, indexed ``[transfer, replica, ...]``."""

    def __init__(self) -> None:
        self.inputs: Dict[object, np.ndarray] = {}
        self.outputs: Dict[object, np.ndarray] = {}
        self.replica = 0
        self._counts: Dict[object, int] = {}

    def start(self, inputs: Dict[object, np.ndarray], outputs: Dict[object, np.ndarray]) -> None:
        self.inputs, self.outputs = inputs, outputs

    def start_replica(self, replica: int) -> None:
        self.replica = replica
        self._counts = {}

    def _next(self, stream) -> int:
        n = self._counts.get(stream, 0)
        self._counts[stream] = n + 1
        return n

    def load(self, stream) -> torch.Tensor:
        buf = self.inputs[stream]
        i = self._next(stream)
        if i >= buf.shape[0]:
            raise RuntimeError(
                f"Stream {stream.tensor_id!r} was loaded {i + 1} times in one run, "
                f"but only {buf.shape[0]} transfers were provided (num_host_transfers)."
            )
        return torch.from_numpy(np.array(buf[i, self.replica]))  # 0-d slices are scalars

    def store(self, stream, value: torch.Tensor) -> None:
        buf = self.outputs[stream]
        i = self._next(stream)
        if i >= buf.shape[0]:
            raise RuntimeError(
                f"Stream {stream.tensor_id!r} was stored {i + 1} times in one run; "
                f"num_host_transfers is {buf.shape[0]}."
            )
        buf[i, self.replica] = value.detach().numpy()
