"""Poplar's debug-info file (``popart.initializePoplarDebugInfo``), written from the IR.

On the IPU, PopXL and PopART attach a debug context to every op and tensor they create:
PopXL's ``op_debug_context`` records, per op function called, the API name, the input and
output tensor ids and the user's source location (layer ``popxl``); PopART records each op
(type, graph, id: layer ``popart``) and each tensor. Poplar streams them to the file that
``initializePoplarDebugInfo`` names. Everything in those contexts is what the IR here knows
when the op or tensor is made, so this module records the same contexts while a file is open
and writes them, as Poplar's JSON (``{"stringTable": [...], "contexts": [...]}``, file and
function names as indexes into the string table), when it is closed.

Here one popxl context is recorded per op (PopXL records one per op function, which for a
composite covers several ops); its ``api`` is the outermost ``popxl.ops`` function on the
stack.
"""

from __future__ import annotations

import json
import sys
from types import FrameType
from typing import Dict, List, Optional

from .context import get_current_context

__all__ = ["initialize", "close", "tensor_created"]

_PKG = __name__.rsplit(".", 1)[0]
_OPS = _PKG + ".ops"


class _Stream:
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.strings: Dict[str, int] = {}
        self.contexts: List[dict] = []
        self.hook = get_current_context().register_op_created_hook(self.op_created)

    def string(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings))

    def add(self, layer: str, category: str, **values) -> None:
        ctx = {"id": len(self.contexts), "layer": layer, "category": category}
        self.contexts.append({**ctx, **values})

    def op_created(self, op) -> None:
        api, frame = _api_and_user_frame()
        ins, outs = [t.id for t in op.inputs], [t.id for t in op.outputs]
        self.add("popxl", "op", api=api, inputs=ins, outputs=outs, location=self.where(frame))
        graph_id = op.graph.id
        self.add("popart", "op", graphId=graph_id, instanceId=op.id, opid=op.type, inputs=ins)
        self.contexts[-1]["outputs"] = outs

    def where(self, frame: Optional[FrameType]) -> dict:
        if frame is None:
            return {}
        return {
            "fileName": self.string(frame.f_code.co_filename),
            "functionName": self.string(frame.f_code.co_name),
            "lineNumber": frame.f_lineno,
        }

    def write(self) -> None:
        with open(self.filename, "w", encoding="utf-8") as f:
            json.dump({"stringTable": list(self.strings), "contexts": self.contexts}, f)


_STREAM: Optional[_Stream] = None


def _api_and_user_frame():
    """The outermost ``popxl.ops`` function on the stack (the op the user called) and the
    first frame outside this package (where the user called it)."""
    f: Optional[FrameType] = sys._getframe(2)
    api = None
    while f is not None and f.f_globals.get("__name__", "").startswith(_PKG):
        if f.f_globals["__name__"].startswith(_OPS):
            api = f.f_code.co_name
        f = f.f_back
    return api, f


def initialize(filename: str, fmt: str = "json") -> None:
    """Record debug contexts from now on, for `close` to write to ``filename``."""
    global _STREAM
    if fmt.lower() != "json":
        raise ValueError(
            f"initializePoplarDebugInfo: format {fmt!r} is not available here; use 'json' "
            "(Poplar also writes 'cbor')."
        )
    close()
    _STREAM = _Stream(filename)


def close() -> None:
    """Write the recorded contexts and stop recording (nothing if no file is open)."""
    global _STREAM
    stream, _STREAM = _STREAM, None
    if stream is not None:
        get_current_context().remove_op_created_hook(stream.hook)
        stream.write()


def tensor_created(t) -> None:
    """Called for every new tensor (PopART's TensorDebugInfo)."""
    if _STREAM is not None:
        _STREAM.add("popart", "tensor", tensorId=t.id, shape=list(t.shape), type=t.dtype.name)
