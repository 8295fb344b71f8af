"""popxl.ops.var_updates on main-graph variables across several Session.run calls.

The op-table samples (tests/test_op_table.py) check each kernel once against torch; these
tests check the state semantics: values persist across runs and follow the numpy
recurrence, `adam_updater` increments its step, and in-place updates reach the caller only
through by-reference subgraph inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import var_updates
from popxl_core.printing import format_schedule

F32 = np.float32


def _xs(n: int, shape=(3, 4), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype(F32) for _ in range(n)]


def _run_steps(t0: np.ndarray, build: Callable, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Variable ``t`` (from t0) updated by ``build(t, x)`` once per run, with x streamed in;
    returns t's host value after each run."""
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(t0, popxl.float32, name="t")
        stream = popxl.h2d_stream(xs[0].shape, popxl.float32, "x")
        build(t, ops.host_load(stream))
    session = popxl.Session(ir, "ipu_hw")
    seen = []
    with session:
        for x in xs:
            session.run({stream: x})
            seen.append(session.get_tensor_data(t).copy())
    return seen


def _moving(f, t, x):
    f = F32(f)
    return f * t + (F32(1) - f) * x


CASES = {
    "accumulate": (lambda t, x: var_updates.accumulate_(t, x), lambda t, x: t + x),
    "accumulate_float_f": (
        lambda t, x: var_updates.accumulate_(t, x, 0.5),
        lambda t, x: t + F32(0.5) * x,
    ),
    "accumulate_tensor_f": (
        lambda t, x: var_updates.accumulate_(t, x, popxl.constant(-2.0)),
        lambda t, x: t - 2 * x,
    ),
    "accumulate_square": (
        lambda t, x: var_updates.accumulate_square_(t, x, 0.25),
        lambda t, x: t + F32(0.25) * x * x,
    ),
    "accumulate_mean": (
        lambda t, x: var_updates.accumulate_mean_(t, x, 2.0),
        lambda t, x: F32(2 / 3) * t + x / F32(3),
    ),
    "moving_average": (
        lambda t, x: var_updates.accumulate_moving_average_(t, x, 0.9),
        lambda t, x: _moving(0.9, t, x),
    ),
    "moving_average_square": (
        lambda t, x: var_updates.accumulate_moving_average_square_(t, x, 0.999),
        lambda t, x: _moving(0.999, t, x * x),
    ),
    "accumulator_scale": (
        lambda t, x: var_updates.accumulator_scale_(t, 0.5),
        lambda t, x: t * F32(0.5),
    ),
    "accumulator_zero": (lambda t, x: var_updates.accumulator_zero_(t), lambda t, x: 0 * t),
    "copy_var_update": (lambda t, x: var_updates.copy_var_update_(t, x), lambda t, x: x),
    # axis 1 of a (3, 4) accumulator; index 3 is repeated, so it accumulates twice
    "sparse_accumulate": (
        lambda t, x: var_updates.sparse_accumulate_(
            t, x, popxl.constant(np.array([3, 0, 3], np.int32)), axis=1
        ),
        lambda t, x: _index_add_axis1(t, [3, 0, 3], x),
    ),
}
X_SHAPES = {"sparse_accumulate": (3, 3)}


def _index_add_axis1(t, idx, x):
    out = t.copy()
    np.add.at(out, (slice(None), idx), x)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_main_graph_variable_follows_numpy_recurrence(name):
    build, step = CASES[name]
    t0 = np.linspace(-1, 2, 12, dtype=F32).reshape(3, 4)
    xs = _xs(3, X_SHAPES.get(name, (3, 4)), seed=len(name))
    got = _run_steps(t0, build, xs)
    want = t0
    for x, g in zip(xs, got):
        want = step(want, x)
        np.testing.assert_allclose(g, want, rtol=2e-6, atol=1e-6)
    assert not np.allclose(got[0], got[-1]) or name in ("accumulator_zero",)


def test_running_mean_with_a_step_variable_gives_the_mean():
    xs = _xs(3, (4,), seed=7)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros(4, F32), name="mean")
        step = popxl.variable(np.zeros(1, F32), name="step")
        stream = popxl.h2d_stream((4,), popxl.float32, "x")
        with popxl.in_sequence():
            var_updates.accumulate_mean_(t, ops.host_load(stream), step)
            var_updates.accumulate_(step, popxl.constant(np.ones(1, F32)))
    session = popxl.Session(ir, "cpu")
    with session:
        for x in xs:
            session.run({stream: x})
    np.testing.assert_allclose(session.get_tensor_data(t), np.mean(xs, axis=0), rtol=1e-6)
    assert session.get_tensor_data(step).tolist() == [3.0]


def _numpy_adam(m, v, w, step, g, b1, b2, eps, wd, lr):
    b1, b2 = F32(b1), F32(b2)
    m = b1 * m + (F32(1) - b1) * g
    v = b2 * v + (F32(1) - b2) * g * g
    step = step + 1
    mc, vc = m / (1 - b1**step), v / (1 - b2**step)
    dw = mc / (np.sqrt(vc) + F32(eps)) + F32(wd) * w
    return m, v, w - F32(lr) * dw, step, dw


def test_adam_updater_increments_step_and_matches_numpy_adam():
    b1, b2, eps, wd, lr = 0.9, 0.999, 1e-5, 0.01, 0.1
    w0 = np.linspace(-1, 1, 6, dtype=F32).reshape(2, 3)
    grads = _xs(3, (2, 3), seed=3)
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(w0, name="w")
        m = popxl.variable(np.zeros((2, 3), F32), name="m")
        v = popxl.variable(np.zeros((2, 3), F32), name="v")
        step = popxl.variable(np.zeros((), F32), name="step")
        gs = popxl.h2d_stream((2, 3), popxl.float32, "g")
        out = popxl.d2h_stream((2, 3), popxl.float32, "dw")
        g = ops.host_load(gs)
        var_updates.accumulate_moving_average_(m, g, b1)
        var_updates.accumulate_moving_average_square_(v, g, b2)
        dw = var_updates.adam_updater(
            m, v, weight=w, time_step=step, weight_decay=wd, beta1=b1, beta2=b2, epsilon=eps
        )
        ops.host_store(out, dw)
        var_updates.copy_var_update_(w, w - dw * lr)
    assert [t.name for t in dw.producer.inputs] == ["w", "m", "v", "step"]
    session = popxl.Session(ir, "ipu_hw")
    state = (np.zeros((2, 3), F32), np.zeros((2, 3), F32), w0, F32(0))
    steps = []
    with session:
        for grad in grads:
            res = session.run({gs: grad})
            *state, want_dw = _numpy_adam(*state, grad, b1, b2, eps, wd, lr)
            np.testing.assert_allclose(res[out], want_dw, rtol=1e-5, atol=1e-6)
            steps.append(float(session.get_tensor_data(step)))
    assert steps == [1.0, 2.0, 3.0]
    np.testing.assert_allclose(session.get_tensor_data(w), state[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(session.get_tensor_data(v), state[1], rtol=1e-5, atol=1e-9)


@popxl.in_sequence()  # as the tutorial's: the updates are in place, in this order
def _tutorial_adam(
    weight: popxl.TensorByRef,
    grad,
    first_order: popxl.TensorByRef,
    second_order: popxl.TensorByRef,
    step: popxl.TensorByRef,
):
    var_updates.accumulate_moving_average_(first_order, grad, f=0.9)
    var_updates.accumulate_moving_average_square_(second_order, grad, f=0.999)
    var_updates.adam_updater(
        first_order,
        second_order,
        weight=weight,
        weight_decay=0.0,
        time_step=step,
        beta1=0.9,
        beta2=0.999,
        epsilon=1e-5,
    )


def test_adam_schedule_print_and_values_match_the_tutorial():
    """T2: float16 first order, float32 second order; float optimiser values are attributes."""
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((2, 2), popxl.float32)
        graph = ir.create_graph(
            _tutorial_adam,
            spec,
            spec,
            popxl.TensorSpec((2, 2), popxl.float16),
            spec,
            popxl.TensorSpec((), popxl.float32),
        )
        w = popxl.variable(np.ones((2, 2)), popxl.float32)
        grad = popxl.variable(np.full((2, 2), 0.1), popxl.float32)
        m = popxl.variable(np.zeros((2, 2)), popxl.float16, name="first_order")
        v = popxl.variable(np.zeros((2, 2)), popxl.float32, name="second_order")
        step = popxl.variable(np.zeros(()), popxl.float32, name="step")
        ops.call(graph, w, grad, m, v, step)
    names = {t: t.name for t in graph.inputs[2:]}
    assert format_schedule(graph, names).splitlines()[1:] == [
        "  (%1, %2, first_order=%3, second_order=%4, step=%5) -> () {",
        "    Accumulate.100 (%3 [(2, 2) float16], %2 [(2, 2) float32]) -> (%6 [(2, 2) float16])",
        "    Accumulate.101 (%4 [(2, 2) float32], %2 [(2, 2) float32]) -> (%7 [(2, 2) float32])",
        (
            "    AdamUpdater.102 (%3 [(2, 2) float16], %4 [(2, 2) float32], %5 [() float32]) "
            "-> (%8 [(2, 2) float16])"
        ),
        "  }",
    ]
    session = popxl.Session(ir, "ipu_hw")
    with session:
        session.run()
    data = session.get_tensors_data([m, v, step])
    # The IPU's var-updates compute in the accumulator's dtype: 0.9h * 0 + (1 - 0.9f)h * 0.1h
    # = 0.09998h * 0.09998h = 0.009995 in float16 (float32 then rounding would give 0.01).
    assert data[m].dtype == np.float16 and data[m].tolist() == [[np.float16(0.009995)] * 2] * 2
    assert data[v].tolist() == [[F32(9.9998715e-06)] * 2] * 2  # (1 - 0.999f) * 0.1f**2
    assert data[step].shape == () and float(data[step]) == 1.0


def _accumulate_graph(ir, by_ref: bool):
    def update(t, x):
        return var_updates.accumulate_(t, x, 2.0)

    def update_by_ref(t: popxl.TensorByRef, x):
        return var_updates.accumulate_(t, x, 2.0)

    spec = popxl.TensorSpec((3,), popxl.float32)
    return ir.create_graph(update_by_ref if by_ref else update, spec, spec)


@pytest.mark.parametrize("by_ref", [True, False])
def test_inplace_update_reaches_the_caller_only_by_reference(by_ref):
    ir = popxl.Ir()
    with ir.main_graph:
        acc = popxl.variable(np.ones(3, F32), name="acc")
        x = popxl.constant(np.array([1.0, 2.0, 3.0], F32))
        graph = _accumulate_graph(ir, by_ref)
        (alias,) = ops.call(graph, acc, x)
        out = popxl.d2h_stream((3,), popxl.float32, "alias")
        ops.host_store(out, alias)
    assert (graph.inputs[0] in graph._by_ref_inputs) is by_ref
    session = popxl.Session(ir, "ipu_hw")
    with session:
        res = session.run()
        res = session.run()
    updated = [3.0, 5.0, 7.0]
    assert session.get_tensor_data(acc).tolist() == ([5.0, 9.0, 13.0] if by_ref else [1.0] * 3)
    # the graph output is the updated alias either way
    assert res[out].tolist() == ([5.0, 9.0, 13.0] if by_ref else updated)


@pytest.mark.parametrize("by_ref", [True, False])
def test_adam_step_increment_reaches_the_caller_only_by_reference(by_ref):
    def upd(m, v, step):
        return var_updates.adam_updater(m, v, time_step=step, beta1=0.9, beta2=0.999)

    def upd_ref(m, v, step: popxl.TensorByRef):
        return upd(m, v, step)

    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((2,), popxl.float32)
        graph = ir.create_graph(
            upd_ref if by_ref else upd, spec, spec, popxl.TensorSpec((), popxl.float32)
        )
        m = popxl.variable(np.array([0.1, -0.2], F32))
        v = popxl.variable(np.array([0.01, 0.04], F32))
        step = popxl.variable(np.zeros((), F32), name="step")
        (dw,) = ops.call(graph, m, v, step)
        out = popxl.d2h_stream((2,), popxl.float32, "dw")
        ops.host_store(out, dw)
    session = popxl.Session(ir, "cpu")
    with session:
        for _ in range(2):
            res = session.run()
    t = F32(2.0 if by_ref else 1.0)  # the step the second run corrected with
    mc = np.array([0.1, -0.2], F32) / (1 - F32(0.9) ** t)
    vc = np.array([0.01, 0.04], F32) / (1 - F32(0.999) ** t)
    np.testing.assert_allclose(res[out], mc / (np.sqrt(vc) + F32(1e-7)), rtol=1e-6)
    assert float(session.get_tensor_data(step)) == (2.0 if by_ref else 0.0)


def test_float_factor_is_an_attribute_and_tensor_factor_an_input():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros(2, F32))
        x = popxl.variable(np.ones(2, F32))
        f = popxl.variable(np.full(1, 0.5, F32))
        a = var_updates.accumulate_moving_average_(t, x, 0.5)
        b = var_updates.accumulate_moving_average_(t, x, f)
        c = var_updates.accumulator_scale_(t, f)
        d = var_updates.sparse_accumulate_(t, x, popxl.constant(np.array([1, 0], np.int32)), f=f)
    assert [len(o.producer.inputs) for o in (a, b, c, d)] == [2, 3, 2, 4]
    assert a.producer.attrs["factor"] == 0.5 and b.producer.attrs["factor"] is None
    assert [o.producer.type for o in (a, b, c, d)] == [
        "Accumulate",
        "Accumulate",
        "AccumulatorScale",
        "SparseAccumulate",
    ]


def test_invalid_arguments_raise():
    ir = popxl.Ir()
    with ir.main_graph:
        m = popxl.variable(np.zeros((2, 2), F32))
        v = popxl.variable(np.zeros((2, 2), F32))
        step = popxl.variable(np.zeros(1, F32))
        with pytest.raises(ValueError, match="beta1 and beta2"):
            var_updates.adam_updater(m, v, time_step=step, beta1=0.9)
        with pytest.raises(ValueError, match="weight"):
            var_updates.adam_updater(m, v, weight_decay=0.1)
        with pytest.raises(ValueError, match="time_step"):
            var_updates.adamax_updater(m, v)
        with pytest.raises(TypeError, match="float32"):
            var_updates.adam_updater(
                m, v, time_step=popxl.variable(np.zeros(1, np.int32)), beta1=0.9, beta2=0.9
            )
        with pytest.raises(ValueError, match="broadcast"):
            var_updates.accumulate_(m, popxl.variable(np.zeros(3, F32)))
        with pytest.raises(TypeError, match="float or integer"):  # int X: cast (PopXL)
            var_updates.accumulate_(m, popxl.variable(np.zeros(2, np.bool_)))
        with pytest.raises(TypeError, match="X is float32 but the integer accumulator"):
            var_updates.accumulate_(popxl.variable(np.zeros(2, np.int32)), m)
        with pytest.raises(ValueError, match="gives"):
            var_updates.sparse_accumulate_(m, v, popxl.constant(np.array([0], np.int32)))
        with pytest.raises(ValueError, match="match"):
            var_updates.copy_var_update_(m, step)
        with pytest.raises(ValueError, match="single value"):
            var_updates.accumulator_scale_(m, v)
