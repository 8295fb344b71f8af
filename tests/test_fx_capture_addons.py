"""popxl_fx.Module inside addons code: inlined as a submodule (names nested under it) and
outlined twice with call_module (one graph, two sets of variables), with autodiff."""

import numpy as np
import torch
from torch import nn

import addons
import popxl_core as popxl
import popxl_fx.lowerings  # noqa: F401  (registers the table)
from popxl_core import ops
from popxl_fx.module import Module


class Host(addons.Module):
    """Inline the first torch block; outline the second twice (shared graph)."""

    def __init__(self, first: nn.Module, second: nn.Module):
        super().__init__()
        self.first = Module(first)
        self.second = second

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        h = self.first(x)
        block = Module(self.second, cache=True)
        (h,) = self.call_module(block, name="second_a")(h)
        (h,) = self.call_module(block, name="second_b")(h)
        return h


def test_inline_and_outlined_fx_modules_match_eager_with_gradients():
    torch.manual_seed(0)
    first = nn.Sequential(nn.Linear(4, 6), nn.Tanh())
    second = nn.Sequential(nn.Linear(6, 6), nn.Sigmoid())
    x, dy = torch.randn(3, 4), torch.randn(3, 6)
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Host(first, second).create_graph(popxl.TensorSpec((3, 4), popxl.float32))
        bwd = addons.autodiff(graph)
        variables = facts.init()
        xv = popxl.variable(x.numpy(), name="x")
        fwd_info = graph.bind(variables).call_with_info(xv)
        bwd_info = bwd.call_with_info(
            popxl.variable(dy.numpy(), name="dy"), args=bwd.grad_graph_info.inputs_dict(fwd_info)
        )
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info, bwd_info)
        streams = {"y": fwd_info.outputs[0]}
        streams.update({f"d.{n}": grads[t] for n, t in variables.to_dict().items()})
        for name, t in list(streams.items()):
            streams[name] = popxl.d2h_stream(t.shape, t.dtype, name)
            ops.host_store(streams[name], t)
    names = sorted(variables.to_dict())
    assert names == sorted(
        [f"first.{n}" for n in ("0.weight", "0.bias")]
        + [f"second_{s}.{n}" for s in "ab" for n in ("0.weight", "0.bias")]
    )
    # one graph for both outlined calls
    calls = [op for op in graph.graph.ops if op.type == "Call"]
    assert len(calls) == 2 and calls[0].called_graphs == calls[1].called_graphs
    session = popxl.Session(ir, "ipu_hw")
    with session:
        out = {k: torch.from_numpy(v.copy()) for k, v in session.run().items()}
    xt = x.clone().requires_grad_()
    y = second(second(first(xt)))
    y.backward(dy)
    torch.testing.assert_close(out[streams["y"]], y.detach(), rtol=1e-6, atol=1e-6)
    # the shared weights' gradient is the sum over both outlined calls
    for n, p in second.named_parameters():
        total = out[streams[f"d.second_a.{n}"]] + out[streams[f"d.second_b.{n}"]]
        torch.testing.assert_close(total, p.grad, rtol=1e-5, atol=1e-6, msg=n)
    for n, p in first.named_parameters():
        torch.testing.assert_close(out[streams[f"d.first.{n}"]], p.grad, rtol=1e-5, atol=1e-6)
    assert np.isfinite(out[streams["y"]].numpy()).all()
