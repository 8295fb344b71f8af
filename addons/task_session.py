"""`TaskSession`: a Session that knows its state (named variables), counts its steps and
saves / loads checkpoints; `write_variables_pb` (popxl.addons ``task_session``).

A checkpoint is a folder laid out as popxl.addons writes it: ``model/<key>.npz`` per state key
(one array named by the dotted key), a memmap-backed variable's file copied into ``model/`` as
it is, ``session_info.json`` (``session_state``: ``{"steps": N, ...}``) and, when the session has
a dataloader with ``save``/``resume``, ``dataloader.bin``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import warnings
from collections import deque
from typing import Any, Dict, Iterable, Mapping, cast

import numpy as np

import popxl_core
from popxl_core import Variable
from popxl_core.arg_checks import check_conversion

from .named_tensors import NamedTensorData, NamedTensors

__all__ = ["TaskSession", "write_variables_pb"]

MODEL_DIR = "model"
INFO_FILE = "session_info.json"
DATALOADER_FILE = "dataloader.bin"
_REPORT = ("none", "warn", "error")


class TaskSession(popxl_core.Session):
    """``TaskSession(inputs, outputs, state, max_checkpoints=1, ir=..., device_desc=...)``.

    Args:
        inputs, outputs: the program's host-to-device and device-to-host streams (an
            `InputStreams` / `OutputStreams` or any iterable of streams).
        state: the variables that make up a checkpoint, by name (a `NamedTensors`).
        max_checkpoints: how many checkpoints `save_checkpoint` keeps; older ones this session
            wrote are deleted (their two files, and the folder if that leaves it empty).
        *args, **kwargs: `popxl.Session`'s (``ir``, ``device_desc``, ...).
    """

    def __init__(
        self,
        inputs: Iterable,
        outputs: Iterable,
        state: NamedTensors,
        max_checkpoints: int = 1,
        *args,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.inputs, self.outputs = inputs, outputs
        self.state = _checked_state(state, self.ir)
        if not isinstance(max_checkpoints, int) or max_checkpoints < 1:
            raise ValueError(f"max_checkpoints must be a positive int, got {max_checkpoints!r}.")
        self.max_checkpoints = max_checkpoints
        self.session_state: Dict[str, Any] = {"steps": 0}
        self._saved: deque = deque()
        self._dataloader: Any = None

    # steps and state -----------------------------------------------------------------
    def run(self, *args, **kwargs):
        """`Session.run`, then one more step in ``session_state["steps"]``."""
        out = super().run(*args, **kwargs)
        self.session_state["steps"] += 1
        return out

    @property
    def dataloader(self):
        """The data source of the task (kept with the session; not saved in checkpoints)."""
        return self._dataloader

    @dataloader.setter
    def dataloader(self, value) -> None:
        self._dataloader = value

    def add_session_state_info(self, info: Mapping[str, Any]) -> None:
        """Add JSON-serialisable entries to ``session_state`` (saved with checkpoints)."""
        json.dumps(dict(info))  # fail here, not at the next save
        self.session_state.update(info)

    def get_named_tensors_data(self) -> NamedTensorData:
        """The host value of every state variable (copies), under its state key."""
        keys, tensors = zip(*self.state.to_dict().items()) if self.state.to_dict() else ((), ())
        data = self.get_tensors_data(tensors)
        return NamedTensorData.from_dict({k: np.array(data[t]) for k, t in zip(keys, tensors)})

    def write_named_tensors_data(
        self,
        data: Mapping[str, np.ndarray] | NamedTensorData,
        report_missing: str = "warn",
        skip_memmap: bool = False,
    ) -> None:
        """Write host values into the state variables of the same keys.

        ``report_missing`` ('none', 'warn' or 'error') says what to do about state keys that
        ``data`` lacks (left unchanged) and keys of ``data`` that the state lacks (ignored).
        ``skip_memmap``: leave variables whose host data is an ``np.memmap`` as they are.
        """
        flat = data.to_dict() if isinstance(data, NamedTensorData) else dict(data)
        state = _state_variables(self.state)
        _report(
            report_missing, [k for k in state if k not in flat], [k for k in flat if k not in state]
        )
        self.write_variables_data(
            {
                state[k]: v
                for k, v in flat.items()
                if k in state and not (skip_memmap and state[k].memmap_backed)
            }
        )

    def load_from_session(self, src: "TaskSession", report_missing: str = "warn") -> None:
        """Copy the state of another TaskSession into this one's, key by key."""
        if not isinstance(src, TaskSession):
            raise TypeError(f"load_from_session needs a TaskSession, got {type(src).__name__}.")
        self.write_named_tensors_data(src.get_named_tensors_data(), report_missing)

    # checkpoints ---------------------------------------------------------------------
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Write the state, ``session_info.json`` and the dataloader's state into
        ``checkpoint_dir`` (created if needed), after deleting this session's oldest
        checkpoint when it has ``max_checkpoints`` already (as popxl.addons)."""
        data = self.get_named_tensors_data().to_dict()
        model = os.path.join(checkpoint_dir, MODEL_DIR)
        os.makedirs(model, exist_ok=True)
        path = os.path.abspath(checkpoint_dir)
        if path in self._saved:
            self._saved.remove(path)
        while len(self._saved) >= self.max_checkpoints:
            _remove_checkpoint(self._saved.popleft())
        state = _state_variables(self.state)
        for key, value in data.items():
            # a memmap-backed variable's host data is its memmap (get_tensor_data returns it)
            mm = self.get_tensor_data(state[key]) if state[key].memmap_backed else None
            if isinstance(mm, np.memmap) and mm.filename is not None:  # the file, as popxl.addons
                mm.flush()
                shutil.copyfile(mm.filename, os.path.join(model, os.path.basename(mm.filename)))
            else:
                # numpy's stubs read the ** as its keyword allow_pickle: a bool
                np.savez(os.path.join(model, f"{key}.npz"), **{key: value})  # type: ignore[arg-type]
        if _has(self._dataloader, "save"):
            self._dataloader.save(os.path.join(checkpoint_dir, DATALOADER_FILE))
        with open(os.path.join(checkpoint_dir, INFO_FILE), "w") as f:
            json.dump(self.session_state, f)
        self._saved.append(path)

    def load_checkpoint(
        self, checkpoint_dir: str, report_missing: str = "warn", skip_memmap: bool = False
    ) -> None:
        """Read a checkpoint written by `save_checkpoint`: the state variables, the dataloader's
        state and ``session_state``. As popxl.addons: keys without a ``model/<key>.npz`` are
        reported (``report_missing``) and left as they are; without ``session_info.json`` the
        session restarts at ``{"steps": 0}``."""
        model = os.path.join(checkpoint_dir, MODEL_DIR)
        if not os.path.isdir(model):
            raise FileNotFoundError(
                f"{model} does not exist: a checkpoint folder holds {MODEL_DIR}/<key>.npz per "
                f"state key and {INFO_FILE} (written by TaskSession.save_checkpoint)."
            )
        found = {os.path.basename(f)[: -len(".npz")] for f in glob.glob(f"{model}/*.npz")}
        state = self.state.to_dict()
        _report(report_missing, [k for k in state if k not in found], sorted(found - set(state)))
        data = {}
        for key in sorted(found & set(state)):
            with np.load(os.path.join(model, f"{key}.npz"), allow_pickle=True) as npz:
                data.update({k: npz[k] for k in npz.files})
        self.write_named_tensors_data(
            {k: v for k, v in data.items() if k in state}, "none", skip_memmap
        )
        if _has(self._dataloader, "resume"):
            self._dataloader.resume(filename=os.path.join(checkpoint_dir, DATALOADER_FILE))
        self.session_state = _session_info(checkpoint_dir, self.session_state, report_missing)


def _has(obj, method: str) -> bool:
    return obj is not None and callable(getattr(obj, method, None))


def _session_info(checkpoint_dir: str, current: Dict[str, Any], report_missing: str) -> dict:
    """The saved ``session_state``; ``{"steps": 0}`` when the file is missing (popxl.addons)."""
    path = os.path.join(checkpoint_dir, INFO_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            loaded = json.load(f)
    else:
        loaded = {"steps": 0}
    _report(
        report_missing,
        [k for k in current if k not in loaded],
        [k for k in loaded if k not in current],
        f"session_state (loaded from {path} as it is)",
    )
    return loaded


def _checked_state(state: NamedTensors, ir) -> NamedTensors:
    if not isinstance(state, NamedTensors):
        raise TypeError(f"TaskSession state must be a NamedTensors, got {type(state).__name__}.")
    for key, t in state.to_dict().items():
        if not isinstance(t, Variable) or t.ir is not ir:
            raise TypeError(
                f"TaskSession state {key!r} is {t!r}: the state holds variables of the "
                "session's Ir (its main graph's `popxl.variable`s)."
            )
    return state


def _state_variables(state: NamedTensors) -> Dict[str, Variable]:
    """``key -> variable`` of the state (`_checked_state` checked that each is a Variable)."""
    return cast(Dict[str, Variable], state.to_dict())


def _report(mode: str, missing: list, unexpected: list, what: str = "") -> None:
    """PopXL.addons' ``report_missing``: say which names did not match, or raise."""
    if mode not in _REPORT:
        raise ValueError(f"report_missing must be one of {_REPORT}, got {mode!r}.")
    if mode == "none" or not (missing or unexpected):
        return
    if what:
        msg = f"{what}: keys not in the checkpoint: {missing}; keys only in it: {unexpected}."
    else:
        msg = (
            f"Checkpoint and session state do not match: state keys not in the data (left "
            f"unchanged): {missing}; data keys not in the state (ignored): {unexpected}."
        )
    if mode == "error":
        raise ValueError(msg)
    warnings.warn(msg, stacklevel=3)


def _remove_checkpoint(path: str) -> None:
    """Delete a checkpoint this session wrote (popxl.addons removes the folder; only the
    checkpoint's own files go here, and the folders they leave empty)."""
    model = os.path.join(path, MODEL_DIR)
    for f in glob.glob(f"{model}/*.np[zy]") + [
        os.path.join(path, n) for n in (INFO_FILE, DATALOADER_FILE)
    ]:
        if os.path.isfile(f):
            os.remove(f)
    for d in (model, path):
        if os.path.isdir(d) and not os.listdir(d):
            os.rmdir(d)


def write_variables_pb(session: popxl_core.Session, weights: Mapping[Variable, np.ndarray]) -> None:
    """Write host arrays into variables, each cast to its variable's dtype first (popxl.addons
    writes them through PopART's bindings, converting as it copies). A value the cast would
    change (an out-of-range or fractional number into an integer type) is refused."""
    converted: Dict[Variable, np.ndarray] = {}
    for v, data in weights.items():
        if not isinstance(v, Variable):
            raise TypeError(f"write_variables_pb: {v!r} is not a Variable.")
        arr = np.asarray(data)
        with np.errstate(all="ignore"):
            out = arr.astype(v.dtype.as_numpy(), copy=False)
        check_conversion(arr, out, f"write_variables_pb({v.id!r})")
        converted[v] = out
    session.write_variables_data(converted)
