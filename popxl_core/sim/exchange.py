"""Bytes between the processes of a torch.distributed job (gloo), for replicas that run as
processes (`popxl_core.distributed`).

Every exchange is an ``all_gather`` of raw bytes on a gloo group made for the simulator, with
its own timeout. Each is preceded by a 16-byte header (what is being exchanged, how many
bytes), so that processes that reached different exchanges (different collectives, or one at
a collective and one reading weights) fail with a `ReplicaMismatchError` instead of
exchanging mismatched buffers. A failed exchange (a peer closed its connection, or did not
answer within the timeout) raises `PeerFailureError` naming the peer rank and the exchange.

Values travel as bytes (``view(uint8)``) and come back with the sender's dtype and shape, so
the receiver computes on exactly the bits the sender had (what bit-identity with the
one-process simulation needs).
"""

from __future__ import annotations

import time
import zlib
from datetime import timedelta
from math import prod
from typing import Any, List, Sequence, Tuple

import numpy as np
import torch

from .rendezvous import ReplicaMismatchError

__all__ = ["Exchange", "PeerFailureError", "tensor_bytes", "bytes_tensor", "unpack_arrays"]

_FAULT_KEY = "popxl_core/exchange-fault/{}"
_PROBE_SECONDS = 5.0  # how long survivors wait for each other's fault marks (3+ processes)


class PeerFailureError(RuntimeError):
    """Another process of the job died, or did not answer an exchange within the timeout."""


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` (any dtype, 0-d included) as a flat uint8 array."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def bytes_tensor(b: np.ndarray, shape, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `tensor_bytes`: a fresh tensor of ``shape`` and ``dtype``."""
    return torch.from_numpy(b.copy()).view(dtype).reshape(shape)


def unpack_arrays(b: np.ndarray, specs: Sequence[Tuple[tuple, Any]]) -> List[np.ndarray]:
    """Numpy arrays of the given ``(shape, dtype)`` read one after the other from bytes ``b``."""
    out, at = [], 0
    for shape, dtype in specs:
        n = prod(shape) * np.dtype(dtype).itemsize
        out.append(b[at : at + n].copy().view(dtype).reshape(shape))
        at += n
    return out


def pack_arrays(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays' bytes, one after the other (C order)."""
    parts = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
    return np.concatenate(parts) if parts else np.empty(0, np.uint8)


class Exchange:
    """One gloo group over all processes of the job, with its own timeout (seconds)."""

    def __init__(self, rank: int, size: int, timeout_s: float) -> None:
        import torch.distributed as dist

        self.rank, self.size, self.timeout_s = rank, size, float(timeout_s)
        self._dist = dist
        # totals since the job started (benchmarks/dist_steps.py reports them per step)
        self.calls, self.bytes_sent, self.seconds = 0, 0, 0.0
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def __repr__(self) -> str:
        return f"Exchange(rank {self.rank} of {self.size}, timeout {self.timeout_s:g} s)"

    # exchanges -----------------------------------------------------------------------
    def gather(self, what: str, payload: np.ndarray) -> List[np.ndarray]:
        """Every process's ``payload`` (flat uint8, the same size everywhere), in rank order."""
        payload = np.ascontiguousarray(payload, np.uint8).reshape(-1)
        start = time.perf_counter()
        self._agree(what, payload.size)
        out = [t.numpy() for t in self._all_gather(torch.from_numpy(payload), what)]
        self.calls += 1
        self.bytes_sent += payload.size
        self.seconds += time.perf_counter() - start
        return out

    def broadcast(self, what: str, payload: np.ndarray, src: int) -> np.ndarray:
        """Rank ``src``'s ``payload`` (flat uint8; every process passes one of that size)."""
        t = torch.from_numpy(np.array(payload, np.uint8).reshape(-1))
        start = time.perf_counter()
        self._agree(what, t.numel())
        try:
            self._dist.broadcast(t, src, group=self.group)
        except Exception as e:  # gloo: closed connection or timeout
            raise self.failure(what, e) from e
        self.calls += 1
        self.bytes_sent += t.numel() if src == self.rank else 0
        self.seconds += time.perf_counter() - start
        return t.numpy()

    def gather_object(self, what: str, obj) -> list:
        """Every process's picklable ``obj``, in rank order (build time only: slow)."""
        out = [None] * self.size
        try:
            self._dist.all_gather_object(out, obj, group=self.group)
        except Exception as e:  # gloo raises RuntimeError or its own types
            raise self.failure(what, e) from e
        return out

    def _agree(self, what: str, nbytes: int) -> None:
        """The header: every process is at the same exchange with the same number of bytes."""
        head = torch.tensor([zlib.crc32(what.encode()), nbytes], dtype=torch.int64)
        heads = self._all_gather(head, what)
        if all(bool((h == head).all()) for h in heads):
            return
        names = self.gather_object(f"{what} (names)", (what, nbytes))
        where = ", ".join(f"rank {r} at {w} ({n} bytes)" for r, (w, n) in enumerate(names))
        raise ReplicaMismatchError(
            f"The processes reached different exchanges ({where}); every process must run the "
            "same program with the same collectives in the same order, and read or write "
            "variables at the same points (Session.get_tensors_data, weights_to_host and run "
            "exchange between processes)."
        )

    def _all_gather(self, t: torch.Tensor, what: str) -> List[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(self.size)]
        try:
            self._dist.all_gather(out, t, group=self.group)
        except Exception as e:  # gloo: closed connection or timeout
            raise self.failure(what, e) from e
        return out

    # faults --------------------------------------------------------------------------
    def failure(self, what: str, err: BaseException) -> PeerFailureError:
        """The error for a failed exchange: which peer stopped answering, and where."""
        peers = self._unresponsive()
        ranks = ", ".join(str(r) for r in peers)
        said = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        return PeerFailureError(
            f"Process rank {self.rank}: the exchange for {what} failed because process rank "
            f"{ranks} stopped answering (it exited, was killed, or hangs). The replicas "
            f"of this job cannot go on without it. An exchange waits at most "
            f"{self.timeout_s:g} s (POPXL_COLLECTIVE_TIMEOUT). gloo: {said}"
        )

    def _unresponsive(self) -> List[int]:
        """The peers that did not mark themselves alive after the failure (with 2 processes:
        the other one). The job's store is asked; when it is gone too, every peer."""
        others = [r for r in range(self.size) if r != self.rank]
        if len(others) == 1:
            return others
        try:
            store = self._dist.distributed_c10d._get_default_store()
            store.set(_FAULT_KEY.format(self.rank), "1")
            deadline = time.monotonic() + min(_PROBE_SECONDS, self.timeout_s)
            missing = others
            while missing and time.monotonic() < deadline:
                missing = [r for r in missing if not store.check([_FAULT_KEY.format(r)])]
                time.sleep(0.05)
            return missing or others
        except Exception:  # the store went down with the process hosting it
            return others
