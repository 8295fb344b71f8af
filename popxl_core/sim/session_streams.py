"""A Session's host streams: their shapes fixed when the Session is built, and the inputs of
each run checked against them (dtype, host shape, this process's replicas) and viewed as the
``[transfer, replica, *shape]`` arrays the run indexes."""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Set

import numpy as np
import torch

from ..streams import DeviceToHostStream, HostToDeviceStream
from . import checks

if TYPE_CHECKING:  # pragma: no cover
    from ..distributed import Placement
    from ..ir import Ir

__all__ = ["SessionStreams"]


class SessionStreams:
    """Session's methods on its host streams (the Session calls `_fix_streams` when built)."""

    # the Session's state these methods use (`Session.__init__`), declared for the type checker
    _ir: "Ir"
    _placement: "Placement"
    _whole_inputs: Dict[str, np.ndarray]

    def _fix_streams(self, ir) -> None:
        """The Session owns the Ir from here on, so its streams are fixed: their numpy dtype,
        full host shape and the run's [transfers, replicas, *shape] view, then the same two
        for this process's replicas, computed once (checked and applied on each run), and the
        transfer counts checked."""
        self._h2d = frozenset(ir.get_all_h2d_streams())
        self._d2h = tuple(ir.get_all_d2h_streams())
        local = len(self._placement.local)
        self._stream_spec = {
            s: (
                s.dtype.as_numpy(),
                self._full_input_shape(s.shape),
                _expanded_shape(s.shape, ir),
                self._full_input_shape(s.shape, local),
                _expanded_shape(s.shape, ir, local),
            )
            for s in (*self._h2d, *self._d2h)
        }
        self._h2d_spec = {s: self._stream_spec[s] for s in self._h2d}
        counts = checks.transfer_counts(ir.main_graph)
        checks.check_transfer_counts(self, counts)
        self._data_dependent = [s for s, n in counts.items() if n < 0]

    def expected_inputs(self) -> Set[HostToDeviceStream]:
        return set(self._h2d)

    def _full_input_shape(self, shape, replicas: Optional[int] = None) -> tuple:
        replicas = self._ir.replication_factor if replicas is None else replicas
        lead = tuple(n for n in (self._ir.num_host_transfers, replicas) if n > 1)
        return (*lead, *tuple(shape))

    def create_host_outputs(self) -> Dict[DeviceToHostStream, np.ndarray]:
        spec = self._stream_spec
        # zeros: a stream stored fewer than num_host_transfers times leaves batches unwritten
        return {s: np.zeros(spec[s][1], spec[s][0]) for s in self._d2h}

    def _checked_inputs(self, inputs: Mapping, downcast: bool) -> Dict[object, np.ndarray]:
        self._whole_inputs = {}  # in a job: the inputs given for all replicas (checked equal)
        expected = self._h2d
        if len(inputs) == len(expected):
            specs = self._h2d_spec
            checked = {}
            for s, a in inputs.items():  # one lookup per stream finds it and its spec
                spec = specs.get(s)
                if spec is None:
                    break
                checked[s] = self._checked_array(s, a, downcast, spec)
            else:
                return checked
        given = set(inputs)
        unexpected = [s for s in given if s not in expected]
        missing = [s for s in expected if s not in given]
        if unexpected or missing:
            parts = [
                f"Unexpected input: {s.tensor_id!r}" for s in unexpected if hasattr(s, "tensor_id")
            ]
            parts += [f"Unexpected input: {s!r}" for s in unexpected if not hasattr(s, "tensor_id")]
            parts += [f"Missing input: {s.tensor_id!r}" for s in missing]
            raise ValueError(
                "Session.run inputs do not match the streams the Ir loads from. "
                + "; ".join(parts)
                + checks.names_hint(unexpected, expected)
            )
        return {s: self._checked_array(s, a, downcast) for s, a in inputs.items()}

    def _checked_array(
        self, stream: HostToDeviceStream, value, downcast: bool, spec: tuple | None = None
    ) -> np.ndarray:
        arr = value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        want, full, expanded, local_full, local_expanded = spec or self._stream_spec[stream]
        if arr.dtype == np.uint8 and want.kind == "V":  # float8 bits, as fp8_utils gives them
            arr = arr.view(want).reshape(arr.shape)
        if arr.dtype != want:
            if not (downcast and arr.dtype.itemsize == 8 and np.can_cast(want, arr.dtype)):
                raise TypeError(
                    f"Input for stream {stream.tensor_id!r} has dtype {arr.dtype}, "
                    f"the stream carries {stream.dtype.name}."
                )
            checks.check_fits(stream, arr, want)
            arr = arr.astype(want)
        if self._placement.exchange is None:
            if arr.shape != full and not _same_values(arr, full, stream.shape):
                raise ValueError(
                    f"Input for stream {stream.tensor_id!r} has shape {arr.shape}; expected "
                    f"{full} = [num_host_transfers, replicas (dims > 1 only), *{stream.shape}]."
                )
            return arr.reshape(expanded)
        local = self._placement.local  # all replicas' data (use this process's), or its own
        if arr.shape == full:
            self._whole_inputs[stream.tensor_id] = arr
            return arr.reshape(expanded)[:, local.start : local.stop]
        if arr.shape == local_full:
            return arr.reshape(local_expanded)
        raise ValueError(
            f"Input for stream {stream.tensor_id!r} has shape {arr.shape}; expected {full} "
            f"(every replica's data; this process uses replicas {local.start}..{local.stop - 1}) "
            f"or {local_full} (this process's {len(local)} replicas) = [num_host_transfers, "
            f"replicas (dims > 1 only), *{stream.shape}]."
        )


def _same_values(arr: np.ndarray, full: tuple, stream_shape: tuple) -> bool:
    """PopXL's ``_verify_io_shape`` accepts an array of any shape whose dimensions above 1
    are the transfers and replicas only, where the stream's shape is all ones (a stream of
    scalars fed ``(10, 1)`` for 10 transfers; any size-1 array for one value): its values in
    order are the transfers' and replicas'. The number of values must match here."""
    if arr.size != prod(full) or not all(d == 1 for d in stream_shape):
        return False
    if full and full[0] > 1 and (arr.ndim == 0 or arr.shape[0] != full[0]):
        return False  # PopXL reads the transfers from dimension 0
    return np.squeeze(arr).shape == tuple(d for d in full if d != 1)


def _expanded_shape(shape, ir, replicas: Optional[int] = None) -> tuple:
    """The ``[num_host_transfers, replicas, *shape]`` view of a stream's host arrays that the
    run indexes (``[transfer, replica]``), whether or not those dimensions are in the host shape."""
    nht = ir.num_host_transfers
    reps = ir.replication_factor if replicas is None else replicas
    return (nht if nht > 1 else 1, reps if reps > 1 else 1, *tuple(shape))
