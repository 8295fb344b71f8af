"""The inplacing ambiguity check is on for every Ir, as in PopXL, and a pipelined program
passes it: addons' `pipelined_execution` orders its stash shifts and the copies of each stage
in one time step after those of the step before (as popxl.addons calls its stages inside
``popxl.in_sequence()``), while the user's own ops inside a stage keep only the user's order,
so an ambiguity there is still refused."""

from __future__ import annotations

import numpy as np
import pytest

import addons
import popxl_core as popxl
from addons.transforms.repeat_graph import repeat_graph
from popxl_core import ops
from popxl_core.sim.ambiguity import InplaceAmbiguityError

X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


def _two_stages(steps: int, pipelined: bool, stage1):
    """Stage 0 on IPU 0 loads x and sends it to IPU 1; ``stage1(x, acc, out)`` on IPU 1."""
    ir = popxl.Ir()
    ir.num_host_transfers = steps
    with ir.main_graph:
        x_s = popxl.h2d_stream((2, 4), popxl.float32, "x")
        with popxl.ipu(1):
            acc = popxl.variable(np.zeros((2, 4), np.float32), name="acc")
        out = popxl.d2h_stream((2, 4), popxl.float32, "out")
        ctx = addons.pipelined_execution(steps) if pipelined else None
        with ctx or _Plain() as p:
            with p.stage(0), popxl.ipu(0):
                x = ops.host_load(x_s).copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                stage1(p.stash_and_restore_tensor(x), acc, out)
    if not pipelined:
        repeat_graph(ir.main_graph, steps)
    return ir, x_s, acc


class _Plain:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def stage(self, i):
        return popxl.in_sequence("pass")

    def stash_and_restore_tensor(self, t):
        return t


def _accumulate(x, acc, out):
    ops.var_updates.accumulate_(acc, ops.relu(x))
    ops.host_store(out, x)


def _run(built, data):
    ir, x_s, acc = built
    with popxl.Session(ir, "ipu_model") as s:
        got = s.run({x_s: data})
        return list(got.values())[0], s.get_tensor_data(acc).copy()


def test_the_check_is_on_by_default():
    assert popxl.Ir()._pb_ir.getSessionOptions().enableInplaceAmbiguityChecking is True
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(False):
        a = popxl.variable(X, name="a")
        ops.relu_(a)
        ops.gelu_(a)
    with pytest.raises(InplaceAmbiguityError, match="^Inplacing ambiguity detected."):
        popxl.Session(ir, "ipu_model")


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_pipeline_with_stashes_and_accumulation_is_accepted(steps):
    data = np.stack([X * (i - 2) for i in range(steps)])
    data = data[0] if steps == 1 else data
    want = _run(_two_stages(steps, False, _accumulate), data)
    got = _run(_two_stages(steps, True, _accumulate), data)  # the check is on
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _unordered(x, acc, out):
    with popxl.in_sequence(False):
        ops.host_store(out, ops.relu_(x))
        ops.gelu_(x)


def _ordered(x, acc, out):
    with popxl.in_sequence(True):
        y = ops.relu_(x)
        ops.gelu_(x)
        ops.host_store(out, y)


def test_an_ambiguity_inside_a_stage_is_still_refused():
    with pytest.raises(InplaceAmbiguityError, match="^Inplacing ambiguity detected."):
        popxl.Session(_two_stages(3, True, _unordered)[0], "ipu_model")


def test_the_users_order_inside_a_stage_is_kept():
    data = np.stack([X - i for i in range(3)])
    got = _run(_two_stages(3, True, _ordered), data)[0]
    want = _run(_two_stages(3, False, _ordered), data)[0]
    np.testing.assert_array_equal(got, want)
