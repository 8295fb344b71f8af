"""A Session's variables: host buffers and device values (the storage shared with torch:
session_sharing.py).

The host buffer of a variable is its own data, read in place, until the Session writes it or
hands it out (copy on write); with one replica the device copies are made when the Session
first runs; a variable whose storage is shared (`share_variable_storage`) or handed over
(`device_tensor`) is never copied; `get_tensors_data` reads back only the variables asked
for. So building a large model's program copies none of its weights.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..host_data import host_to_torch, torch_to_host
from ..tensor import Variable
from .remote_state import host_from_replicas, read_replicas, replica_value, replica_whole_value
from .session_sharing import SharedStorage

__all__ = ["SessionWeights", "is_file"]


class SessionWeights(SharedStorage):
    """Session's methods on variable values (the state is made by `Session._init_state` and
    declared on `SharedStorage`, session_sharing.py, with the storage shared with torch)."""

    # weights -----------------------------------------------------------------------
    def weights_from_host(self) -> None:
        """Copy every variable's host value to every replica on the device.

        With one replica the copies are made when first needed (the next run): a variable
        whose storage is shared before then (`share_variable_storage`, popxl_fx's weights)
        is never copied, and until a run the device values are the host values."""
        self._require_attached("weights_from_host")
        replicas = self._ir.replication_factor
        shared = {self._variable_index[v]: t for v, t in self._shared.items()}
        shards = set(self._remote.shards.values())
        self._pending = set()
        if replicas == 1:
            self._pending = set(range(len(self._variables))) - set(shared) - shards
        # the replicas this process runs (all but in a torch.distributed job)
        self._device = {r: self._loaded(r, shared) for r in self._runtime.local}
        self._replicas.unshare(None)  # fresh copies, one per replica
        self._remote.allocate(self._host)
        self._remote.load_shards(self._device)
        self._host_in_sync = True
        self._note_shared_versions()

    def _loaded(self, r: int, shared: Dict[int, torch.Tensor]) -> List[Optional[torch.Tensor]]:
        """Replica ``r``'s device values: replica 0 holds the shared storage, others copies."""
        mine = shared if r == 0 else {}
        return [
            None if r == 0 and i in self._pending else self._load(v, r, mine.get(i))
            for i, v in enumerate(self._variables)
        ]

    def weights_to_host(self) -> None:
        """Copy every variable's device value back to its host buffer (in a torch.distributed
        job, gathered from the processes: every process must call it)."""
        self._require_attached("weights_to_host")
        if self._device is None:
            return
        self._remote.store_shards(self._device)
        readable = self._readable()
        self._read_back([v for v in readable if not _read_only_file(v)])
        _flush_files(self._host[v] for v in readable)
        self._host_in_sync = True
        _refuse_read_only_files([v for v in readable if _read_only_file(v)])

    def _read_back(self, variables: List[Variable]) -> None:
        """These variables' host buffers (and per-replica rows) read from the device."""
        replicas = self._ir.replication_factor
        values = self._replica_values(variables)
        for v in variables:

            def device(r: int, v: Variable = v) -> np.ndarray:
                return values[v, r]

            self._set_host(v, host_from_replicas(v, device, replicas))
            if v in self._per_replica:
                rows = [replica_whole_value(v, device, r, replicas) for r in range(replicas)]
                self._per_replica[v][...] = np.stack(rows)

    def _readable(self) -> List[Variable]:
        """The variables whose host values are read back from the device: not RTS shards,
        nor pending copies (`weights_from_host`: device == host)."""
        return [v for v in (*self._variables, *self._remote.variables) if self._is_readable(v)]

    def _is_readable(self, v: Variable) -> bool:
        if v in self._remote_set:
            return v not in self._remote.pending
        i = self._variable_index.get(v)
        return i is not None and i not in self._pending and v not in self._remote.shards

    def _replica_values(self, variables: List[Variable]) -> Dict[tuple, np.ndarray]:
        """``(variable, replica) -> value`` for the replicas the host values are read from."""
        replicas = self._ir.replication_factor
        pairs = [
            (v, r)
            for v in variables
            for r in (range(replicas) if v in self._per_replica else read_replicas(v, replicas))
        ]
        return self._placement.gather_values(pairs, self._local_value)

    def _local_value(self, v: Variable, replica: int) -> np.ndarray:
        if v in self._remote_set:
            return self._remote.value(v, replica)
        return torch_to_host(self._device_now()[replica][self._variable_index[v]])

    def _host_value(self, v: Variable, replica: int) -> np.ndarray:
        """The host buffer (a view) that ``replica`` holds for ``v``."""
        return replica_value(v, self._host[v], replica, self._ir.replication_factor)

    def _to_device(self, v: Variable, replica: int) -> torch.Tensor:
        return host_to_torch(np.array(self._host_value(v, replica), copy=True))

    def _devices(self) -> Dict[int, List[torch.Tensor]]:
        """The device values, the pending copies (`weights_from_host`) made now."""
        device = self._device_now()
        for i in self._pending:
            device[0][i] = self._to_device(self._variables[i], 0)
        self._pending = set()
        return device

    def _device_now(self) -> Dict[int, List[Any]]:
        """The device values, which `weights_from_host` made (entering the Session runs it)."""
        assert self._device is not None, "weights_from_host has not run"
        return self._device

    def _load(self, v: Variable, replica: int, shared: Optional[torch.Tensor]) -> torch.Tensor:
        """``v``'s device value for ``replica``: a copy of its host value, or, for storage
        shared with `share_variable_storage`, that storage with the host value copied in."""
        if shared is None:
            return self._to_device(v, replica)
        shared.copy_(self._host_tensor(v, replica).view(shared.shape))
        return shared

    def _host_tensor(self, v: Variable, replica: int) -> torch.Tensor:
        """``v``'s host value for ``replica`` as a torch tensor, to be read (copied) only."""
        with warnings.catch_warnings():  # the buffer may be read-only (borrowed, a fill)
            warnings.simplefilter("ignore", UserWarning)
            return host_to_torch(self._host_value(v, replica))

    def _sync(self, variables: List[Variable]) -> None:
        """Bring these variables' host buffers up to date with the device, only these (a large
        model's weights and state are not copied to read a few); in a torch.distributed job
        every variable (`weights_to_host`: the processes exchange them together)."""
        if len(self._device or ()) != self._ir.replication_factor:
            if variables:
                self.weights_to_host()
            return
        wanted = [
            v for v in dict.fromkeys(variables) if v not in self._synced and self._is_readable(v)
        ]
        if not wanted:
            return
        if any(v in self._remote.sources for v in wanted):
            self._store_shards()
        self._read_back(wanted)
        self._synced.update(wanted)

    def _store_shards(self) -> None:
        """The on-chip shards' values into their remote variables' entries, once between runs:
        reading N remote variables one by one stored every shard N times. The entries then
        hold the shards' values until the device values change: by a run or a write into a
        shared tensor, both of which give `_synced` a new set (as every reset of it does), so
        the stored state is keyed by that set's identity. A shard whose storage a framework
        holds (one replica: shared or handed out) may be written between runs unseen: while
        one is, every read stores them all, as before."""
        shared = any(s in self._shared for s in self._remote.shards)
        if self._shards_stored_for is self._synced and not shared:
            return
        self._remote.store_shards(self._device_now())
        self._shards_stored_for = self._synced

    def _set_host(self, v: Variable, value: np.ndarray) -> None:
        """Write ``v``'s host buffer; a borrowed one is replaced (one pass, not two)."""
        if v in self._borrowed:
            buf = np.empty(self._host[v].shape, self._host[v].dtype)
            buf[...] = value
            self._host[v] = buf
            self._borrowed.discard(v)
        else:
            self._host[v][...] = value

    def _owned(self, v: Variable) -> np.ndarray:
        """``v``'s host buffer, made the Session's own (copied from the variable's data) before
        it is written or handed out."""
        if v in self._borrowed:
            self._host[v] = np.array(self._host[v], copy=True)
            self._borrowed.discard(v)
        return self._host[v]


def is_file(v: Variable) -> bool:
    """A writable ``np.memmap`` is the host buffer itself (as PopXL: `weights_to_host`
    writes the file, `get_tensor_data` views it)."""
    return isinstance(v._data, np.memmap) and v._data.flags.writeable


def _read_only_file(v: Variable) -> bool:
    return isinstance(v._data, np.memmap) and not v._data.flags.writeable


def _flush_files(buffers) -> None:
    """Write memmap host buffers to their files, as PopXL's weights_to_host does: the file is
    the checkpoint (popxl.addons' memmap variables)."""
    for buf in buffers:
        if isinstance(buf, np.memmap) and buf.flags.writeable:
            buf.flush()


def _refuse_read_only_files(variables: List[Variable]) -> None:
    """PopXL's weights_to_host cannot write a read-only memmap: it raises. The other
    variables are already on the host, and these keep their files' values."""
    if variables:
        names = ", ".join(repr(v.id) for v in variables)
        raise ValueError(
            f"weights_to_host: variable(s) {names} are backed by read-only np.memmap files "
            "(mode 'r'), which cannot be written; their host values stay the files'. Open the "
            "memmap with mode 'r+' to keep what the device computed."
        )
