"""The Session's view of replicated and remote state: what each replica holds of a variable,
and how the host value is rebuilt from the replicas.

Host values have PopXL's shapes: ``(num_groups, *shape)`` for a variable grouped into several
groups, else ``shape``; replica-sharded variables are always read and written whole. On the
device a replica holds its group's value, or, for a sharded variable, its shard of it.
"""

from __future__ import annotations

from math import ceil, prod
from typing import Callable, Dict, List, Mapping

import numpy as np
import torch

from ..host_data import host_to_torch, torch_to_host
from ..remote_variables import RemoteInfo, remote_info, shard_source
from ..tensor import Variable

__all__ = [
    "replica_value",
    "group_value",
    "replica_whole_value",
    "host_from_replicas",
    "read_replicas",
    "shard_members",
    "RemoteState",
]


def _group_members(v: Variable, replicas: int) -> List[List[int]]:
    rg = v.replica_grouping
    if rg is None or rg.num_groups == 1:
        return [list(range(replicas))]
    return [rg.replicas_of_group(g) for g in range(rg.num_groups)]


def shard_members(v: Variable, replica: int, replicas: int) -> List[int]:
    """The replicas holding the shards of ``replica``'s copy of ``v``, in shard order."""
    shards = _remote(v).shard_over
    for members in _group_members(v, replicas):
        if replica in members:
            i = members.index(replica)
            start = i - i % shards
            return members[start : start + shards]
    raise ValueError(f"replica {replica} is in no group of {v.replica_grouping!r}")


def group_value(v: Variable, host: np.ndarray, replica: int) -> np.ndarray:
    """The whole value of ``v`` for the group of ``replica`` (a view of the host value)."""
    rg = v.replica_grouping
    # `...` keeps a grouped scalar's value a 0-d array view (an integer index alone gives a
    # numpy scalar, a copy that torch cannot share)
    return host[rg.assignment[replica], ...] if rg is not None and rg.num_groups > 1 else host


def replica_value(v: Variable, host: np.ndarray, replica: int, replicas: int) -> np.ndarray:
    """What ``replica`` holds of ``v`` on the device, from the host value ``host``."""
    value = group_value(v, host, replica)
    info = remote_info(v)
    if info is None or info.shard_over == 1:
        return value
    members = shard_members(v, replica, replicas)
    size = ceil(value.size / info.shard_over)
    flat = np.zeros(size * info.shard_over, value.dtype)
    flat[: value.size] = value.reshape(-1)
    pos = members.index(replica)
    return flat[pos * size : (pos + 1) * size]


def host_from_replicas(
    v: Variable, device: Callable[[int], np.ndarray], replicas: int
) -> np.ndarray:
    """The host value of ``v`` rebuilt from the replicas (``device(r)``: replica r's copy).

    A group's value is read from its first replica (and its shard group, when sharded)."""
    per_group = [
        replica_whole_value(v, device, members[0], replicas)
        for members in _group_members(v, replicas)
    ]
    rg = v.replica_grouping
    return np.stack(per_group) if rg is not None and rg.num_groups > 1 else per_group[0]


def replica_whole_value(
    v: Variable, device: Callable[[int], np.ndarray], replica: int, replicas: int
) -> np.ndarray:
    """The whole value ``replica`` sees of ``v``: its own copy, or for a replica-sharded
    variable the shards of its shard group joined (what an all-gather would give it)."""
    info = remote_info(v)
    if info is None or info.shard_over == 1:
        # a sharded variable's one shard may be its whole value flat (check_spec)
        return device(replica).reshape(v.shape)
    flat = np.concatenate([device(r).reshape(-1) for r in shard_members(v, replica, replicas)])
    return flat[: prod(v.shape)].reshape(v.shape)


def read_replicas(v: Variable, replicas: int) -> List[int]:
    """The replicas whose copies `host_from_replicas` reads for ``v`` (in that order)."""
    info = remote_info(v)
    out: List[int] = []
    for members in _group_members(v, replicas):
        if info is not None and info.shard_over > 1:
            out += shard_members(v, members[0], replicas)
        else:
            out.append(members[0])
    return out


class RemoteState:
    """Streaming Memory of one Session: every remote buffer on every replica, the remote
    variables stored in them and the on-chip shards of replica-sharded variables. Only the
    replicas this process runs (``runtime.local``) have Streaming Memory here."""

    def __init__(self, ir, runtime, on_chip: List[Variable]) -> None:
        self.replicas = ir.replication_factor
        self.runtime = runtime
        self.local = runtime.local
        self.buffers = list(ir._remote_buffers.values())
        self.variables = [v for v in ir.main_graph.variables if remote_info(v) is not None]
        # on-chip shard -> its index in the Session's state list
        self.shards: Dict[Variable, int] = {
            v: i for i, v in enumerate(on_chip) if shard_source(v) is not None
        }
        # the remote variables of on-chip shards: their entries are written only when the
        # shards are stored (`store_shards`), so they cannot be a framework's live tensor
        self.sources = {shard_source(v) for v in self.shards}
        self.pending: set = set()  # variables whose own buffer is not made yet (allocate)
        self.host: Mapping[Variable, np.ndarray] = {}
        self.whole: Dict[Variable, torch.Tensor] = {}  # the tensor of an own buffer's views
        _check_not_used_directly(ir, self.variables)

    def allocate(self, host: Mapping[Variable, np.ndarray]) -> None:
        """Streaming Memory holding the host values ``host`` (done once: later attaches write
        the host values into what is there). The buffers of a variable that are views of its
        whole value (`own_buffer`) are not made until used (`entry`, `materialise`): storage
        shared with a framework's tensor before then (`share`) is never copied."""
        self.host = host
        if not self.runtime.remote:
            self.pending = {v for v in self.variables if self.own_buffer(v)}
            for b in {_remote(v).buffer for v in self.pending}:
                self.runtime.remote[b] = None  # made with its variable's value when used
            for b in self.buffers:
                if b not in self.runtime.remote:
                    shape, dt = (b.entries, *b.tensor_shape), b.tensor_dtype.as_torch()
                    self.runtime.remote[b] = [torch.zeros(shape, dtype=dt) for _ in self.local]
        for v in self.variables:
            if v not in self.pending:
                self.write(v, host[v])

    def own_buffer(self, v: Variable) -> bool:
        """Whether ``v``'s buffers can be views of one tensor of its whole value (to be shared
        with a framework): one entry per buffer, and one replica, or ``v`` sharded into equal
        shards over all the replicas, each run by this process (an RTS shard is then a slice
        of the whole value, where an unsharded variable's replicas may diverge); not the
        source of an on-chip shard."""
        info = remote_info(v)
        if info is None or info.buffer.entries != 1 or v in self.sources:
            return False
        if info.shard_over == 1 and v.nelms != prod(info.buffer.tensor_shape):
            return False  # an entry holds only its leading elements (`_check_entry`)
        if info.shard_over == 1:
            return self.replicas == 1
        rg = v.replica_grouping
        return (
            info.shard_over == self.replicas == len(self.local)
            and v.nelms % info.shard_over == 0
            and (rg is None or rg.num_groups == 1)
        )

    def materialise(self) -> None:
        """Make every pending buffer, a copy of its variable's host value (before a run)."""
        for v in list(self.pending):
            self.whole_value(v)

    def _make(self, v: Variable, value: torch.Tensor) -> torch.Tensor:
        """``value`` (``v``'s whole value, contiguous) becomes the storage of ``v``'s buffers:
        on each replica a view of its shard (of all of it, unsharded)."""
        info = _remote(v)
        flat, b = value.view(-1), info.buffer
        size = flat.numel() // info.shard_over
        places = [shard_members(v, r, self.replicas).index(r) for r in self.local]
        self.runtime.remote[b] = [
            flat[i * size : (i + 1) * size].view(b.entries, *b.tensor_shape) for i in places
        ]
        self.whole[v] = value
        self.pending.discard(v)
        return value

    def share(self, v: Variable, t: torch.Tensor) -> torch.Tensor:
        """Make ``t`` (contiguous, ``v``'s dtype and size: `own_buffer`) the storage of
        ``v``'s buffers, with the values ``t`` holds now (no copy)."""
        return self._make(v, t)

    def whole_value(self, v: Variable) -> torch.Tensor:
        """The tensor whose views are ``v``'s buffers (`own_buffer`), made from its host value
        if not made yet."""
        if v in self.pending:
            return self._make(v, host_to_torch(np.array(self.host[v], copy=True)))
        return self.whole[v]

    def entry(self, v: Variable, replica: int) -> torch.Tensor:
        info = _remote(v)
        if v in self.pending:
            self.whole_value(v)
        return self.runtime.remote[info.buffer][replica - self.local[0]][info.offset]

    def write(self, v: Variable, host: np.ndarray) -> None:
        """Put the host value of remote variable ``v`` into its entry on every local replica
        (a value larger than an entry: its leading elements, as PopART streams it)."""
        for r in self.local:
            value = replica_value(v, host, r, self.replicas).reshape(-1)
            entry = self.entry(v, r)  # a one-shard entry may hold the value flat (check_spec)
            entry.copy_(host_to_torch(value[: entry.numel()].copy()).reshape(entry.shape))

    def value(self, v: Variable, replica: int) -> np.ndarray:
        """What ``replica`` holds of ``v``, as the host reads it back: its entry, or for a
        value larger than an entry the host value with its leading elements read back."""
        entry = torch_to_host(self.entry(v, replica))
        if _remote(v).shard_over > 1 or entry.size == v.nelms:
            return entry
        whole = np.array(group_value(v, self.host[v], replica), copy=True)
        whole.reshape(-1)[: entry.size] = entry.reshape(-1)
        return whole

    def load_shards(self, device: Dict[int, List[torch.Tensor]], only=None) -> None:
        """Copy each on-chip shard from its remote variable's entry (weights to the device)."""
        for shard, i in self.shards.items():
            if only is None or _source(shard) in only:
                for r, state in device.items():
                    state[i].copy_(self.entry(_source(shard), r))

    def store_shards(self, device: Dict[int, List[torch.Tensor]]) -> None:
        """Copy each on-chip shard back into its remote variable's entry."""
        for shard, i in self.shards.items():
            for r, state in device.items():
                self.entry(_source(shard), r).copy_(state[i])


def _remote(v: Variable) -> RemoteInfo:
    """The `RemoteInfo` of ``v``, which the caller knows is a remote variable."""
    info = remote_info(v)
    assert info is not None, f"{v.id} is not a remote variable"
    return info


def _source(shard: Variable) -> Variable:
    """The remote variable of an on-chip shard (`shards` holds only shards)."""
    source = shard_source(shard)
    assert source is not None, f"{shard.id} is not a replica shard"
    return source


def _check_not_used_directly(ir, variables: List[Variable]) -> None:
    remote = set(variables)
    for op in ir.main_graph._ops:
        for t in op.inputs:
            if t in remote:
                info = _remote(t)
                raise ValueError(
                    f"{op.type}.{op.id} reads remote variable {t.id!r}, which lives in remote "
                    f"buffer {info.buffer.remote_buffer_id} entry {info.offset} (Streaming "
                    "Memory). Load it first with ops.remote_load(buffer, offset)."
                )
