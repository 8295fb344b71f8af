"""Streaming Memory accounting for the plan, and merged exchanges for the cost model.

Remote buffers live off chip: a remote variable costs Streaming Memory, not IPU memory, and a
replica-sharded one costs each replica only its shard of ``ceil(nelms / shard_over)``
elements. Exchanges merged by `transforms.merge_exchange` share one sync.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from ..remote_variables import remote_info

__all__ = [
    "StreamingMemory",
    "streaming_memory",
    "is_remote_variable",
    "EXCHANGE_GROUPS",
    "pays_exchange_sync",
]

# op -> (group id, is the first op of its merged exchange); filled by merge_exchange
EXCHANGE_GROUPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def pays_exchange_sync(op) -> bool:
    """False for the second and later ops of one merged exchange: they share its sync."""
    entry = EXCHANGE_GROUPS.get(op)
    return entry is None or entry[1]


def is_remote_variable(v) -> bool:
    return remote_info(v) is not None


@dataclass
class StreamingMemory:
    """Bytes in Streaming Memory on one replica, per remote buffer and in all."""

    replicas: int
    buffers: List[Tuple[int, Tuple[int, ...], str, int, int]] = field(default_factory=list)
    variables: Dict[str, int] = field(default_factory=dict)  # remote variable -> bytes/replica

    @property
    def per_replica(self) -> int:
        return sum(b[-1] for b in self.buffers)

    @property
    def total(self) -> int:
        """Across all replicas (each has its own copy of every buffer)."""
        return self.per_replica * self.replicas

    def summary(self) -> str:
        from .report import fmt_bytes

        lines = [
            f"Streaming Memory: {fmt_bytes(self.per_replica)} per replica, "
            f"{fmt_bytes(self.total)} over {self.replicas} replica(s)"
        ]
        for rid, shape, dtype, entries, nbytes in self.buffers:
            lines.append(
                f"  remote buffer {rid}: {entries} x {shape} {dtype} = {fmt_bytes(nbytes)}"
            )
        return "\n".join(lines)


def streaming_memory(ir) -> StreamingMemory:
    """What the Ir's remote buffers and remote variables take in Streaming Memory."""
    sm = StreamingMemory(ir.replication_factor)
    for b in ir._remote_buffers.values():
        sm.buffers.append(
            (b.remote_buffer_id, b.tensor_shape, b.tensor_dtype.name, b.entries, b.nbytes)
        )
    for v in ir.main_graph.variables:
        info = remote_info(v)
        if info is not None:
            entry = info.buffer
            sm.variables[v.id] = entry.nbytes // entry.entries
    return sm
