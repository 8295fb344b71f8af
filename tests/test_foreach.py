"""Multi-tensor kernels (popxl_core/sim/foreach.py) against the reference interpreter.

Each program updates several variables of different shapes with one kind of op per line, as
an optimizer does; compiled, the ops of a kind run as one ``torch._foreach_*`` call, and the
variables and streamed outputs must be equal to the bit to the unfused, interpreted program
(the foreach kernels apply the same ATen op to each tensor). Hazard cases check that the pass
never groups an op with one whose result or in-place target it reads.
"""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import var_updates
from popxl_core.sim import CompileOptions
from popxl_core.sim.foreach import foreach_schedule, group_key
from popxl_core.sim.passes import live_ops

SHAPES = [(4, 5), (7,), (3, 2, 2)]


def _data(seed: int, shape, positive: bool = False) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.1 if positive else a


def _program(update):
    """Variables w_i, m_i and gradients g_i (from a stream, like a backward pass) for each
    shape; ``update(ws, ms, gs, scalars)`` adds the ops under test; everything is returned."""
    ir = popxl.Ir()
    feeds = {}
    with ir.main_graph, popxl.in_sequence():
        ws = [popxl.variable(_data(i, s), name=f"w{i}") for i, s in enumerate(SHAPES)]
        ms = [popxl.variable(_data(10 + i, s, True), name=f"m{i}") for i, s in enumerate(SHAPES)]
        gs = []
        for i, s in enumerate(SHAPES):
            stream = popxl.h2d_stream(s, popxl.float32, f"g{i}")
            feeds[stream] = _data(20 + i, s)
            gs.append(ops.host_load(stream, f"g{i}"))
        lr = popxl.h2d_stream((), popxl.float32, "lr")
        feeds[lr] = np.float32(0.0125)
        scalars = [ops.host_load(lr, "lr"), popxl.constant(np.float32(0.3), name="c")]
        results = update(ws, ms, gs, scalars) or []
        for i, r in enumerate(results):
            out = popxl.d2h_stream(r.shape, r.dtype, f"out{i}")
            ops.host_store(out, r)
    return ir, feeds


def _run(update, reference: bool, **options: bool):
    ir, feeds = _program(update)
    compiler = CompileOptions(interpret=reference, **options)
    session = popxl.Session(ir, "ipu_hw", compile_options=compiler)
    variables = list(ir.main_graph.variables)
    with session:
        res = session.run(feeds)
        vals = session.get_tensors_data(variables)
    out = {f"stream {s.tensor_id}": np.array(a) for s, a in res.items()}
    out.update({f"var {v.id}": np.array(vals[v]) for v in variables})
    return out, session._program


def _check(update, min_groups: int, **options: bool):
    fast, program = _run(update, reference=False, **options)
    ref, _ = _run(update, reference=True)
    assert fast.keys() == ref.keys()
    for k in fast:
        assert fast[k].tobytes() == ref[k].tobytes(), f"{k} differs from the reference"
    assert program.stats["foreach_groups"] >= min_groups, program.stats
    return program


def _sgd(ws, ms, gs, s):
    for w, g in zip(ws, gs):
        ops.scaled_add_(w, g, b=s[0])


def _momentum(ws, ms, gs, s):
    for w, m, g in zip(ws, ms, gs):
        ops.scaled_add_(m, g, a=s[1], b=0.9)
        ops.scaled_add_(w, m, b=s[0])


def _adam_like(ws, ms, gs, s):
    outs = []
    for w, m, g in zip(ws, ms, gs):
        d = g - m  # LL sub
        var_updates.accumulate_(m, d, s[1])
        sq = (s[1] * g) * g  # SL mul, then LL mul into a dead temporary
        denom = ops.sqrt(m) / s[0] + 1e-3  # sqrt, LS div, LS add (a constant scalar)
        upd = (s[0] * sq) / denom
        ops.scaled_add_(w, upd, a=0.999)
        outs.append(ops.scaled_add(upd, d, b=s[1]))
    return outs


def _misc(ws, ms, gs, s):
    outs = [ops.negate(g) for g in gs]
    for m in ms:
        var_updates.accumulator_scale_(m, s[1])
    for w, g in zip(ws, gs):
        var_updates.copy_var_update_(w, g + g)
    return outs


def _torch_adam(ws, ms, gs, s):
    """torch's single-tensor Adam kernels: lerp_ by a streamed weight, addcmul_ and addcdiv_
    by equal float attributes (the ``Scalar`` overloads of the foreach kernels)."""
    outs = []
    for w, m, g in zip(ws, ms, gs):
        var_updates.lerp_(m, g, s[0])  # weight 0.0125 < 0.5: t + w * (x - t)
        var_updates.addcmul_(m, g, g, 0.001)
        var_updates.addcdiv_(w, m, ops.sqrt(m) + 1e-3, -0.01)
        outs.append(m * 1.0)
    return outs


def _pointwise_scalars(ws, ms, gs, s):
    """The other formula of lerp (weight >= 0.5, from a constant scalar tensor), scalar tensors
    shared as equal constants, and values that differ per tensor (not grouped together)."""
    for i, (w, m, g) in enumerate(zip(ws, ms, gs)):
        var_updates.lerp_(w, g, popxl.constant(np.float32(0.7)))  # x - (x - t) * (1 - w)
        var_updates.addcdiv_(w, g, m, s[1])  # a constant scalar tensor (0.3)
        var_updates.addcmul_(m, g, w, s[0] if i else 0.25)  # tensor for two, a float for one
    return [w * 1.0 for w in ws]


@pytest.mark.parametrize(
    "update,groups",
    [
        (_sgd, 1),
        (_momentum, 2),
        (_adam_like, 8),
        (_misc, 4),
        (_torch_adam, 4),
        (_pointwise_scalars, 3),
    ],
    ids=["sgd", "momentum", "adam_like", "misc", "torch_adam", "pointwise_scalars"],
)
def test_grouped_updates_equal_the_reference_bitwise(update, groups):
    _check(update, groups, foreach_fresh=True)  # every kind grouped, as torch's foreach path


def test_lerp_addcmul_addcdiv_group_with_their_scalar():
    # torch's Adam kernels over three tensors: with foreach_fresh every kind is one kernel
    # (lerp_, addcmul_, sqrt, the add into sqrt's result, addcdiv_, the returned m * 1.0);
    # without it, addcdiv_ waits for its tensor's sqrt and add, which run tensor by tensor, so
    # only lerp_ and addcmul_ group
    program = _check(_torch_adam, 6, foreach_fresh=True)
    assert program.stats["foreach_ops"] == 18, program.stats
    program = _check(_torch_adam, 2, foreach_fresh=False)
    assert program.stats["foreach_ops"] == 6, program.stats
    ir, _ = _program(_pointwise_scalars)
    _, groups = foreach_schedule(live_ops(ir.main_graph, ir.main_graph._outputs))
    sizes = {g.ops[0].type: len(g.ops) for g in groups}
    # addcmul_ by the stream (two tensors) and by 0.25 (one tensor) are two kernels
    assert sizes == {"LerpInplace": 3, "AddcdivInplace": 3, "AddcmulInplace": 2, "Mul": 3}, sizes


def test_pointwise_update_keys():
    ir = popxl.Ir()
    with ir.main_graph:
        a, b, c = (popxl.variable(np.ones((2, 3), np.float32)) for _ in range(3))
        row = popxl.variable(np.ones((3,), np.float32))
        w = popxl.constant(np.float32(0.3))
        keys = [group_key(var_updates.lerp_(t, c, 0.1).producer) for t in (a, b)]
        assert keys[0] == keys[1]
        assert group_key(var_updates.lerp_(a, c, 0.2).producer) != keys[0]  # another weight
        by_tensor = group_key(var_updates.lerp_(a, c, w).producer)
        assert by_tensor != keys[0]
        w2 = popxl.constant(np.float32(0.3))  # another constant of the same value: shared
        assert by_tensor == group_key(var_updates.lerp_(b, c, w2).producer)
        assert group_key(var_updates.addcmul_(a, row, c).producer) is None  # broadcasts


def test_by_default_chains_stay_per_tensor():
    # foreach_fresh=False: the first op of each chain allocates, so it does not group; the
    # scheduler takes ops in order, so the rest of each chain is not ready with its peers
    program = _check(_adam_like, 0, foreach_fresh=False)
    assert program.stats["foreach_ops"] < 33  # fewer than the 11 kinds x 3 tensors
    assert program.stats["out_reuse"] >= 12


def test_an_op_reading_another_ops_target_is_not_grouped_with_it():
    def chained(ws, ms, gs, s):
        ops.scaled_add_(ws[0], gs[0], b=s[0])
        ops.scaled_add_(ms[0], ws[0], b=s[0])  # reads w0 after its update: runs after it
        ops.scaled_add_(ws[1], gs[1], b=s[0])
        return [ws[0] * 1.0, ms[0] * 1.0]

    _check(chained, 1, foreach_fresh=True)
    ir, _ = _program(chained)
    _, groups = foreach_schedule(live_ops(ir.main_graph, ir.main_graph._outputs))
    updates = [g for g in groups if g.ops[0].type == "ScaledAddLhsInplace"]
    assert [len(g.ops) for g in updates] == [2]  # w0 and w1 together; m0 after them
    assert updates[0].ops[0].inputs[0].id.startswith("w0")


def test_a_result_read_before_the_group_ends_keeps_its_order():
    def read_between(ws, ms, gs, s):
        a = gs[0] + ms[0]
        b = a * s[1]  # reads a: it must wait for a, whatever group a joins
        c = gs[1] + ms[1]
        ops.scaled_add_(ws[0], b)
        return [b, c]

    _check(read_between, 1, foreach_fresh=True)


def test_groups_do_not_cross_a_call():
    def with_call(ws, ms, gs, s):
        x0 = gs[0] + ms[0]
        ir = ws[0].ir
        sub = ir.create_graph(lambda t: t * 2.0, ws[1].spec)
        (y,) = ops.call(sub, ws[1])
        x1 = gs[1] + ms[1]
        return [x0, x1, y]

    ir, _ = _program(with_call)
    order, groups = foreach_schedule(list(ir.main_graph._ops))
    adds = [op for op in order if op.type == "Add"]
    call = next(op for op in order if op.type == "Call")
    assert order.index(adds[0]) < order.index(call) < order.index(adds[1])
    assert not any(adds[0] in grp.ops for grp in groups)
    _check(with_call, 0, foreach_fresh=True)


def test_keys_need_shared_scalars_and_float32():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32))
        b = popxl.variable(np.ones((2, 3), np.float32))
        s1, s2 = popxl.constant(np.float32(2.0)), popxl.constant(np.float32(3.0))
        i = popxl.variable(np.ones((2, 3), np.int32))
        bcast = popxl.variable(np.ones((3,), np.float32))
        x, y, z = a * s1, b * s1, a * s2
        assert group_key(x.producer) == group_key(y.producer) != group_key(z.producer)
        assert group_key((i + i).producer) is None
        assert group_key((a + bcast).producer) is None  # broadcasting: not one per tensor
        assert group_key((s1 - a).producer) is None  # a scalar first, not commutative


def test_groups_that_allocate_are_capped_in_bytes_and_stay_bitwise(monkeypatch):
    """A group of ops that allocate holds every tensor's result at once; over a large model's
    weights that was a weight-sized copy at the step's peak (eager's CPU optimizers hold one
    tensor's). Capped at `foreach.FRESH_CAP` bytes (here 100: the 20-element (4, 5) result is
    80 bytes), each group allocates at most that, or one tensor's when that is more."""
    from popxl_core.sim import foreach

    monkeypatch.setattr(foreach, "FRESH_CAP", 100)
    program = _check(_adam_like, min_groups=1)
    ir, _ = _program(_adam_like)
    _, groups = foreach_schedule(live_ops(ir.main_graph, ir.main_graph._outputs))
    fresh = [g for g in groups if not g.ops[0].modified_inputs()]
    assert fresh  # the sqrt / divide groups
    for g in fresh:
        made = sum(t.nelms * t.dtype.itemsize for op in g.ops for t in op.outputs)
        assert made <= 100 or len(g.ops) == 1, (g.key, made)
    assert program.stats["foreach_groups"] > 0
