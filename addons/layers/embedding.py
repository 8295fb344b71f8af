"""`Embedding`: look rows (or columns) of a learned table up by integer index."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from popxl_core import Tensor, dtype, float32, ops

from ..module import Module
from ..named_tensors import NamedTensors
from .weights_dict import WeightsDict, host_value

__all__ = ["Embedding", "MULTISLICE_MAGIC_NUMBER"]

# popxl.addons rounds a vocabulary shard up to a multiple of this (its multi-slice grain)
MULTISLICE_MAGIC_NUMBER = 16


class Embedding(Module):
    """An embedding table gathered along ``axis``.

    The ``weight`` variable is (vocab_shard_size, hidden_size) for ``axis=0`` (the torch layout)
    and (hidden_size, vocab_shard_size) for ``axis=1``; it starts as N(0, 0.02) draws.
    ``build(indices)`` returns ``gather(weight, indices, axis)``.

    As in popxl.addons, the table has `get_vocab_shard_size` rows: the vocabulary split over
    the ``replica_grouping``'s groups (the shards; one without a grouping), each rounded up to a
    multiple of 16. Sharded, the indices come offset by the shard's first index
    (`get_offsets`) and an index outside the shard gives zeros.
    """

    def __init__(
        self, dtype: dtype, vocab_size: int, hidden_size: int, axis: int = 0, replica_grouping=None
    ) -> None:
        super().__init__()
        if axis not in (0, 1):
            raise ValueError(f"Embedding axis must be 0 or 1, got {axis!r}.")
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.axis = axis
        self.replica_grouping = replica_grouping
        self.n_shards = replica_grouping.num_groups if replica_grouping else 1
        self.vocab_shard_size = self.get_vocab_shard_size(vocab_size, self.n_shards)
        self.offsets = self.get_offsets(vocab_size, self.n_shards)

    @staticmethod
    def get_vocab_shard_size(vocab_size: int, n_shards: int) -> int:
        """Rows of the table per shard: ``vocab_size / n_shards`` rounded up to a multiple of
        `MULTISLICE_MAGIC_NUMBER` (``vocab_size`` itself so rounded for one shard)."""
        per_shard = -(-vocab_size // n_shards)
        return MULTISLICE_MAGIC_NUMBER * -(-per_shard // MULTISLICE_MAGIC_NUMBER)

    @staticmethod
    def get_offsets(vocab_size: int, n_shards: int) -> np.ndarray:
        """The first vocabulary index of each shard."""
        size = Embedding.get_vocab_shard_size(vocab_size, n_shards)
        return np.arange(n_shards * size, step=size)

    def _shape(self) -> tuple[int, int]:
        shape = (self.vocab_shard_size, self.hidden_size)
        return shape if self.axis == 0 else shape[::-1]

    def build(self, indices: Tensor) -> Tensor:
        if not indices.dtype.is_int:
            raise TypeError(f"Embedding indices must be integers, got {indices.dtype.name}.")
        w = self.add_variable_input(
            "weight",
            partial(np.random.normal, 0, 0.02, self._shape()),
            self.dtype,
            replica_grouping=self.replica_grouping,
        )
        return ops.gather(w, indices, axis=self.axis, zero_OOR=self.n_shards > 1)

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: torch.nn.Embedding, dtype: dtype = float32, axis: int = 0
    ) -> WeightsDict:
        """Host data for ``variables`` from ``nn_layer``; pass the layer's ``axis`` (an
        axis-1 table is the transposed torch weight). Rows past the torch vocabulary (the
        table is rounded up to a multiple of 16 rows) are zeros."""
        weight = nn_layer.weight.detach()
        rows = variables.weight.shape[-2 if axis == 0 else -1]
        weight = torch.nn.functional.pad(weight, (0, 0, 0, rows - weight.shape[0]))
        weight = weight.T if axis == 1 else weight
        return WeightsDict({variables.weight: host_value(variables.weight, weight, dtype)})
