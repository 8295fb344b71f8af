"""Streaming Memory hooks of the plan and the cost model.

Remote variables live off chip: the plan counts them in their remote buffers
(`Plan.remote_buffers`), not in IPU memory; a replica-sharded variable costs each replica its
on-chip shard of ``ceil(nelms / shard_over)`` elements. Exchanges merged by
`transforms.merge_exchange` share one sync.
"""

from __future__ import annotations

from ..remote_variables import remote_info
from ..transforms.merge_exchange import exchange_group

__all__ = [
    "is_remote_variable",
    "pays_exchange_sync",
]


def pays_exchange_sync(op) -> bool:
    """False for the second and later ops of one merged exchange: they share its sync."""
    entry = exchange_group(op)
    return entry is None or entry[1]


def is_remote_variable(v) -> bool:
    return remote_info(v) is not None
