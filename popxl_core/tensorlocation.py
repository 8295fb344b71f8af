"""Tensor locations (PopXL's ``popxl.tensorlocation``): where a tensor is stored and whether
it is replica-sharded, plus the tile-set and execution-context enums PopXL re-exports."""

from __future__ import annotations

import enum

__all__ = [
    "TensorStorage",
    "ReplicatedTensorSharding",
    "TensorLocation",
    "TileSet",
    "ExecutionContext",
]


class TensorStorage(enum.Enum):
    """On chip, or off chip in Streaming Memory (remote buffers)."""

    OnChip = 0
    OffChip = 1


class ReplicatedTensorSharding(enum.Enum):
    """Whether each replica holds only a shard of the tensor."""

    Off = 0
    On = 1


class TileSet(enum.Enum):
    """The tile set an op runs on (``popxl.io_tiles()`` selects IO)."""

    Compute = 0
    IO = 1
    Undefined = 2


class ExecutionContext(enum.Enum):
    """When an op runs. WeightsFromHostFragment / WeightsToHostFragment hold the loads and
    stores of replica-sharded variables' on-chip shards."""

    Normal = 0
    AccumulateOuterFragment = 1
    WeightsFromHostFragment = 2
    WeightsToHostFragment = 3
    OptimizerFromHostFragment = 4
    Subgraph = 5


class TensorLocation:
    """``TensorLocation(storage, replicated_tensor_sharding)``; compared by value."""

    def __init__(
        self,
        storage: TensorStorage = TensorStorage.OnChip,
        replicated_tensor_sharding: ReplicatedTensorSharding = ReplicatedTensorSharding.Off,
    ) -> None:
        self.storage = storage
        self.replicated_tensor_sharding = replicated_tensor_sharding

    def __eq__(self, other) -> bool:
        return isinstance(other, TensorLocation) and (
            self.storage,
            self.replicated_tensor_sharding,
        ) == (other.storage, other.replicated_tensor_sharding)

    def __hash__(self) -> int:
        return hash((self.storage, self.replicated_tensor_sharding))

    def __repr__(self) -> str:
        return f"TensorLocation({self.storage.name}, {self.replicated_tensor_sharding.name})"
