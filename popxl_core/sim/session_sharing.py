"""A Session's variables shared with a framework's own tensors (popxl_fx: the torch module's
parameters and the optimizer's state).

`share_variable_storage` makes a variable's device value a given torch tensor, `device_tensor`
hands one out, `read_tensor` names the tensor a host value is read from; with replicas, a write
into a shared tensor between runs reaches every replica (`_spread_shared_writes`). The state is
the Session's (`Session._init_state`); `SessionWeights` (session_weights.py) reads and writes
the host buffers.
"""

from __future__ import annotations

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

from ..tensor import Variable
from . import checks
from .remote_state import RemoteState, read_replicas

if TYPE_CHECKING:  # pragma: no cover
    from ..distributed import Placement
    from ..ir import Ir
    from .batching import ReplicaRuns
    from .runtime import Runtime

__all__ = ["SharedStorage"]


class SharedStorage:
    """Session's methods on variables whose values are a framework's torch tensors."""

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
    _shards_stored_for: Optional[Set[Variable]]
    _host_in_sync: bool

    if TYPE_CHECKING:  # pragma: no cover (Session's and SessionWeights' methods)

        def _require_attached(self, what: str) -> None: ...

        def _device_now(self) -> Dict[int, List[Any]]: ...

        def _devices(self) -> Dict[int, List[torch.Tensor]]: ...

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
        # (the host copies of the others are read from the device when next asked for)
        for v, view in views.items():
            if v in self._remote_set:  # its own remote buffer becomes the tensor
                self._remote.share(v, view)
                continue
            i = self._variable_index[v]
            self._device_now()[0][i] = view
            # a variable the replicas share now becomes the tensor on every replica (what the
            # next run's check would make of copies of it); the others get copies
            if not self._replicas.adopt(self._device_now(), i, view):
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


_VERSION = attrgetter("_version")


def _same(a: list, b: list) -> bool:
    """The same objects, element by element."""
    return len(a) == len(b) and all(map(is_, a, b))
