"""A Session's variables: host buffers, device values and the storage shared with torch.

The host buffer of a variable is its own data, read in place, until the Session writes it or
hands it out (copy on write); with one replica the device copies are made when the Session
first runs; a variable whose storage is shared (`share_variable_storage`) or handed over
(`device_tensor`) is never copied; `get_tensors_data` reads back only the variables asked
for. So building a large model's program copies none of its weights.
"""

from __future__ import annotations

import warnings
from operator import attrgetter, is_
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

import numpy as np
import torch

from ..host_data import host_to_torch, torch_to_host
from ..tensor import Variable
from . import checks
from .remote_state import (
    RemoteState,
    host_from_replicas,
    read_replicas,
    replica_value,
    replica_whole_value,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..distributed import Placement
    from ..ir import Ir
    from .batching import ReplicaRuns
    from .runtime import Runtime

__all__ = ["SessionWeights", "is_file"]


class SessionWeights:
    """Session's methods on variable values (the state is made by `Session._init_state`)."""

    # the Session's state these methods use (made by `Session.__init__` and `_init_state`),
    # declared for the type checker; replica -> its variables' device values (None at an index
    # still pending: `_devices` fills them), None until `weights_from_host`
    _ir: "Ir"
    _placement: "Placement"
    _runtime: "Runtime"
    _replicas: "ReplicaRuns"
    _variables: List[Variable]
    _variable_index: Dict[Variable, int]
    _remote: RemoteState
    _remote_set: FrozenSet[Variable]
    _host: Dict[Variable, np.ndarray]
    _borrowed: Set[Variable]
    _per_replica: Dict[Variable, np.ndarray]
    _device: Optional[Dict[int, List[Any]]]
    _shared: Dict[Variable, torch.Tensor]
    _shared_versions: tuple
    _pending: Set[int]
    _synced: Set[Variable]
    _host_in_sync: bool

    if TYPE_CHECKING:  # pragma: no cover (Session's method)

        def _require_attached(self, what: str) -> None: ...

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
            self._remote.store_shards(self._device_now())  # the shards' values into their entries
        self._read_back(wanted)
        self._synced.update(wanted)

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

    def take_first_process_values(self, tensors: Sequence[Tuple[str, torch.Tensor]]) -> List[str]:
        """In a torch.distributed job, make each named host tensor equal, in place, to its
        value in process rank 0, as DistributedDataParallel does with a model's parameters
        and buffers when it is made; every process calls it at the same point with the same
        names, shapes and dtypes. Returns the names whose values this process changed (none
        outside a job). For frameworks whose own tensors become the variables' values
        (`share_variable_storage`), where the program check cannot see them."""
        return self._placement.take_first_values(list(tensors))

    def share_variable_storage(self, tensors: Mapping[Variable, torch.Tensor]) -> None:
        """Make each variable's device value *be* the given torch tensor: its storage, with
        the values it holds now (no copy). Runs update it in place, and a write into it
        between runs is what the next run reads. For frameworks whose own tensors are the
        weights (popxl_fx: the torch module's parameters and the optimizer's state).

        Each tensor must be a contiguous CPU tensor of the variable's dtype and element count
        (a view of the variable's shape is taken). With replicas, for variables whose host
        value is replica 0's (`storage_shareable`): replica 0's value is the tensor, the
        others hold copies (the same tensor where a run shares its uniform work, uniform.py),
        and a write into it between runs reaches every replica before the next run (its
        ``_version`` moved: `_spread_shared_writes`).
        """
        self._require_attached("share_variable_storage")
        checks.check_tensors_of(self, tensors, "share_variable_storage")
        views = {v: self._shareable(v, t) for v, t in tensors.items()}
        if self._ir.replication_factor > 1:
            self._spread_shared_writes()  # earlier writes first: the versions are noted after
            self._replicas.unshare(self._device)  # the next run checks the replicas agree
        # (the host copies of the others are read from the device when next asked for)
        for v, view in views.items():
            if v in self._remote_set:  # its own remote buffer becomes the tensor
                self._remote.share(v, view)
                continue
            i = self._variable_index[v]
            self._device_now()[0][i] = view
            self._copy_to_replicas(i, view)
            self._pending.discard(i)
            self._shared[v] = view
        self._host_in_sync = False  # the host copies are now older than the shared tensors
        self._synced = set()
        self._note_shared_versions()

    def storage_shareable(self, v: Variable) -> bool:
        """Whether `share_variable_storage` can make ``v``'s device value a given tensor: a
        remote variable in one-entry buffers that can be views of one tensor (one replica, or
        RTS shards over all the replicas: `RemoteState.own_buffer`), or an on-chip variable,
        with replicas one whose host value is replica 0's (no replica groups, RTS shards or
        per-replica reads) in a process running every replica."""
        self._require_attached("storage_shareable")
        if v in self._remote_set:
            return self._remote.own_buffer(v)
        if v not in self._variable_index:
            return False
        replicas = self._ir.replication_factor
        if replicas == 1:
            return True
        return (
            len(self._device_now()) == replicas
            and v not in self._remote.shards
            and v not in self._per_replica
            and read_replicas(v, replicas) == [0]
        )

    def _note_shared_versions(self) -> None:
        """With replicas: the shared tensors' versions now (the device's own writes), as
        ``(indices, tensors, versions)``; ``()`` when none is shared. Noted after every run:
        the versions are read with one C-level ``map`` pass, the indices looked up again only
        when the shared tensors changed."""
        if self._ir.replication_factor == 1:
            return
        tensors = list(self._shared.values())
        if not tensors:
            self._shared_versions = ()
            return
        last = self._shared_versions
        if last and _same(last[1], tensors):
            indices = last[0]
        else:
            indices = [self._variable_index[v] for v in self._shared]
        self._shared_versions = (indices, tensors, list(map(_VERSION, tensors)))

    def _spread_shared_writes(self) -> None:
        """With replicas: a shared tensor written since the last run (its ``_version`` moved)
        is copied to the other replicas (replica 0's value is the tensor itself)."""
        if not self._shared_versions:
            return
        indices, tensors, versions = self._shared_versions
        now = list(map(_VERSION, tensors))
        if now == versions:
            return
        moved = [(i, t) for i, t, v, w in zip(indices, tensors, versions, now) if v != w]
        self._replicas.unshare(self._device)
        for i, t in moved:
            self._copy_to_replicas(i, t)
        self._host_in_sync = False
        self._synced = set()

    def _copy_to_replicas(self, i: int, t: torch.Tensor) -> None:
        """Variable ``i``'s value ``t`` (replica 0's, the shared tensor) into every other
        replica's own copy (none without replicas)."""
        for rep in self._device_now().values():
            if rep[i] is not t:
                rep[i].copy_(t)

    def device_tensor(self, v: Variable) -> torch.Tensor:
        """The device value of on-chip variable ``v`` (one replica), or the whole value of a
        remote variable whose buffers are views of one tensor (`storage_shareable`), as the
        torch tensor the runs update in place, not a copy: a framework adopts it as its own
        tensor (the other direction of `share_variable_storage`), and it stays shared."""
        self._require_attached("device_tensor")
        if v in self._remote_set and self._remote.own_buffer(v):
            return self._remote.whole_value(v).view(v.shape)  # its buffers are views of it
        if self._ir.replication_factor > 1 or v not in self._variable_index:
            raise ValueError(
                f"device_tensor: {v!r} is not an on-chip variable of a one-replica Session."
            )
        t = self._devices()[0][self._variable_index[v]]
        self._shared[v] = t
        return t

    def read_tensor(self, v: Variable) -> Optional[torch.Tensor]:
        """The device tensor ``v``'s host value is read from, where that is one on-chip
        tensor (``v`` in one replica group, not sharded, not remote) and this process runs
        every replica (not a torch.distributed job), else None (read `get_tensors_data`).
        To be copied from before the next run, not written nor kept: with replicas, a
        framework copies its weights back from it without a round trip through the host
        buffers (`weights_to_host` copies every variable of every group)."""
        self._require_attached("read_tensor")
        i = self._variable_index.get(v)
        if i is None or self._device is None or v in self._remote.shards:
            return None
        if v in self._per_replica:
            return None
        # in a torch.distributed job every process reads host values together (an exchange)
        if len(self._device) != self._ir.replication_factor:
            return None
        replicas = read_replicas(v, self._ir.replication_factor)
        if len(replicas) != 1:
            return None
        return self._devices()[replicas[0]][i]

    def _shareable(self, v: Variable, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(v, Variable) or (
            v not in self._variable_index and v not in self._remote_set
        ):
            raise ValueError(
                f"share_variable_storage: {v!r} is not an on-chip or remote variable of this "
                "Session's Ir."
            )
        problem = (
            "is not a torch.Tensor"
            if not isinstance(t, torch.Tensor)
            else f"has dtype {t.dtype}, the variable {v.dtype.name}"
            if t.dtype != v.dtype.as_torch()
            else f"has {t.numel()} elements, the variable {v.nelms}"
            if t.numel() != v.nelms
            else "is not a contiguous CPU tensor"
            if not (t.is_contiguous() and t.device.type == "cpu")
            else None
        )
        if problem:
            raise ValueError(f"share_variable_storage: the tensor for {v.id!r} {problem}.")
        if not self.storage_shareable(v):
            raise ValueError(
                f"share_variable_storage: {v.id!r} is not one tensor read from replica 0 "
                f"of the {self._ir.replication_factor} replicas (replica groups, RTS shards, "
                "per-replica reads, or a process running some replicas only); use "
                "write_variables_data / get_tensors_data instead."
            )
        return t.detach().view(v.shape)


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


_VERSION = attrgetter("_version")


def _same(a: list, b: list) -> bool:
    """The same objects, element by element."""
    return len(a) == len(b) and all(map(is_, a, b))
