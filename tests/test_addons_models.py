"""The seeds' addons models (Linear, Net, NetOutlined, Adam) and end-to-end runs of them."""

from functools import partial

import numpy as np
import torch

import addons
import popxl_core as popxl
from popxl_core import ops


class Linear(addons.Module):
    def __init__(self, out_features: int, bias: bool = True):
        super().__init__()
        self.out_features = out_features
        self.bias = bias

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input(
            "weight", partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)), x.dtype
        )
        y = x @ w
        if self.bias:
            b = self.add_variable_input("bias", partial(np.zeros, y.shape[-1]), x.dtype)
            y = y + b
        return y


class Net(addons.Module):
    def __init__(self, cache=None):
        super().__init__(cache=cache)
        self.fc1 = Linear(512)
        self.fc2 = Linear(512)
        self.fc3 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor):
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(self.fc1(x))
        x = ops.gelu(self.fc2(x))
        x = ops.gelu(self.fc3(x))
        return self.fc4(x)


class NetOutlined(addons.Module):
    def __init__(self, cache=None):
        super().__init__(cache=cache)
        self.fc1 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor):
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(self.fc1(x))
        facts, subgraph = Linear(512).create_graph(x)
        fc2 = subgraph.bind(self.add_variable_inputs("fc2", facts))
        fc3 = subgraph.bind(self.add_variable_inputs("fc3", facts))
        (x,) = fc2.call(x)
        x = ops.gelu(x)
        (x,) = fc3.call(x)
        x = ops.gelu(x)
        return self.fc4(x)


class Adam(addons.Module):
    @popxl.in_sequence()
    def build(
        self,
        weight: popxl.TensorByRef,
        grad: popxl.Tensor,
        *,
        lr,
        beta1=0.9,
        beta2=0.999,
        eps=1e-5,
        weight_decay=0.0,
        first_order_dtype=popxl.float16,
        bias_correction=True,
    ):
        first_order = self.add_variable_input(
            "first_order", partial(np.zeros, weight.shape), first_order_dtype, by_ref=True
        )
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = self.add_variable_input(
            "second_order", partial(np.zeros, weight.shape), popxl.float32, by_ref=True
        )
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)
        step = None
        if bias_correction:
            step = self.add_variable_input(
                "step", partial(np.zeros, ()), popxl.float32, by_ref=True
            )
        dw = ops.var_updates.adam_updater(
            first_order,
            second_order,
            weight=weight,
            weight_decay=weight_decay,
            time_step=step,
            beta1=beta1,
            beta2=beta2,
            epsilon=eps,
        )
        ops.scaled_add_(weight, dw, b=-lr)


def _gelu(x: np.ndarray) -> np.ndarray:
    return torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()


def test_linear_end_to_end_matches_numpy():
    np.random.seed(1)
    ir = popxl.Ir(replication=1)
    x_data = np.random.rand(2, 4).astype(np.float32)
    with ir.main_graph:
        facts, graph = Linear(32).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        variables = facts.init()
        x = popxl.variable(x_data, name="x")
        (y,) = graph.bind(variables).call(x)
        out = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(out, y)
    ir.num_host_transfers = 1
    session = popxl.Session(ir, "ipu_hw")
    with session:
        result = session.run()[out]
    w = session.get_tensor_data(variables.weight)
    b = session.get_tensor_data(variables.bias)
    assert w.shape == (4, 32) and np.abs(w).max() > 0
    np.testing.assert_allclose(result, x_data @ w + b, rtol=1e-6, atol=1e-6)


def test_outlined_net_matches_inline_computation():
    np.random.seed(2)
    ir = popxl.Ir()
    img = np.random.rand(28, 28).astype(np.float32)
    with ir.main_graph:
        facts, graph = NetOutlined().create_graph(popxl.TensorSpec((28, 28), popxl.float32))
        variables = facts.init()
        (y,) = graph.bind(variables).call(popxl.variable(img, name="img"))
        out = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(out, y)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        result = session.run()[out]
    data = {k: session.get_tensor_data(t) for k, t in variables.to_dict().items()}
    h = img.reshape(1, 784)
    for layer in ("fc1", "fc2", "fc3"):
        h = _gelu(h @ data[f"{layer}.weight"] + data[f"{layer}.bias"])
    expected = h @ data["fc4.weight"] + data["fc4.bias"]
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)
    # fc2 and fc3 share one graph but got distinct variables with distinct data
    assert not np.array_equal(data["fc2.weight"], data["fc3.weight"])


def test_training_step_updates_weights_with_autodiff_gradients():
    np.random.seed(3)
    ir = popxl.Ir()
    x_data = np.random.rand(3, 4).astype(np.float32)
    dy_data = np.random.rand(3, 5).astype(np.float32)
    lr = 0.5
    # in_sequence: the bias update does not depend on the forward call that reads the bias
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(x_data, name="x")
        dy = popxl.variable(dy_data, name="dy")
        facts, fwd = Linear(5).create_graph(x)
        bwd = addons.autodiff(fwd)
        variables = facts.init()
        fwd_info = fwd.bind(variables).call_with_info(x)
        bwd_info = bwd.call_with_info(dy, args=bwd.grad_graph_info.inputs_dict(fwd_info))
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info, bwd_info)
        for t in variables.tensors:
            ops.scaled_add_(t, grads[t], b=-lr)
    session = popxl.Session(ir, "ipu_hw")
    w0 = session.get_tensor_data(variables.weight).copy()
    b0 = session.get_tensor_data(variables.bias).copy()
    with session:
        session.run()
    np.testing.assert_allclose(
        session.get_tensor_data(variables.weight),
        w0 - lr * x_data.T @ dy_data,
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        session.get_tensor_data(variables.bias), b0 - lr * dy_data.sum(0), rtol=1e-5, atol=1e-6
    )


def test_adam_with_cache_runs_and_updates_state():
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        var = popxl.variable(np.ones((2, 2)), popxl.float32)
        grad = popxl.variable(np.full((2, 2), 0.1), popxl.float32)
        adam = Adam(cache=True)
        facts, graph = adam.create_graph(var, var.spec, lr=1e-3)
        state = facts.init()
        graph.bind(state).call(var, grad)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        session.run()
    data = session.get_tensors_data(state.tensors)
    step = data[state.step]
    assert step.shape == () and float(step) == 1.0
    np.testing.assert_allclose(data[state.second_order], np.full((2, 2), 1e-5), rtol=1e-3)
    assert np.all(session.get_tensor_data(var) < 1.0)
