"""popart.initializePoplarDebugInfo / closePoplarDebugInfo (the `popart` stand-in): the debug
contexts PopXL and PopART attach to ops and tensors, recorded from the IR while the file is
open and written as Poplar's JSON."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import compat_popart as popart
from popxl_core import ops


def _record(tmp_path, build):
    path = tmp_path / "debug.json"
    popart.initializePoplarDebugInfo(str(path), "json")
    try:
        out = build()
    finally:
        popart.closePoplarDebugInfo()
    return json.loads(path.read_text()), out


def _build():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.float32(0), name="a")
        b = popxl.variable(np.float32(1), name="b")
        line = inspect.currentframe().f_lineno + 1
        c = ops.relu(a + b)
    return a, b, c, line


def test_ops_and_tensors_are_recorded_with_the_users_line(tmp_path):
    data, (a, b, c, line) = _record(tmp_path, _build)
    ctxs, strings = data["contexts"], data["stringTable"]
    tensors = [x["tensorId"] for x in ctxs if x["category"] == "tensor"]
    assert tensors == [a.id, b.id, c.producer.inputs[0].id, c.id]
    popxl_ops = [x for x in ctxs if x["layer"] == "popxl"]
    assert [x["api"] for x in popxl_ops] == ["add", "relu"]
    add = popxl_ops[0]
    assert add["inputs"] == [a.id, b.id] and add["outputs"] == [c.producer.inputs[0].id]
    assert add["location"]["lineNumber"] == line
    assert strings[add["location"]["fileName"]] == __file__
    assert strings[add["location"]["functionName"]] == "_build"
    popart_ops = [x for x in ctxs if x["layer"] == "popart" and x["category"] == "op"]
    assert [(x["opid"], x["instanceId"]) for x in popart_ops] == [
        ("Add", c.producer.inputs[0].producer.id),
        ("Relu", c.producer.id),
    ]


def test_nothing_is_recorded_outside_the_file_and_only_json_is_written(tmp_path):
    data, _ = _record(tmp_path, lambda: None)
    _build()  # the file is closed: not recorded anywhere
    assert data == {"stringTable": [], "contexts": []}
    popart.closePoplarDebugInfo()  # closing again does nothing
    with pytest.raises(ValueError, match="'cbor' is not available here"):
        popart.initializePoplarDebugInfo(str(tmp_path / "x"), "cbor")
