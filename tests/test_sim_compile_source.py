"""The main graph's generated source takes the variables' values in one unpacking line
(compile.py `_main_params`): Python parses every build's source, and a line per variable was
the largest part of a big model's main function. The program computes what the reference
interpreter computes."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim import CompileOptions


def _program():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        ws = [popxl.variable(np.full((2, 3), k + 1.0, np.float32), name=f"w{k}") for k in range(4)]
        total = ws[0]
        for w in ws[1:]:
            total = total * w
        ops.var_updates.accumulate_(ws[3], total)
        ops.host_store(popxl.d2h_stream((2, 3), popxl.float32, "out"), total)
    return ir, ws


def _run(interpret: bool):
    ir, ws = _program()
    session = popxl.Session(ir, "ipu_hw", compile_options=CompileOptions(interpret=interpret))
    with session:
        out = next(iter(session.run().values()))
        return session, out, session.get_tensors_data(ws)


def test_main_unpacks_the_variables_in_one_line():
    session, out, values = _run(False)
    source = session._program.namespace["__popxl_sources__"]["main"]
    lines = source.splitlines()
    assert lines[1] == "    v0, v1, v2, v3, = V", source
    assert "V[" not in source
    _, ref_out, ref_values = _run(True)
    np.testing.assert_array_equal(out, ref_out)
    for a, b in zip(values.values(), ref_values.values()):
        np.testing.assert_array_equal(a, b)
