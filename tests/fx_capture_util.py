"""Test helper: lower a torch module with popxl_fx.Module and run forward (+ backward) once."""

from __future__ import annotations

import torch
from torch import nn

import addons
import popxl_core as popxl
import popxl_fx.lowerings  # noqa: F401  (registers the table)
from popxl_core import ops
from popxl_fx.module import Module

__all__ = ["run_module", "eager_grads"]


def _spec(x: torch.Tensor) -> popxl.TensorSpec:
    return popxl.TensorSpec(tuple(x.shape), popxl.dtype.as_dtype(x.dtype))


def _store(y: popxl.Tensor, name: str) -> popxl.DeviceToHostStream:
    stream = popxl.d2h_stream(y.shape, y.dtype, name)
    ops.host_store(stream, y)
    return stream


def run_module(model: nn.Module, *xs: torch.Tensor, dy: torch.Tensor | None = None) -> dict:
    """Run ``model`` lowered on the simulator; returns {"out": [...], "grads": {name: grad}}.

    With ``dy`` (the cotangent of the single output), also runs popxl's autodiff graph and
    returns the gradients of the inputs ("x0", ...) and of every variable (torch names).
    """
    mod = Module(model, flatten_outputs=True)
    ir = popxl.Ir()
    streams: dict[str, popxl.DeviceToHostStream] = {}
    with ir.main_graph:
        facts, graph = mod.create_graph(*[_spec(x) for x in xs])
        variables = facts.init()
        inputs = [popxl.variable(x.numpy(), name=f"x{i}") for i, x in enumerate(xs)]
        if dy is None:
            outs = graph.bind(variables).call(*inputs)
        else:
            bwd = addons.autodiff(graph)
            fwd_info = graph.bind(variables).call_with_info(*inputs)
            outs = fwd_info.outputs
            grad_in = popxl.variable(dy.numpy(), name="dy")
            bwd_info = bwd.call_with_info(grad_in, args=bwd.grad_graph_info.inputs_dict(fwd_info))
            grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info, bwd_info)
            for i, x in enumerate(inputs):
                streams[f"grad:x{i}"] = _store(grads[x], f"grad_x{i}")
            for name, t in variables.to_dict().items():
                if t in grads:
                    streams[f"grad:{name}"] = _store(grads[t], f"grad_{name}")
        for i, y in enumerate(outs):
            streams[f"out:{i}"] = _store(y, f"y{i}")
    session = popxl.Session(ir, "ipu_hw")
    with session:
        result = session.run()
    res = {k: torch.from_numpy(result[s].copy()) for k, s in streams.items()}
    data = {
        n: torch.from_numpy(session.get_tensor_data(t).copy())
        for n, t in variables.to_dict().items()
    }
    return {
        "out": [res[f"out:{i}"] for i in range(len(outs))],
        "grads": {k[5:]: v for k, v in res.items() if k.startswith("grad:")},
        "variables": data,
    }


def eager_grads(model: nn.Module, xs: list[torch.Tensor], dy: torch.Tensor) -> dict:
    """torch's output and gradients of inputs ("x0", ...) and parameters for cotangent dy."""
    xs = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
    model.zero_grad()
    y = model(*xs)
    y.backward(dy)
    grads = {f"x{i}": x.grad for i, x in enumerate(xs) if x.grad is not None}
    grads.update({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    return {"out": y.detach(), "grads": grads}
