"""Per-run state the compiled program reads and writes: host streams, the current replica,
the replicas' collective exchange and Streaming Memory (remote buffers).

Replicas of one `Session.run` execute the same compiled program. Without collectives they run
one after the other; with collectives each replica runs in its own greenlet (`lockstep.py`;
or its own thread) and every collective is a barrier where all replicas' values meet, like the
IPU's BSP sync. In a torch.distributed job (`popxl_core.distributed`) the Runtime holds only
this process's replicas (``local``, run as threads): host data and Streaming Memory are indexed
by the replica's slot among them, and at each collective the last local replica to arrive
exchanges the local values with the other processes (`exchange.Exchange`), so every replica
reduces all R values in replica order.
"""

from __future__ import annotations

import enum
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch

from ..host_data import host_to_torch, torch_to_host
from .exchange import bytes_tensor, tensor_bytes
from .lockstep import run_lockstep
from .rendezvous import Barrier, Rendezvous, ReplicaMismatchError

__all__ = [
    "LOCKSTEP",
    "ReplicaSchedule",
    "ReplicaState",
    "Runtime",
    "collective_results",
    "next_transfer",
    "run_replicas",
]


class ReplicaSchedule(enum.Enum):
    """How one run executes its replicas (`batching.ReplicaRuns.prepare` picks it)."""

    FOLDED = "folded"  # one run of the folded program over every replica's rows
    ONE_BY_ONE = "one by one"  # no collectives: each replica's main graph in turn
    LOCK_STEP = "lock step"  # greenlets of one thread meeting at each collective
    THREADS = "threads"  # an OS thread per replica (several processes, or LOCKSTEP off)


@dataclass
class ReplicaState:
    """Where one replica is in a run: its number, its index among this process's replicas
    (host data and Streaming Memory are local), how often it has used each stream, and the
    parity of its next collective's slots. A thread's own (`threading.local`) when replicas
    run in threads; one per greenlet in lock step (`lockstep.py`)."""

    replica: int
    slot: int
    counts: Dict[object, int] = field(default_factory=dict)
    parity: int = 0


class Runtime:
    """Stream buffers of the current `Session.run`, indexed ``[transfer, replica, ...]``."""

    def __init__(self, replicas: int = 1, placement=None) -> None:
        self.inputs: Dict[object, np.ndarray] = {}
        self.outputs: Dict[object, np.ndarray] = {}
        self.replicas = replicas
        # the replicas this process runs (`popxl_core.distributed.Placement`; all by default)
        self.local = range(replicas) if placement is None else placement.local
        self._exchange = None if placement is None else placement.exchange
        # remote buffer -> one tensor [entries, *shape] per local replica (Streaming Memory)
        self.remote: Dict[object, List[torch.Tensor]] = {}
        # the calling replica's `ReplicaState` (a thread's, or the greenlet's in lock step)
        self._local: Any = threading.local()
        self._barrier: Optional[Barrier] = None  # where replicas meet (`meeting`)
        n = len(self.local)
        self._slots: List[List[Any]] = [[None] * n, [None] * n]
        self._gathered: List[Optional[list]] = [None, None]
        self._results: List[Optional[list]] = [None, None]  # lock step: per parity
        self.start_replica(self.local[0])

    def start(self, inputs: Dict[object, np.ndarray], outputs: Dict[object, np.ndarray]) -> None:
        self.inputs, self.outputs = inputs, outputs

    def start_replica(self, replica: int) -> None:
        """Make the calling thread run as ``replica`` with fresh stream counters."""
        self._local.__dict__.update(vars(self.replica_state(replica)))

    def replica_state(self, replica: int) -> ReplicaState:
        """A fresh `ReplicaState` for ``replica`` (one of `local`)."""
        return ReplicaState(replica, replica - self.local[0])

    def run_as(self, state: ReplicaState) -> None:
        """Make the calling code run as the replica of ``state`` (lock step's greenlets
        share one thread: the hub switches states as it switches replicas)."""
        self._local = state

    @property
    def spans_processes(self) -> bool:
        """Whether this run's replicas are in several processes (a torch.distributed job):
        each collective then exchanges values between them."""
        return self._exchange is not None

    def stack_hub(self) -> Any:
        """The lock-step hub a `RowsAt.CALL` site (stacking.py) may wait at (None: not in
        lock step)."""
        barrier = self._barrier
        return barrier.hub if barrier is not None and barrier.stacks else None

    @contextmanager
    def meeting(self, barrier: Barrier) -> Iterator[None]:
        """Replicas meet at ``barrier`` at each collective (a `Rendezvous`, or lock step's
        hub); afterwards the calling thread runs as the first local replica again."""
        saved = self._local
        n = len(self.local)
        self._barrier, self._slots = barrier, [[None] * n, [None] * n]
        try:
            yield
        finally:
            self._barrier, self._local = None, saved
            self.start_replica(self.local[0])

    @property
    def replica(self) -> int:
        return self._local.replica

    @property
    def slot(self) -> int:
        """The calling replica's index among this process's replicas."""
        return self._local.slot

    @property
    def counts(self) -> dict:
        """How many times the calling replica has used each stream in this run."""
        return self._local.counts

    # host streams ------------------------------------------------------------------
    def load(self, stream) -> torch.Tensor:
        buf = self.inputs[stream]
        i = self._transfer(stream, buf)
        return host_to_torch(np.array(buf[i, self._local.slot]))  # 0-d slices are scalars

    def skip(self, stream) -> None:
        """A load whose value nothing reads: the transfer is consumed (and counted) as by
        `load`, without making the tensor."""
        self._transfer(stream, self.inputs[stream])

    def _transfer(self, stream, buf) -> int:
        """The index of the calling replica's next transfer of input ``stream`` (``buf``, the
        host buffer); counted as used."""
        return next_transfer(self._local.counts, stream, buf, "loaded")

    def store(self, stream, value: torch.Tensor) -> None:
        buf = self.outputs[stream]
        i = next_transfer(self._local.counts, stream, buf, "stored")
        buf[i, self._local.slot] = torch_to_host(value.detach())

    # collectives --------------------------------------------------------------------
    def collective(self, value: torch.Tensor, fn: Callable, need: bool = True) -> torch.Tensor:
        """``fn(replica, value, values)`` where ``values`` holds every replica's ``value``;
        ``need=False``: the calling replica reads no result (None in lock step: its copy of a
        group's result is not made, `uniform.py`).

        One barrier per collective: replicas deposit a snapshot of their value in the slots of
        this collective's parity. A replica can only reuse those slots two collectives later,
        after the next barrier, which every replica reaches only once done reading them. The
        snapshot keeps in-place writes after the collective from reaching a slower replica.
        """
        if self._barrier is None:
            if self.replicas > 1:  # the Session runs replicas in threads when collectives exist
                raise RuntimeError("A collective ran outside a threaded multi-replica run.")
            return fn(self.replica, value, [value])
        local = self._local
        if self._barrier.lockstep:
            return self._lockstep_collective(local, value, fn, need)
        parity = local.parity
        slots = self._slots[parity]
        local.parity ^= 1
        slots[local.slot] = (fn, value.clone())
        if self._exchange is None:
            self._barrier.wait()
            if any(f is not fn for f, _ in slots):
                _mismatch(slots)
            return fn(local.replica, value, [v for _, v in slots])
        # replicas in several processes: the last local replica to arrive exchanges the local
        # values with the other processes while the others wait (one exchange per process)
        self._barrier.wait(lambda: self._exchange_slots(parity))
        return fn(local.replica, value, self._gathered[parity])

    def _exchange_slots(self, parity: int) -> None:
        assert self._exchange is not None  # `collective` calls it only between processes
        slots = self._slots[parity]
        fn = slots[0][0]
        if any(f is not fn for f, _ in slots):
            _mismatch(slots, self.local[0])
        name = getattr(fn, "op_name", repr(fn))
        values = [v for _, v in slots]
        parts = self._exchange.gather(f"collective {name}", _packed(values))
        shape, dtype = values[0].shape, values[0].dtype
        n = values[0].numel() * values[0].element_size()
        self._gathered[parity] = [
            bytes_tensor(b[i * n : (i + 1) * n], shape, dtype)
            for b in parts
            for i in range(len(values))
        ]

    def _lockstep_collective(
        self, local, value: torch.Tensor, fn: Callable, need: bool
    ) -> torch.Tensor:
        """In lock step (greenlets) the last replica to arrive computes every replica's
        result while the others wait, their values untouched (no snapshot copies); a result
        the same for a whole group (all-reduce, `collective_results`) is computed once, and
        copied only for the replicas that read it."""
        slots = self._slots[local.parity]
        local.parity ^= 1
        slots[local.replica] = (fn, value, need)
        if all(s is not None for s in slots):
            # the followers' main graph (uniform.py) binds its own copy of each collective
            key = _collective_key(fn)
            if any(s[0] is not fn and _collective_key(s[0]) != key for s in slots):
                _mismatch(slots)
            values = [s[1] for s in slots]
            needs = [s[2] for s in slots]
            self._results[local.parity ^ 1] = collective_results(fn, values, needs)
            slots[:] = [None] * self.replicas
        assert self._barrier is not None  # `collective` sends only lock-step barriers here
        self._barrier.wait()
        return self._results[local.parity ^ 1][local.replica]

    # Streaming Memory ---------------------------------------------------------------
    def remote_entry(self, buffer, offset) -> torch.Tensor:
        """The storage of entry ``offset`` of ``buffer`` on this replica (a view)."""
        entries = self.remote[buffer][self._local.slot]
        i = int(offset)
        if not 0 <= i < entries.shape[0]:
            raise IndexError(
                f"Remote buffer {buffer.remote_buffer_id} has {entries.shape[0]} entries; "
                f"offset {i} is out of range (replica {self.replica})."
            )
        return entries[i]

    def remote_load(self, buffer, offset) -> torch.Tensor:
        return self.remote_entry(buffer, offset).clone()

    def remote_store(self, buffer, offset, value: torch.Tensor) -> None:
        self.remote_entry(buffer, offset).copy_(value)


def next_transfer(counts: Dict[object, int], stream, buf: np.ndarray, verb: str) -> int:
    """The index of the next transfer of host stream ``stream`` in this run (``buf``: its host
    buffer, ``counts``: the transfers made so far), counted as made. Past the buffer's
    ``num_host_transfers`` batches the stream wraps around to the first (PopXL's rule, warned
    about at Session build: `checks.check_transfer_counts`)."""
    i = counts.get(stream, 0)
    counts[stream] = i + 1
    return i % buf.shape[0]


def collective_results(
    fn: Callable, values: List[torch.Tensor], needs: Optional[List[bool]] = None
) -> List[Optional[torch.Tensor]]:
    """Every replica's result of collective ``fn``; where ``fn.group_members`` says the result
    is one per group (replica -> its group's members), computed once per group and copied for
    the group's other members (each replica owns its result), and for a replica whose
    ``needs`` entry is False (it reads no result) neither computed nor copied: None."""
    members = getattr(fn, "group_members", None)
    if members is None:
        return [fn(r, v, values) for r, v in enumerate(values)]
    per_group: Dict[tuple, torch.Tensor] = {}
    out: List[Optional[torch.Tensor]] = []
    for r, v in enumerate(values):
        group = members[r]
        if needs is not None and not needs[r]:
            out.append(None)
        elif group in per_group:
            out.append(per_group[group].clone())
        else:
            per_group[group] = _group_result(fn, r, v, values, group)
            out.append(per_group[group])
    return out


def _group_result(fn: Callable, r: int, v: torch.Tensor, values, group: tuple) -> torch.Tensor:
    """``fn``'s result for ``group``; where ``fn.keeps_result`` (its op runs once a run: the
    result is dead when the run returns) written into the buffer its first result left, so
    a weight-sized reduction is not allocated, and faulted in, every step."""
    if not getattr(fn, "keeps_result", False):
        return fn(r, v, values)
    kept = fn.__dict__.setdefault("kept", {})
    res = fn(r, v, values, out=kept.get(group))
    if group not in kept and all(res is not x for x in values):
        kept[group] = res
    return res


def _collective_key(fn: Callable) -> object:
    """What names a collective op (its function is bound once per compiled graph)."""
    return getattr(fn, "op_name", fn)


def _packed(values: List[torch.Tensor]) -> np.ndarray:
    return np.concatenate([tensor_bytes(v) for v in values])


def _mismatch(slots, first: int = 0) -> None:
    names = [getattr(s[0], "op_name", s[0]) for s in slots]
    where = ", ".join(f"replica {first + r} at {name}" for r, name in enumerate(names))
    raise ReplicaMismatchError(
        f"The replicas reached different collectives ({where}); every replica must run the "
        "same collectives in the same order."
    )


# replicas with collectives as greenlets in lock step (lockstep.py); False: one OS thread
# per replica meeting at a `Rendezvous` (tests run both; `batching.ReplicaRuns` reads it)
LOCKSTEP = True


def run_replicas(runtime: Runtime, body: Callable[[int], None], schedule: ReplicaSchedule) -> None:
    """Run ``body(replica)`` for every replica of this process as ``schedule`` (not FOLDED)
    says: in order, in lock step (greenlets) or one thread per replica. An error in one
    replica breaks the barrier for the others; the first real error is raised."""
    local = runtime.local
    if schedule is ReplicaSchedule.ONE_BY_ONE:
        for r in local:
            runtime.start_replica(r)
            body(r)
        return
    if schedule is ReplicaSchedule.LOCK_STEP:
        run_lockstep(runtime, body)
        return
    barrier = Rendezvous(len(local))
    errors: List[Optional[BaseException]] = [None] * len(local)

    def worker(i: int, r: int) -> None:
        runtime.start_replica(r)
        try:
            with torch.no_grad():
                body(r)
            barrier.finish()
        except BaseException as e:  # re-raised in the caller's thread
            errors[i] = e
            barrier.abort()

    threads = [
        threading.Thread(target=worker, args=(i, r), daemon=True) for i, r in enumerate(local)
    ]
    with runtime.meeting(barrier):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real or any(errors):
        raise (real or [e for e in errors if e is not None])[0]
