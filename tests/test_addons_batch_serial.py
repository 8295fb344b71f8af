"""addons.batch_serialise: the serialised loop against the plain graph run step by step."""

from __future__ import annotations

import numpy as np
import pytest

import addons
import popxl_core as popxl
from popxl_core import ops

from .test_addons_models import Linear

STEPS = 4


def _batches(seed: int, n: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def _plain_outputs(xs: np.ndarray) -> np.ndarray:
    """The Linear graph, one host transfer per Session.run, run once per batch."""
    np.random.seed(0)
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream(xs.shape[1:], popxl.float32, "x")
        facts, graph = Linear(5).create_graph(x_stream.spec)
        (y,) = graph.bind(facts.init()).call(ops.host_load(x_stream))
        y_stream = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(y_stream, y)
    with popxl.Session(ir, "ipu_hw") as session:
        return np.stack([session.run({x_stream: x})[y_stream] for x in xs])


def _serial_outputs(xs: np.ndarray, io_mode: str) -> np.ndarray:
    np.random.seed(0)
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream(xs.shape[1:], popxl.float32, "x")
        facts, graph = Linear(5).create_graph(x_stream.spec)
        y_stream = popxl.d2h_stream(graph.graph.outputs[0].shape, popxl.float32, "y")
        bs = addons.batch_serialise(
            graph,
            STEPS,
            load_handles={graph.graph.inputs[0]: x_stream},
            store_streams={graph.graph.outputs[0]: y_stream},
            store_buffers={},
            io_mode=io_mode,
        )
        bs.graph.bind(facts.init()).call(0)
    ir.num_host_transfers = STEPS
    with popxl.Session(ir, "ipu_hw") as session:
        return session.run({x_stream: xs})[y_stream]


@pytest.mark.parametrize("io_mode", ["compute", "io", "io_overlapped"])
def test_batch_serialised_steps_equal_the_graph_run_step_by_step(io_mode):
    # the same kernels on the same data in the same order: bitwise equal
    xs = _batches(1, STEPS, (3, 7))
    np.testing.assert_array_equal(_serial_outputs(xs, io_mode), _plain_outputs(xs))


def test_serialised_graph_keeps_named_args_and_takes_the_row_offset_first():
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((3, 7), popxl.float32, "x")
        _, graph = Linear(5).create_graph(x_stream.spec)
        bs = addons.batch_serialise(graph, 2, {graph.graph.inputs[0]: x_stream}, {}, {})
    g = bs.graph.graph
    assert g.inputs[0].dtype is popxl.int32 and g.inputs[0].shape == ()
    assert sorted(bs.graph.args.keys_flat()) == ["bias", "weight"]
    assert bs.remap_tensors(graph.args).weight is bs.graph.args.weight
    assert g.outputs == ()


def test_bad_arguments_are_named():
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((3, 7), popxl.float32, "x")
        wrong = popxl.h2d_stream((3, 6), popxl.float32, "wrong")
        _, graph = Linear(5).create_graph(x_stream.spec)
        x_in = graph.graph.inputs[0]
        with pytest.raises(ValueError, match="io_overlapped.*steps >= 2"):
            addons.batch_serialise(graph, 1, {x_in: x_stream}, {}, {}, io_mode="io_overlapped")
        with pytest.raises(ValueError, match="io_mode must be one of"):
            addons.batch_serialise(graph, 2, {x_in: x_stream}, {}, {}, io_mode="fast")
        with pytest.raises(ValueError, match="stream 'wrong.*\\(3, 6\\)"):
            addons.batch_serialise(graph, 2, {x_in: wrong}, {}, {})
        with pytest.raises(ValueError, match="not an output of graph"):
            y_stream = popxl.d2h_stream((3, 7), popxl.float32)
            addons.batch_serialise(graph, 2, {}, {x_in: y_stream}, {})
        with pytest.raises(ValueError, match="steps must be a positive int"):
            addons.batch_serialise(graph, 0, {}, {}, {})


class LossAndGrad(addons.Module):
    """Linear + softmax cross entropy + the Linear's backward, accumulating its gradients."""

    def build(self, x: popxl.Tensor, labels: popxl.Tensor) -> popxl.Tensor:
        facts, fwd = Linear(10).create_graph(x.spec)
        grad_facts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        info = fwd.bind(self.add_variable_inputs("fwd", facts)).call_with_info(x)
        loss, dy = addons.cross_entropy_with_grad(info.parent_output(0), labels)
        bwd_vars = self.add_variable_inputs("bwd", grad_facts)
        bwd.bind(bwd_vars).call(dy, args=bwd.grad_graph_info.inputs_dict(info))
        return loss


def _accumulated(xs: np.ndarray, labels: np.ndarray, steps: int):
    """(losses, accumulated weight and bias grads) of LossAndGrad batch-serialised over
    ``steps`` micro-batches (steps=1: one plain call on the whole batch)."""
    np.random.seed(3)
    ir = popxl.Ir()
    micro = xs.shape[0] // steps
    with ir.main_graph:
        x_stream = popxl.h2d_stream((micro, xs.shape[1]), popxl.float32, "x")
        l_stream = popxl.h2d_stream((micro,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        facts, graph = LossAndGrad().create_graph(x_stream.spec, l_stream.spec)
        x_in, l_in = graph.graph.inputs[:2]
        bs = addons.batch_serialise(
            graph,
            steps,
            {x_in: x_stream, l_in: l_stream},
            {graph.graph.outputs[0]: loss_stream},
            {},
            io_mode="compute",
        )
        variables = facts.init()
        bs.graph.bind(variables).call(0)
    ir.num_host_transfers = steps
    shaped = (lambda a: a.reshape(steps, micro, *a.shape[1:])) if steps > 1 else (lambda a: a)
    with popxl.Session(ir, "ipu_hw") as session:
        loss = session.run({x_stream: shaped(xs), l_stream: shaped(labels)})[loss_stream]
    acc = session.get_tensors_data([variables.bwd.accum.weight, variables.bwd.accum.bias])
    return np.atleast_1d(loss), [acc[variables.bwd.accum.weight], acc[variables.bwd.accum.bias]]


def test_gradient_accumulation_equals_one_batch_k_times_larger():
    """k micro-batches' mean gradients, mean-accumulated = the gradient of the mean loss over
    the k-times-larger batch; equal up to float32 round-off of the re-ordered sums."""
    k, micro = 4, 6
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((k * micro, 12)).astype(np.float32)
    labels = rng.integers(0, 10, k * micro).astype(np.int32)
    losses, (dw_k, db_k) = _accumulated(xs, labels, k)
    (loss_1,), (dw_1, db_1) = _accumulated(xs, labels, 1)
    assert losses.shape == (k,)
    np.testing.assert_allclose(losses.mean(), loss_1, rtol=1e-6)
    # gradients are O(0.1); measured worst difference 2.2e-8 (the sums differ in order)
    np.testing.assert_allclose(dw_k, dw_1, rtol=0, atol=2e-7)
    np.testing.assert_allclose(db_k, db_1, rtol=0, atol=2e-7)
    assert np.abs(dw_1).max() > 1e-2  # not a vacuous comparison of zeros


@pytest.mark.parametrize("io_mode", ["compute", "io_overlapped"])
def test_seed_input_gets_a_fresh_seed_each_step(io_mode):
    """Step i runs with the first half of splitting the seed i times: the same draws as
    calling the graph with that chain of seeds by hand."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        seed_spec = popxl.TensorSpec((2,), popxl.uint32)
        g = addons.GraphWithNamedArgs(
            ir.create_graph(lambda s: ops.random_normal(s, (3,)), seed_spec)
        )
        out = popxl.d2h_stream((3,), popxl.float32, "draws")
        bs = addons.batch_serialise(
            g,
            STEPS,
            {},
            {g.graph.outputs[0]: out},
            {},
            seed_input=g.graph.inputs[0],
            io_mode=io_mode,
        )
        seed = popxl.variable(popxl.create_seeds(7), popxl.uint32, "seed")
        bs.graph.call(0, seed)
        ref = popxl.d2h_stream((3,), popxl.float32, "ref")
        s = seed
        for _ in range(STEPS):
            now, s = ops.split_random_seed(s)
            ops.host_store(ref, ops.call(g.graph, now)[0])
    ir.num_host_transfers = STEPS
    with popxl.Session(ir, "ipu_hw") as session:
        res = session.run()
    np.testing.assert_array_equal(res[out], res[ref])
    assert len({tuple(r) for r in res[out]}) == STEPS  # every step drew different numbers
