"""`popxl.Session` semantics (popxl_api.md §1.13): host transfers, buffer shapes, replication,
context-manager weight transfers, reading and writing variables, and input validation."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import var_updates

F32 = np.float32


def _lead(nht: int, reps: int):
    return tuple(n for n in (nht, reps) if n > 1)


@pytest.mark.parametrize("nht,reps", [(1, 1), (3, 1), (1, 2), (3, 2)])
def test_host_load_store(nht, reps):
    """A repeat loop loads and stores one transfer per iteration, on every replica."""
    ir = popxl.Ir(replication=reps)
    ir.num_host_transfers = nht
    with ir.main_graph:
        w = popxl.variable(np.array([1.0, 2.0, 3.0], F32), name="w")
        acc = popxl.variable(np.zeros(3, F32), name="acc")
        acc_all = popxl.variable(np.zeros(3, F32), name="acc_all", retrieval_mode="all_replicas")
        x_in = popxl.h2d_stream((3,), popxl.float32, "x")
        y_out = popxl.d2h_stream((3,), popxl.float32, "y")

        def body(w, acc: popxl.TensorByRef, acc_all: popxl.TensorByRef):
            x = ops.host_load(x_in, "x")
            var_updates.accumulate_(acc, x)
            var_updates.accumulate_(acc_all, x)
            ops.host_store(y_out, ops.add(ops.add(x, x), w))

        ops.repeat(ir.create_graph(body, w, acc, acc_all), nht, w, acc, acc_all)
    session = popxl.Session(ir, "ipu_hw")
    shape = (*_lead(nht, reps), 3)
    assert session._full_input_shape((3,)) == shape
    data = np.random.default_rng(0).uniform(-1, 1, (nht, reps, 3)).astype(F32)
    with session:
        out = session.run({x_in: data.reshape(shape)})
    assert set(out) == {y_out}
    assert out[y_out].shape == shape
    np.testing.assert_array_equal(out[y_out], (2 * data + w._data).reshape(shape))
    sums = data.sum(axis=0)  # [replica, 3]: each replica accumulated its own transfers
    np.testing.assert_allclose(session.get_tensor_data(acc), sums[0], rtol=1e-6)
    want_all = sums if reps > 1 else sums[0]
    np.testing.assert_allclose(session.get_tensor_data(acc_all), want_all, rtol=1e-6)


def test_loading_more_transfers_than_num_host_transfers_warns():
    ir = popxl.Ir()
    ir.num_host_transfers = 2
    with ir.main_graph:
        x_in = popxl.h2d_stream((2,), popxl.float32, "x")
        g = ir.create_graph(
            lambda: ops.host_store(popxl.d2h_stream((2,), popxl.float32, "y"), ops.host_load(x_in))
        )
        ops.repeat(g, 3)
    # told when the Session is built, before any run; PopXL runs it (the stream wraps around:
    # tests/test_apps_semantics.py)
    with pytest.warns(UserWarning, match="'x' is loaded 3 times.*num_host_transfers=2"):
        popxl.Session(ir, "cpu")


def test_replica_grouped_variable_has_one_value_per_group():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        rg = ir.replica_grouping(group_size=1)
        v = popxl.variable(np.array([[1.0, 2.0], [3.0, 4.0]], F32), replica_grouping=rg)
        out = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(out, ops.add(v, v))
    assert v.shape == (2,) and v.shape_on_host == (2, 2)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        res = session.run()
        session.write_variable_data(v, np.array([[5.0, 5.0], [6.0, 6.0]], F32))
        res2 = session.run()
    assert res[out].tolist() == [[2.0, 4.0], [6.0, 8.0]]
    assert res2[out].tolist() == [[10.0, 10.0], [12.0, 12.0]]
    assert session.get_tensor_data(v).tolist() == [[5.0, 5.0], [6.0, 6.0]]


def test_all_replicas_retrieval_returns_one_row_per_replica():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        v = popxl.variable(np.ones(2, F32), name="v", retrieval_mode="all_replicas")
        x_in = popxl.h2d_stream((2,), popxl.float32, "x")
        var_updates.accumulate_(v, ops.host_load(x_in))
    session = popxl.Session(ir, "ipu_hw")
    assert session.get_tensor_data(v).tolist() == [[1.0, 1.0]] * 2
    with pytest.raises(NotImplementedError, match="retrieval_mode='all_replicas'"):
        session.write_variable_data(v, np.array([2.0, 3.0], F32))  # PopXL cannot write these
    assert session.get_tensor_data(v).tolist() == [[1.0, 1.0]] * 2
    with session:
        session.run({x_in: np.array([[1.0, 1.0], [5.0, 5.0]], F32)})
    assert session.get_tensor_data(v).tolist() == [[2.0, 2.0], [6.0, 6.0]]


# context manager and weight transfers ---------------------------------------------------
def _counter(**session_kwargs):
    """A Session whose every run adds 1 to variable ``v`` (starting at 0)."""
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, F32), name="v")
        var_updates.accumulate_(v, popxl.constant(np.ones(2, F32)))
    return popxl.Session(ir, "ipu_hw", **session_kwargs), v


def test_nested_contexts_are_no_ops_and_exit_copies_weights_to_host():
    session, v = _counter()
    host = session.get_tensor_data(v)  # a view of the host buffer, readable while detached
    assert not session.is_attached and host.tolist() == [0.0, 0.0]
    with session:
        assert session.is_attached
        with session:
            session.run()
        assert session.is_attached  # the inner exit did not detach ...
        assert host.tolist() == [0.0, 0.0]  # ... nor copy the weights to the host
        session.run()
    assert not session.is_attached
    assert host.tolist() == [2.0, 2.0]  # the outer exit did (weights_to_host_on_exit)
    assert session.get_tensor_data(v).tolist() == [2.0, 2.0]


def test_weights_to_host_on_exit_false_keeps_the_host_copy():
    session, v = _counter(weights_to_host_on_exit=False)
    with session:
        session.run()
    assert session.get_tensor_data(v).tolist() == [0.0, 0.0]
    with session:  # entering copies the (stale) host weights to the device again
        session.run()
        assert session.get_tensor_data(v).tolist() == [1.0, 1.0]  # fetched while attached


def test_runtime_calls_outside_the_context_raise():
    session, _ = _counter()
    for call in (session.run, session.weights_to_host, session.weights_from_host):
        with pytest.raises(
            ValueError, match="Must be attached to device before calling a runtime function"
        ):
            call()
    with session:
        session.run()
    with pytest.raises(ValueError, match="Put the call inside a `Session` context"):
        session.run()


def test_get_tensor_data_detached_attached_and_after_exit():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, F32), name="v")
        c = popxl.constant(np.array([7, 8], np.int32), name="c")
        var_updates.accumulate_(v, popxl.constant(np.ones(2, F32)))
        t = ops.add(c, c)
    session = popxl.Session(ir, "ipu_hw")
    assert session.get_tensor_data(v).tolist() == [0.0, 0.0]
    with session:
        session.run()
        session.run()
        assert session.get_tensor_data(v).tolist() == [2.0, 2.0]  # one weights_to_host
        data = session.get_tensors_data([v, c])
    assert data[c].tolist() == [7, 8] and data[v].tolist() == [2.0, 2.0]
    assert session.get_tensor_data(v).tolist() == [2.0, 2.0]
    with pytest.raises(TypeError, match="not of type Constant or Variable"):
        session.get_tensor_data(t)


def test_write_variable_data_outside_and_inside_the_context():
    session, v = _counter()
    session.write_variable_data(v, np.array([5.0, 6.0], F32))
    with session:
        session.run()
        assert session.get_tensor_data(v).tolist() == [6.0, 7.0]
        session.write_variable_data(v, np.array([10.0, 20.0], F32))
        assert session.get_tensor_data(v).tolist() == [10.0, 20.0]
        session.run()  # the device sees the written value
        assert session.get_tensor_data(v).tolist() == [11.0, 21.0]
    assert session.get_tensor_data(v).tolist() == [11.0, 21.0]


def test_write_variable_data_accepts_python_scalars():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.variable(np.zeros((), F32), name="s")
        var_updates.accumulate_(s, popxl.constant(np.ones((), F32)))
    session = popxl.Session(ir, "cpu")
    session.write_variable_data(s, 3)
    with session:
        session.run()
    assert session.get_tensor_data(s).shape == () and float(session.get_tensor_data(s)) == 4.0


@pytest.mark.parametrize("inside", [False, True])
@pytest.mark.parametrize(
    "bad,error", [(np.zeros(2, np.int32), TypeError), (np.zeros(3, F32), ValueError)]
)
def test_write_variables_data_with_one_bad_entry_changes_nothing(inside, bad, error):
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(2, F32), name="a")
        b = popxl.variable(np.zeros(2, F32), name="b")
        for v in (a, b):
            var_updates.accumulate_(v, popxl.constant(np.ones(2, F32)))
    session = popxl.Session(ir, "ipu_hw")
    with session:
        session.run()
        if inside:
            with pytest.raises(error, match="'b'"):
                session.write_variables_data({a: np.full(2, 9.0, F32), b: bad})
        session.run()
    if not inside:
        with pytest.raises(error, match="'b'"):
            session.write_variables_data({a: np.full(2, 9.0, F32), b: bad})
    assert session.get_tensor_data(a).tolist() == [2.0, 2.0]
    assert session.get_tensor_data(b).tolist() == [2.0, 2.0]
    with session:
        session.run()  # the device did not get the good entry either
    assert session.get_tensor_data(a).tolist() == [3.0, 3.0]


def test_write_variable_data_rejects_non_variables():
    ir = popxl.Ir()
    with ir.main_graph:
        c = popxl.constant(np.zeros(2, F32))
    session = popxl.Session(ir, "cpu")
    with pytest.raises(TypeError, match="not of type Variable"):
        session.write_variable_data(c, np.zeros(2, F32))


# run inputs ----------------------------------------------------------------------------
def _two_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.h2d_stream((2,), popxl.float32, "x_stream")
        n = popxl.h2d_stream((2,), popxl.int32, "n_stream")
        popxl.h2d_stream((2,), popxl.float32, "never_loaded")
        y = popxl.d2h_stream((2,), popxl.float32, "y_stream")
        m = popxl.d2h_stream((2,), popxl.int32, "m_stream")
        ops.host_store(y, ops.host_load(x))
        ops.host_store(m, ops.host_load(n))
    return popxl.Session(ir, "ipu_hw"), x, n, y, m


def test_expected_inputs_are_the_loaded_streams():
    session, x, n, y, m = _two_inputs()
    assert session.expected_inputs() == {x, n}
    assert set(session.create_host_outputs()) == {y, m}


def test_run_with_missing_or_unexpected_streams_names_them():
    session, x, n, y, _ = _two_inputs()
    good = {x: np.zeros(2, F32), n: np.zeros(2, np.int32)}
    with session:
        with pytest.raises(ValueError, match="Missing input: 'n_stream'"):
            session.run({x: good[x]})
        with pytest.raises(ValueError, match="Unexpected input: 'y_stream'"):
            session.run({**good, y: np.zeros(2, F32)})
        with pytest.raises(ValueError, match="Missing input"):
            session.run()
        assert session.run(good)[y].tolist() == [0.0, 0.0]


def test_run_with_wrong_shape_or_dtype_names_the_stream():
    session, x, n, _, _ = _two_inputs()
    with session:
        with pytest.raises(ValueError, match="'x_stream'.*shape"):
            session.run({x: np.zeros(3, F32), n: np.zeros(2, np.int32)})
        with pytest.raises(TypeError, match="'n_stream'.*int32"):
            session.run({x: np.zeros(2, F32), n: np.zeros(2, F32)})


def test_64_bit_inputs_are_downcast():
    session, x, n, y, m = _two_inputs()
    inputs = {x: np.array([0.5, 1.5]), n: np.array([3, -4])}  # float64, int64
    with session:
        out = session.run(inputs)
        assert out[y].dtype == np.float32 and out[y].tolist() == [0.5, 1.5]
        assert out[m].dtype == np.int32 and out[m].tolist() == [3, -4]
        with pytest.raises(TypeError, match="'x_stream'"):
            session.run(inputs, downcast_inputs=False)


def test_run_with_outputs_fills_the_callers_buffers():
    session, x, n, y, m = _two_inputs()
    outputs = session.create_host_outputs()
    with session:
        session.run_with_outputs(
            {x: np.array([1.0, 2.0], F32), n: np.array([5, 6], np.int32)}, outputs
        )
    assert outputs[y].tolist() == [1.0, 2.0] and outputs[m].tolist() == [5, 6]


@pytest.mark.parametrize(
    "nht,reps,want",
    [(1, 1, (4, 5)), (3, 1, (3, 4, 5)), (1, 2, (2, 4, 5)), (3, 2, (3, 2, 4, 5)), (2, 2, (2, 2, 1))],
)
def test_full_input_shape_drops_leading_dims_of_one(nht, reps, want):
    ir = popxl.Ir(replication=reps)
    ir.num_host_transfers = nht
    session = popxl.Session(ir, "ipu_hw")
    shape = (1,) if want[-1] == 1 else (4, 5)
    assert session._full_input_shape(shape) == want


# construction errors --------------------------------------------------------------------
def test_unknown_device_raises():
    with pytest.raises(ValueError, match="Unknown device 'gpu'"):
        popxl.Session(popxl.Ir(), "gpu")


@pytest.mark.parametrize("device", ["ipu_hw", "ipu_model", "cpu"])
def test_every_popxl_device_string_runs_on_the_simulator(device):
    session, v = _counter_on(device)
    with session:
        session.run()
    assert session.get_tensor_data(v).tolist() == [1.0, 1.0]


def _counter_on(device):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, F32), name="v")
        var_updates.accumulate_(v, popxl.constant(np.ones(2, F32)))
    return popxl.Session(ir, device), v


def test_a_second_session_on_the_same_ir():
    """As PopXL: a second Session on a detached Session's Ir compiles the same program (it
    starts from the variables' data in the Ir); not while the first is attached."""
    s1, v = _counter_on("ipu_hw")
    with s1:
        s1.run()
    s2 = popxl.Session(v.ir, "ipu_hw")
    with s2:
        with pytest.raises(RuntimeError, match="attached"):
            popxl.Session(v.ir, "ipu_hw")
        s2.run()
        s2.run()
        np.testing.assert_array_equal(s2.get_tensor_data(v), [2.0, 2.0])
    np.testing.assert_array_equal(s1.get_tensor_data(v), [1.0, 1.0])  # its own host copy


def test_replication_factor_is_fixed_once_a_session_exists():
    ir = popxl.Ir()
    ir.replication_factor = 2  # allowed before
    popxl.Session(ir, "ipu_hw")
    with pytest.raises(RuntimeError, match="replication_factor"):
        ir.replication_factor = 4
    assert ir.replication_factor == 2


def test_variable_inside_a_subgraph_raises_naming_the_graph():
    ir = popxl.Ir()

    def make_var(x):
        popxl.variable(np.zeros(2, F32), name="w")
        return x

    with ir.main_graph, pytest.raises(ValueError, match=r"make_var_subgraph\(0\)"):
        ir.create_graph(make_var, popxl.TensorSpec((2,), popxl.float32))


def test_scalar_stream_round_trip():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((), popxl.float32, "lr")
        x = ops.host_load(s)
        out = popxl.d2h_stream((), popxl.float32, "out")
        ops.host_store(out, x * 2.0)
    with popxl.Session(ir, "ipu_hw") as session:
        result = session.run({s: np.float32(3.0)})[out]
    assert result.shape == () and result == 6.0
