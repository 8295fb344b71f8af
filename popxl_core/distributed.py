"""Replicas as processes: a Session inside a torch.distributed job runs only its share.

Launch the same script in P processes (``torchrun --nproc_per_node=P script.py``, or your own
``torch.distributed.init_process_group`` with any backend) and build ``Ir(replication=R)``
as usual: a Session then runs replicas ``[rank * R/P, (rank + 1) * R/P)`` in each process,
holding only their variables, remote buffers and host-data slices. ``Ir(replication=
"popdist")`` takes the replication from the launcher: one replica per process (times
``$POPXL_REPLICAS_PER_PROCESS``). Under torchrun the process group is initialised for you
(gloo, from torchrun's environment) when the first replicated Ir or Session needs it.

Collectives exchange the local replicas' values between processes (`sim.exchange`, an
``all_gather`` on a gloo group) and each replica then applies the same reduction, in replica
order, as the one-process simulation: the numbers are bit-identical to R replicas in one
process. `Session.run` takes the whole ``[transfers, R, ...]`` host arrays (each process uses
its slice) or only this process's ``[transfers, R/P, ...]`` share, and returns the outputs
of all R replicas; `get_tensors_data` and `weights_to_host` gather what they read, so every
process must call them (and `run`) at the same points.

``POPXL_COLLECTIVE_TIMEOUT`` (seconds, default 60) bounds every exchange: a peer that dies
or hangs makes the others raise `PeerFailureError` naming its rank and the collective.
``POPXL_DISTRIBUTED=0`` keeps a job's processes independent (each simulates all R replicas).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .sim.exchange import (
    Exchange,
    PeerFailureError,
    bytes_tensor,
    pack_arrays,
    tensor_bytes,
    unpack_arrays,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "InputMismatchError",
    "LaunchError",
    "PeerFailureError",
    "Placement",
    "ProgramMismatchError",
    "job_exchange",
    "local_replica_count",
    "local_replicas",
    "placement_for",
    "popdist_replication",
    "world",
]

DEFAULT_TIMEOUT_S = 60.0
_LAUNCH = (
    "launch the script once per process, e.g. `torchrun --nproc_per_node=2 script.py` "
    "(or call torch.distributed.init_process_group(backend='gloo') in every process first)"
)
# the job's default process group and its Exchange (one gloo group per job, made on first use;
# a new default group, after destroy_process_group and a new init, gets a new Exchange)
_job_exchange: List[Tuple[object, Exchange]] = []


class LaunchError(RuntimeError):
    """The program needs processes (a torch.distributed job) that are not there, or does not
    split over the ones that are."""


class InputMismatchError(ValueError):
    """The processes of a job were given different whole-batch inputs for one run."""


class ProgramMismatchError(RuntimeError):
    """The processes of a job built different programs."""


def timeout_s() -> float:
    """The bound on every exchange between processes (``$POPXL_COLLECTIVE_TIMEOUT``)."""
    return float(os.environ.get("POPXL_COLLECTIVE_TIMEOUT", DEFAULT_TIMEOUT_S))


def world(required: bool = False) -> Optional[Tuple[int, int]]:
    """``(rank, processes)`` of the torch.distributed job this process is in, or None.

    The default process group is used when initialised; else, under a launcher that sets
    ``WORLD_SIZE`` > 1 (torchrun), a gloo group is initialised from its environment. With
    ``required``, no job raises `LaunchError` saying how to launch one."""
    if os.environ.get("POPXL_DISTRIBUTED", "1") == "0":
        return _no_world(required, "POPXL_DISTRIBUTED=0 is set")
    import torch.distributed as dist

    if not dist.is_available():
        return _no_world(required, "this torch has no torch.distributed")
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return _no_world(required, "no torch.distributed process group is initialised")
        from datetime import timedelta

        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=timeout_s()))
    size = dist.get_world_size()
    if size == 1:
        return _no_world(required, "the torch.distributed job has one process")
    return dist.get_rank(), size


def _no_world(required: bool, why: str) -> Optional[Tuple[int, int]]:
    if required:
        raise LaunchError(
            f"Ir(replication='popdist') takes its replicas from the launcher, but {why}: "
            f"{_LAUNCH}. For simulated replicas in one process use Ir(replication=R)."
        )
    return None


def popdist_replication() -> int:
    """The replication of ``Ir(replication="popdist")``: processes x replicas per process."""
    found = world(required=True)
    assert found is not None  # required=True raises instead of answering None
    return found[1] * int(os.environ.get("POPXL_REPLICAS_PER_PROCESS", "1"))


def local_replica_count(replicas: int) -> int:
    """How many of ``replicas`` this process runs (all of them outside a job)."""
    found = world() if replicas > 1 else None
    return replicas if found is None else replicas // _checked_split(replicas, found[1])


def local_replicas(replicas: int) -> range:
    """The replicas this process runs (all of them outside a job), e.g. to give each one its
    shard of a dataset (``DistributedSampler(num_replicas=replicas, rank=r)`` for each r)."""
    n = local_replica_count(replicas)
    found = world() if n != replicas else None
    rank = 0 if found is None else found[0]
    return range(rank * n, (rank + 1) * n)


def _checked_split(replicas: int, processes: int) -> int:
    if replicas % processes:
        fits = [p for p in range(1, replicas + 1) if replicas % p == 0]
        raise LaunchError(
            f"Ir(replication={replicas}) does not split over the {processes} processes of "
            f"this torch.distributed job: each process runs replication / processes replicas. "
            f"Launch {' or '.join(map(str, fits))} processes, or make the replication a "
            f"multiple of {processes}."
        )
    return processes


@dataclass(frozen=True)
class Placement:
    """Which of ``replicas`` replicas this process runs: ``local``, ``per_process`` each."""

    replicas: int
    rank: int = 0
    processes: int = 1
    exchange: Optional[Exchange] = None

    @property
    def per_process(self) -> int:
        return self.replicas // self.processes

    @property
    def local(self) -> range:
        n = self.per_process
        return range(self.rank * n, (self.rank + 1) * n)

    def owner(self, replica: int) -> int:
        return replica // self.per_process

    def gather_values(
        self, pairs: Sequence[Tuple[Hashable, int]], local_value: Callable[..., np.ndarray]
    ) -> Dict[Tuple[Hashable, int], np.ndarray]:
        """``local_value(key, replica)`` for every pair, wherever the replica runs. Every
        process passes the same ``pairs``; a key's value has the same shape on every replica."""
        if self.exchange is None:
            return {(k, r): local_value(k, r) for k, r in pairs}
        first = self.local[0]
        specs = {}
        for k, _ in pairs:
            if k not in specs:
                a = local_value(k, first)
                specs[k] = (a.shape, a.dtype)
        mine = [(k, r) for k, r in pairs if self.owner(r) == self.rank]
        payload = pack_arrays([local_value(k, r) for k, r in mine])
        per_rank = [[(k, r) for k, r in pairs if self.owner(r) == p] for p in range(self.processes)]
        width = max(sum(_nbytes(specs[k]) for k, _ in rows) for rows in per_rank)
        padded = np.zeros(width, np.uint8)
        padded[: payload.size] = payload
        owners = [p for p, rows in enumerate(per_rank) if rows]
        if len(owners) == 1:  # e.g. every value from replica 0: one process sends, none pads
            parts = {owners[0]: self.exchange.broadcast("variable values", padded, owners[0])}
        else:
            parts = dict(enumerate(self.exchange.gather("variable values", padded)))
        out: Dict[Tuple[Hashable, int], np.ndarray] = {}
        for p, b in parts.items():
            out.update(zip(per_rank[p], unpack_arrays(b, [specs[k] for k, _ in per_rank[p]])))
        return out

    def take_first_values(self, tensors: Sequence[Tuple[str, torch.Tensor]]) -> List[str]:
        """Make every tensor equal, in place, to its value in process rank 0 (a job's
        processes pass the same names, shapes and dtypes in the same order): what
        DistributedDataParallel does with a model's parameters and buffers when it is made.
        Returns the names of the tensors this process changed ([] outside a job)."""
        if self.exchange is None or not tensors:
            return []
        mine = np.stack([np.frombuffer(_digest(tensor_bytes(t)), np.uint8) for _, t in tensors])
        digests = self.exchange.gather("the initial values' digests", mine.reshape(-1))
        if all(np.array_equal(d, digests[0]) for d in digests):
            return []
        payload = pack_arrays([tensor_bytes(t) for _, t in tensors])
        first = self.exchange.broadcast("rank 0's initial values", payload, 0)
        sizes = [((t.numel() * t.element_size(),), np.uint8) for _, t in tensors]
        changed = []
        for (name, t), b, d in zip(tensors, unpack_arrays(first, sizes), mine):
            if not np.array_equal(np.frombuffer(_digest(b), np.uint8), d):
                with torch.no_grad():
                    t.copy_(bytes_tensor(b, t.shape, t.dtype))
                changed.append(name)
        return changed

    def gather_outputs(
        self,
        local: Dict[object, np.ndarray],
        full: Dict[object, np.ndarray],
        whole_inputs: Dict[str, np.ndarray],
    ) -> None:
        """Fill ``full[s]`` (``[transfers, R, ...]``) from every process's ``local[s]``
        (``[transfers, R/P, ...]``). In the same exchange, the inputs each process was given
        whole (``whole_inputs``: stream name -> array, of which it used its replicas' slice)
        are checked to be the same in every process: else the replicas would have trained on
        rows of different batches, silently."""
        assert self.exchange is not None  # called in a job only (the Session checks)
        keys = list(local)
        specs = [(local[s].shape, local[s].dtype) for s in keys]
        names = sorted(whole_inputs)
        digests = np.zeros((len(names), 8), np.uint8)
        for i, name in enumerate(names):
            digests[i] = np.frombuffer(_digest(whole_inputs[name]), np.uint8)
        payload = pack_arrays([*(local[s] for s in keys), digests])
        parts = self.exchange.gather("the run's outputs", payload)
        tail = digests.size
        _check_same_inputs(names, [b[b.size - tail :].reshape(-1, 8) for b in parts])
        n = self.per_process
        for p, b in enumerate(parts):
            for s, a in zip(keys, unpack_arrays(b[: b.size - tail], specs)):
                full[s][:, p * n : (p + 1) * n] = a


def _digest(a: np.ndarray) -> bytes:
    # an ndarray is a buffer; numpy's stubs do not say so to the type checker
    return hashlib.sha1(np.ascontiguousarray(a).view(np.uint8)).digest()[:8]  # type: ignore[arg-type]


def _check_same_inputs(names: List[str], digests: List[np.ndarray]) -> None:
    for i, name in enumerate(names):
        seen = [(r, d[i].tobytes()) for r, d in enumerate(digests) if d.shape[0] > i]
        given = [(r, d) for r, d in seen if any(d)]
        if len({d for _, d in given}) > 1:
            ranks = " and ".join(str(r) for r, _ in given[:2])
            raise InputMismatchError(
                f"Session.run: stream {name!r} got different data in ranks {ranks}. Each "
                "process given every replica's data uses only its replicas' rows, so the "
                "arrays must be equal in every process: seed the data loader's shuffling the "
                "same way in every process (torch.manual_seed), or pass each process only its "
                "[num_host_transfers, R/P, ...] share."
            )


def _nbytes(spec) -> int:
    shape, dtype = spec
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def placement_for(ir, host: Dict[Any, np.ndarray]) -> Placement:
    """Where ``ir``'s replicas run; in a job, first checks that every process built the same
    program with the same initial values (``host``: variable -> host value)."""
    replicas = ir.replication_factor
    found = world(required=getattr(ir, "_from_launcher", False))
    if found is None or replicas == 1:
        return Placement(replicas)
    rank, size = found
    _checked_split(replicas, size)
    exchange = _exchange_of_job(rank, size)
    check_same_program(exchange, program_lines(ir, host))
    return Placement(replicas, rank, size, exchange)


def job_exchange() -> Optional[Exchange]:
    """The Exchange of this process's torch.distributed job once a replicated Session made
    it (its ``calls``, ``bytes_sent`` and ``seconds`` are totals since); None before."""
    return _job_exchange[0][1] if _job_exchange else None


def _exchange_of_job(rank: int, size: int) -> Exchange:
    """The Exchange of the job's current default process group (made on first use)."""
    import torch.distributed as dist

    group = dist.distributed_c10d._get_default_group()
    if not _job_exchange or _job_exchange[0][0] is not group:
        _job_exchange[:] = [(group, Exchange(rank, size, timeout_s()))]
    return _job_exchange[0][1]


# the same program in every process -------------------------------------------------------
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def program_lines(ir, host: Dict[Any, np.ndarray]) -> List[str]:
    """The Ir as text, one line per op and per variable (with a digest of its initial value):
    what must be equal in every process."""
    lines = [f"Ir replication={ir.replication_factor} transfers={ir.num_host_transfers}"]
    for g in ir._graphs.values():
        lines.append(f"graph {g.id}")
        for op in g._ops:
            ins = ", ".join(f"{t.id} {t.shape} {t.dtype.name}" for t in op.inputs)
            outs = ", ".join(f"{t.id} {t.shape} {t.dtype.name}" for t in op.outputs)
            attrs = _ADDRESS.sub("", repr(sorted(op.attrs.items(), key=lambda kv: kv[0])))
            lines.append(f"  {op.type}.{op.id} ({ins}) -> ({outs}) {attrs}")
    for v, a in host.items():
        view = np.ascontiguousarray(a).view(np.uint8)
        digest = hashlib.sha1(view).hexdigest()[:16]  # type: ignore[arg-type]  # as in _digest
        lines.append(f"variable {v.id} {v.shape} {v.dtype.name} initial value sha1 {digest}")
    return lines


def check_same_program(exchange: Exchange, lines: List[str]) -> None:
    """Raise `ProgramMismatchError` on every process when the programs differ, naming the
    first differing line."""
    digest = hashlib.sha1("\n".join(lines).encode()).hexdigest()
    digests = exchange.gather_object("the program check", digest)
    if len(set(digests)) == 1:
        return
    every = exchange.gather_object("the program check (lines)", lines)
    other = next(r for r, d in enumerate(digests) if d != digests[0])
    a, b = every[0], every[other]
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    at = lambda ls: ls[i] if i < len(ls) else "<end of program>"
    raise ProgramMismatchError(
        f"The processes built different programs: at line {i + 1}, rank 0 has\n    {at(a)}\n"
        f"and rank {other} has\n    {at(b)}\nEvery process must build the same Ir with the "
        "same initial values: run the same script, and seed every random generator (numpy, "
        "torch) the same way in every process."
    )
