"""`PreparedRun`: `Session.run` for a loop that feeds the same streams on every run.

A training loop calls `Session.run` once per step with a dict of the same streams, arrays of
the same dtypes and shapes each time. `run` looks every stream's spec up again, checks each
array in full and makes new output buffers (for GPT's seven streams, 1-2 % of a small step).
A `PreparedRun` is bound to a list of streams once: the set is checked against the Ir's then,
the specs are looked up then, and one set of output buffers is kept. Each call takes the
arrays as a list in that order; an array of exactly the stream's dtype and host shape is used
as it is (viewed in the run's layout), anything else goes through `Session.run`'s own check,
which converts it (a float64 array of a float32 stream) or raises as `run` raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..streams import DeviceToHostStream, HostToDeviceStream
from . import checks

__all__ = ["PreparedRun"]


class PreparedRun:
    """``prepared(arrays)`` runs ``session`` once with ``arrays[i]`` fed to ``streams[i]``
    and returns the device-to-host arrays, in buffers that every call writes again (copy
    what you keep). Made by `Session.prepared_run`."""

    def __init__(self, session, streams: Sequence[HostToDeviceStream]) -> None:
        streams = tuple(streams)
        if len(set(streams)) != len(streams):
            raise ValueError(f"prepared_run: the streams {streams} repeat one.")
        if set(streams) != session._h2d:  # the error `run` gives for a dict of these
            session._checked_inputs(dict.fromkeys(streams), True)
        # a process of a multi-process job: every array through `run`'s check, which takes
        # this process's replicas from arrays of all of them
        self._whole = session._placement.exchange is None
        spec = session._stream_spec
        self._session = session
        self._streams = streams
        # per stream: its numpy dtype, host shape and the run's [transfers, replicas, *shape]
        self._specs = [(spec[s][0], spec[s][1], spec[s][2]) for s in streams]
        self._outputs = checks.StreamOutputs(session.create_host_outputs())

    def __call__(self, arrays: Sequence[np.ndarray]) -> Mapping[DeviceToHostStream, np.ndarray]:
        session = self._session
        session._require_attached("run")
        if len(arrays) != len(self._streams):
            raise ValueError(
                f"prepared_run: {len(arrays)} arrays for {len(self._streams)} streams."
            )
        session._whole_inputs = {}  # as `run`: the inputs of all replicas, in a job
        whole, feeds = self._whole, {}
        for stream, arr, (dtype, shape, layout) in zip(self._streams, arrays, self._specs):
            if whole and isinstance(arr, np.ndarray) and arr.dtype == dtype and arr.shape == shape:
                feeds[stream] = arr.reshape(layout)
            else:  # converted, or the error `run` gives
                feeds[stream] = session._checked_array(stream, arr, True)
        session._run(feeds, self._outputs)
        return self._outputs
