"""Ops with a multi-tensor kernel of their own (FusedSGD/FusedAdam/FusedAdamW) grouped by the
compiler (popxl_core/sim/foreach.py, `forms.multi_tensor_foreach`), against the reference
interpreter.

The compiled program runs a group as one ``torch._fused_*_`` call over lists; the
interpreter runs each op alone. torch's fused CPU kernels work tensor by tensor, so the
variables must be equal to the bit (rtol=atol=0). Grouping needs the same op type, attributes,
dtype and hyper-parameter tensors, and never takes an op whose inputs another op of the group
writes.
"""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import var_updates
from popxl_core.sim import CompileOptions

SHAPES = [(4, 5), (7,), (3, 11), (33,)]  # vectorised parts and scalar tails


def _data(seed: int, shape, dtype=np.float32, positive: bool = False) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.abs(a) + 0.1 if positive else a


def _hyper_streams(names, values, feeds):
    out = {}
    for n, v in zip(names, values):
        s = popxl.h2d_stream((), popxl.float64, n)
        feeds[s] = np.float64(v)
        out[n] = ops.host_load(s, n)
    return out


def _grads(shapes, dtype, feeds, tag):
    gs = []
    for i, shape in enumerate(shapes):
        s = popxl.h2d_stream(shape, popxl.dtype.as_dtype(dtype), f"{tag}g{i}")
        feeds[s] = _data(20 + i, shape, dtype)
        gs.append(ops.host_load(s, f"{tag}g{i}"))
    return gs


def _adam_program(dtype=np.float32, split_hyper=False):
    """Fused Adam on each shape; with ``split_hyper`` the last two get their own streams."""
    ir, feeds = popxl.Ir(), {}
    names = ("lr", "beta1", "beta2", "weight_decay", "eps")
    with ir.main_graph, popxl.in_sequence():
        ws = [popxl.variable(_data(i, s, dtype), name=f"w{i}") for i, s in enumerate(SHAPES)]
        ms = [popxl.variable(_data(10 + i, s, dtype), name=f"m{i}") for i, s in enumerate(SHAPES)]
        vs = [
            popxl.variable(_data(30 + i, s, dtype, positive=True), name=f"v{i}")
            for i, s in enumerate(SHAPES)
        ]
        steps = [popxl.variable(np.float32(i), name=f"step{i}") for i in range(len(SHAPES))]
        gs = _grads(SHAPES, dtype, feeds, "")
        hp = _hyper_streams(names, (0.0123, 0.9, 0.999, 1e-2, 1e-8), feeds)
        hp2 = _hyper_streams([f"{n}2" for n in names], (0.02, 0.8, 0.99, 0, 1e-6), feeds)
        for i in range(len(SHAPES)):
            h = hp2 if split_hyper and i >= 2 else hp
            var_updates.fused_adam_(ws[i], gs[i], ms[i], vs[i], steps[i], *h.values())
    return ir, feeds


def _run(build, reference: bool):
    ir, feeds = build()  # a Session owns its Ir: one Ir per run
    session = popxl.Session(ir, "cpu", compile_options=CompileOptions(interpret=reference))
    variables = list(ir.main_graph.variables)
    with session:
        session.run(feeds)
        values = session.get_tensors_data(variables)
    return session, {v.name: np.array(values[v]) for v in variables}


def _assert_bitwise(fast, ref):
    assert fast.keys() == ref.keys()
    for k in fast:
        assert fast[k].dtype == ref[k].dtype and fast[k].tobytes() == ref[k].tobytes(), k


def _calls(session, op_type: str) -> int:
    return sum(op.type == op_type for op in session._program.kernel_ops.values())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_one_fused_adam_call_for_all_parameters(dtype):
    fast_session, fast = _run(lambda: _adam_program(dtype), reference=False)
    _, ref = _run(lambda: _adam_program(dtype), reference=True)
    _assert_bitwise(fast, ref)
    assert _calls(fast_session, "FusedAdam") == 1
    assert fast_session._program.stats["foreach_ops"] == len(SHAPES)
    assert all(fast[f"step{i}"] == i + 1 for i in range(len(SHAPES)))


def test_other_hyper_parameter_tensors_make_another_call():
    fast_session, fast = _run(lambda: _adam_program(split_hyper=True), reference=False)
    _, ref = _run(lambda: _adam_program(split_hyper=True), reference=True)
    _assert_bitwise(fast, ref)
    assert _calls(fast_session, "FusedAdam") == 2


def _sgd_program():
    ir, feeds = popxl.Ir(), {}
    with ir.main_graph, popxl.in_sequence():
        ws = [popxl.variable(_data(i, (4, 5)), name=f"w{i}") for i in range(3)]
        bufs = [popxl.variable(_data(10 + i, (4, 5)), name=f"b{i}") for i in range(3)]
        gs = _grads([(4, 5)] * 3, np.float32, feeds, "")
        names = ("lr", "weight_decay", "momentum", "dampening", "first_step")
        hp = list(_hyper_streams(names, (0.1, 1e-2, 0.9, 0.1, 0.0), feeds).values())
        var_updates.fused_sgd_(ws[0], gs[0], bufs[0], *hp)
        var_updates.fused_sgd_(ws[1], ws[0] * 2.0, bufs[1], *hp)
        var_updates.fused_sgd_(ws[2], gs[2], bufs[2], *hp)
    return ir, feeds


def test_sgd_reading_an_updated_parameter_is_not_grouped_with_its_update():
    """The second update's gradient reads w0 after the first update: two calls, in order."""
    fast_session, fast = _run(_sgd_program, reference=False)
    _, ref = _run(_sgd_program, reference=True)
    _assert_bitwise(fast, ref)
    assert _calls(fast_session, "FusedSGD") == 2  # w0 and w2 together, then w1
