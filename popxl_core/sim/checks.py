"""Session-side misuse checks: host transfer counts, output buffers, tensors of another Ir.

Each check raises where the mistake can first be seen (Session build, or `run` for what only
the data decides), naming the Session, the stream or tensor and the offending value.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType
from typing import Any, Dict, Iterable, List, Mapping, Optional

import numpy as np

from ..graph import Graph
from ..ops.call import REPEAT
from ..ops.conditional import CONDITIONAL
from ..ops.io import HOST_LOAD, HOST_STORE

__all__ = [
    "MissingStreamError",
    "TransferCountWarning",
    "StreamOutputs",
    "built_at",
    "check_device",
    "check_fits",
    "check_output_buffers",
    "check_run_counts",
    "check_tensors_of",
    "check_transfer_counts",
    "names_hint",
    "running_op",
    "transfer_counts",
    "with_op_context",
]

_DATA_DEPENDENT = -1  # a stream whose transfer count depends on an If's condition


def built_at() -> str:
    """``file:line`` of the first stack frame outside this package (where the user is)."""
    f: Optional[FrameType] = sys._getframe(1)
    pkg = __name__.split(".")[0]
    while f is not None and f.f_globals.get("__name__", "").startswith(pkg):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "?"


# host transfer counts ----------------------------------------------------------------------
def transfer_counts(graph: Graph) -> Dict[object, int]:
    """How many times one run of ``graph`` loads or stores each stream (through calls, loops
    and both branches of an If; -1 where the branches disagree, so only the data decides)."""
    counts: Dict[object, int] = {}
    for op in graph._ops:
        if op.opdef in (HOST_LOAD, HOST_STORE):
            _add(counts, {op.attrs["stream"]: 1})
        elif op.opdef is CONDITIONAL:
            _add(counts, _branch_counts([transfer_counts(g) for g in op.called_graphs]))
        elif op.called_graphs:
            times = op.attrs.get("repeat_count", 1) if op.opdef is REPEAT else 1
            for g in op.called_graphs:
                _add(counts, {s: _times(n, times) for s, n in transfer_counts(g).items()})
    return counts


def _times(n: int, k: int) -> int:
    return _DATA_DEPENDENT if n == _DATA_DEPENDENT else n * k


def _add(into: Dict[object, int], more: Mapping[object, int]) -> None:
    for s, n in more.items():
        old = into.get(s, 0)
        into[s] = _DATA_DEPENDENT if _DATA_DEPENDENT in (old, n) else old + n


def _branch_counts(branches: List[Dict[object, int]]) -> Dict[object, int]:
    streams = {s for b in branches for s in b}
    out = {}
    for s in streams:
        ns = {b.get(s, 0) for b in branches}
        out[s] = ns.pop() if len(ns) == 1 else _DATA_DEPENDENT
    return out


class TransferCountWarning(UserWarning):
    """A host stream is transferred a number of times per run other than num_host_transfers."""


def check_transfer_counts(session, counts: Mapping[Any, int]) -> None:
    """Warn, once per stream, where a stream is transferred a number of times per run other
    than ``num_host_transfers``.

    PopXL runs such programs (its session documentation, "Number of host transfers"): every
    stream's data buffer holds ``num_host_transfers`` batches and each transfer takes the
    next, so a stream loaded fewer times reads only the first batches, one loaded more times
    wraps around to the first batch again, and a stream stored fewer times leaves its last
    batches unwritten (zeros here). BERT's SQuAD inference loads once a run with
    ``num_host_transfers`` set to its device iterations.
    """
    nht = session.ir.num_host_transfers
    wrong = {s: n for s, n in counts.items() if n not in (nht, _DATA_DEPENDENT)}
    for stream, n in sorted(wrong.items(), key=lambda kv: kv[0].tensor_id):
        warnings.warn(
            TransferCountWarning(
                f"{session!r}: {type(stream).__name__} {stream.tensor_id!r} is {_verb(stream)} "
                f"{n} time{'s' * (n != 1)} per run, but {session.ir!r} has "
                f"num_host_transfers={nht}: "
                + _what_happens(stream, n, nht)
                + " (PopXL's rule). Set ir.num_host_transfers to the count if that is meant."
            ),
            stacklevel=2,
        )


def _what_happens(stream, n: int, nht: int) -> str:
    what = "writes" if _verb(stream) == "stored" else "reads"
    if n < nht:
        rest = ", the rest left zero" if what == "writes" else ""
        return f"each run {what} the first {n} of the {nht} batches of its buffer{rest}"
    return f"each run {what} the {nht} batches of its buffer, then wraps around to the first"


def _describe_counts(counts: Mapping[Any, int]) -> str:
    parts = [
        f"{type(s).__name__} {s.tensor_id!r} is {_verb(s)} {n} time{'s' * (n != 1)}"
        for s, n in sorted(counts.items(), key=lambda kv: kv[0].tensor_id)
    ]
    return "; ".join(parts)


def _verb(stream) -> str:
    return "loaded" if type(stream).__name__ == "HostToDeviceStream" else "stored"


def check_run_counts(session, runtime, streams: Iterable[object]) -> None:
    """After a run: the data-dependent streams (inside an If) must also match the count."""
    nht = session.ir.num_host_transfers
    wrong = {s: runtime.counts.get(s, 0) for s in streams}
    wrong = {s: n for s, n in wrong.items() if n != nht}
    if wrong:
        raise RuntimeError(
            f"{session!r}: in this run (replica {runtime.replica}) "
            + _describe_counts(wrong)
            + f", but num_host_transfers is {nht}: the If branches taken did not transfer "
            "every stream num_host_transfers times."
        )


# outputs -----------------------------------------------------------------------------------
class MissingStreamError(KeyError):
    """A KeyError whose message reads as a sentence (KeyError quotes its argument)."""

    def __str__(self) -> str:
        return str(self.args[0])


class StreamOutputs(dict):
    """`Session.run`'s result: a dict keyed by stream that explains a missing key."""

    def __missing__(self, key):
        name = getattr(key, "tensor_id", None)
        if name is None:
            raise MissingStreamError(
                f"Session.run outputs are keyed by DeviceToHostStream objects, got {key!r}."
            )
        have = ", ".join(repr(s.tensor_id) for s in self) or "none"
        raise MissingStreamError(
            f"No output for stream {name!r}: no host_store in the Ir writes to it, so the "
            f"Session has nothing to return for it (outputs: {have}). Add "
            f"ops.host_store({name}_stream, tensor) before building the Session."
        )


def check_output_buffers(session, outputs: Mapping, expected: Iterable[Any]) -> None:
    """run_with_outputs buffers: one per d2h stream, exact shape and dtype, writable and
    C-contiguous (a reshape of anything else would be a copy and the results would be lost)."""
    expected = list(expected)
    missing = [s.tensor_id for s in expected if s not in outputs]
    unknown = [getattr(s, "tensor_id", repr(s)) for s in outputs if s not in expected]
    if missing or unknown:
        raise ValueError(
            f"{session!r}.run_with_outputs: output buffers do not match the streams the Ir "
            f"stores to: missing {missing}, unexpected {unknown}."
        )
    for s in expected:
        _check_buffer(session, s, outputs[s])


def _check_buffer(session, stream, buf) -> None:
    want_shape = session._full_input_shape(stream.shape)
    want_dtype = stream.dtype.as_numpy()
    name = stream.tensor_id
    if not isinstance(buf, np.ndarray):
        raise TypeError(
            f"Output buffer for stream {name!r} must be a numpy array, got {type(buf).__name__}."
        )
    if buf.shape != want_shape or buf.dtype != want_dtype:
        raise ValueError(
            f"Output buffer for stream {name!r} has shape {buf.shape} and dtype {buf.dtype}; "
            f"expected {want_shape} {want_dtype} (session.create_host_outputs() makes one)."
        )
    if not (buf.flags.writeable and buf.flags.c_contiguous):
        raise ValueError(
            f"Output buffer for stream {name!r} must be a writable C-contiguous array "
            "(results written to a copy would be lost); use np.ascontiguousarray."
        )


# tensors of another Ir ---------------------------------------------------------------------
def check_tensors_of(session, tensors: Iterable, what: str) -> Optional[None]:
    """Raise if any tensor was created in another Ir than the Session's."""
    for t in tensors:
        ir = getattr(t, "ir", None)
        if ir is not None and ir is not session.ir:
            raise ValueError(
                f"{session!r}.{what}: {t!r} belongs to {ir!r}, not to the Session's {session.ir!r}."
            )


# errors while a run executes --------------------------------------------------------------
def failing_op(program, tb):
    """The op whose kernel raised, from the traceback through the generated graph code."""
    import re

    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith("<popxl graph"):
            src = tb.tb_frame.f_globals.get("__popxl_sources__", {}).get(code.co_name)
            line = src.splitlines()[tb.tb_lineno - 1] if src else ""
            m = re.search(r"\b(k\d+)\(", line)
            found = program.kernel_ops.get(m.group(1)) if m else found
        tb = tb.tb_next
    return found


def check_device(session, device) -> None:
    """A device given with `Session._set_device` must be the kind the Session was built for
    and have the IPUs its program spans (replicas x IPUs per replica), as Poplar refuses an
    executable on another target."""
    kind = session.device_desc.split(":")[0] if isinstance(session.device_desc, str) else None
    need = len(session.plan.memory) * session.ir.replication_factor
    if device.device_desc != kind or device.numIpus != need:
        raise ValueError(
            f"{session!r} was built for {kind!r} with {need} IPU(s) but was given {device!r}: "
            "an executable runs only on the target it was compiled for. Build the Session with "
            "the device's kind (or give it a matching device)."
        )


def running_op():
    """The op whose kernel is running now (for a kernel's warning), found on the live stack:
    the generated graph code's frame (compiled programs) or the reference interpreter's."""
    import re
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<popxl graph"):
            src = frame.f_globals.get("__popxl_sources__", {}).get(code.co_name, "")
            lines = src.splitlines()
            line = lines[frame.f_lineno - 1] if 0 < frame.f_lineno <= len(lines) else ""
            m = re.search(r"\b(k\d+)\(", line)
            ops = frame.f_globals.get("__popxl_kernel_ops__", {})
            return ops.get(m.group(1)) if m else None
        if code.co_name == "_run_kernel" and "op" in frame.f_locals:
            return frame.f_locals["op"]
        frame = frame.f_back
    return None


def with_op_context(program, exc: BaseException) -> BaseException:
    """``exc`` re-made with the failing op and its input tensors named in the message."""
    op = failing_op(program, exc.__traceback__)
    if op is None:
        return exc
    ins = ", ".join(f"{t.id!r} {t.shape} {t.dtype.name}" for t in op.inputs)
    graph = op.graph.name or "main"
    return type(exc)(f"{op.type} op in graph {graph!r} (inputs: {ins}): {exc}")


# host data fed to a run ---------------------------------------------------------------------
def names_hint(unexpected: list, expected) -> str:
    """Why a run keyed by stream names fails, when it was: the keys are the stream objects."""
    ids = {s.tensor_id for s in expected}
    names = [k for k in unexpected if isinstance(k, str) and k in ids]
    if not names:
        return ""
    return (
        f". Session.run is keyed by the HostToDeviceStream objects, not by their names "
        f"({names[0]!r} is a stream's name): pass {{stream: data}} with the stream that "
        "popxl.h2d_stream returned."
    )


def check_fits(stream, arr: np.ndarray, want: np.dtype) -> None:
    """A 64-bit host array downcast to the stream's dtype must keep its values: an int64
    label above 2**31 would wrap silently in an int32 stream (the IPU has no 64-bit types)."""
    if arr.size == 0:
        return
    if np.issubdtype(want, np.integer):
        info: np.iinfo | np.finfo = np.iinfo(want)
        low, high = arr.min(), arr.max()
        bad = low if low < info.min else (high if high > info.max else None)
    else:
        finite = arr[np.isfinite(arr)] if not np.isfinite(arr).all() else arr
        big = np.abs(finite).max() if finite.size else 0
        info = np.finfo(want)
        bad = big if big > info.max else None
    if bad is not None:
        raise ValueError(
            f"Input for stream {stream.tensor_id!r} holds the value {bad.item()!r}, which the "
            f"stream's {stream.dtype.name} cannot hold (range [{info.min}, {info.max}]); the "
            f"{arr.dtype} data would change when cast. Keep the values in range, or declare "
            "the stream with a dtype that holds them."
        )
