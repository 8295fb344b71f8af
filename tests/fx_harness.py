"""Checks one torch module lowered by popxl_fx against eager torch: forward outputs, the
gradients of every float input and parameter for a *random* cotangent, and the buffers a
train-mode forward updates (batch-norm running statistics).

Used by the tests/test_fx_lowerings_*.py files: each case is a tiny nn.Module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.utils._pytree as pytree

import addons
import popxl_core as popxl
import popxl_fx.lowerings  # noqa: F401  (registers the table entries)
from popxl_core import ops
from popxl_fx.module import Module

__all__ = ["Result", "check_lowering", "lowered_ops"]

# inputs keep torch's dtypes (int64 labels stay int64), as popxl_fx's programs feed them
_NARROW = {torch.float64: torch.float32}


@dataclass
class Result:
    """Max absolute differences seen (forward outputs, gradients, buffers)."""

    forward: float = 0.0
    grad: float = 0.0
    buffers: float = 0.0


def _spec(x: torch.Tensor) -> popxl.TensorSpec:
    return popxl.TensorSpec(tuple(x.shape), popxl.dtype.as_dtype(_NARROW.get(x.dtype, x.dtype)))


def _host(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(_NARROW.get(x.dtype, x.dtype)).numpy()


def _store(t: popxl.Tensor, name: str):
    stream = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(stream, t)
    return stream


def _build(model, inputs, grad: bool, rng):
    """The IR: forward call, gradient call with random cotangents, host stores."""
    module = Module(model, flatten_outputs=True)
    module.inputs_require_grad = tuple(x.is_floating_point() and grad for x in inputs)
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = module.create_graph(*[_spec(x) for x in inputs])  # leaves model as is
        variables = facts.init()
        names = dict(zip(graph.args.to_dict().values(), graph.args.to_dict().keys()))
        n_out = len(graph.graph.outputs)
        float_ins = [t for t, x in zip(graph.graph.inputs, inputs) if x.is_floating_point()]
        params = {n for n, p in model.named_parameters() if p.requires_grad}
        wrt = float_ins + [t for t, n in names.items() if n in params]
        provided = [t for t in graph.graph.outputs if t.dtype.is_floating_point]
        bwd = None
        if grad and wrt and provided:
            bwd = addons.autodiff(graph, grads_provided=provided, grads_required=wrt)
        xs = [popxl.variable(_host(x), _spec(x).dtype, name=f"x{i}") for i, x in enumerate(inputs)]
        info = graph.bind(variables).call_with_info(*xs)
        outs = [_store(t, f"out{i}") for i, t in enumerate(info.outputs[:n_out])]
        grads, cots = {}, []
        if bwd is not None:
            fwd_outs = [
                c.fwd_tensor
                for c in bwd.grad_graph_info.expected_inputs
                if c.connection_type.name == "FwdGrad"
            ]
            cots = [rng.standard_normal(t.shape).astype(np.float32) for t in fwd_outs]
            g_info = bwd.call_with_info(
                *[popxl.constant(c) for c in cots], args=bwd.grad_graph_info.inputs_dict(info)
            )
            by_parent = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, g_info)
            vmap = variables.to_dict()
            for i, x in enumerate(xs):
                if x in by_parent:
                    grads[f"input{i}"] = _store(by_parent[x], f"grad_in{i}")
            for n, v in vmap.items():
                if v in by_parent:
                    grads[n] = _store(by_parent[v], f"grad_{n}")
    return ir, variables.to_dict(), outs, grads, cots, module


def check_lowering(
    model: torch.nn.Module,
    *inputs: torch.Tensor,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    grad: bool = True,
    grad_rtol: float | None = None,
    grad_atol: float | None = None,
    seed: int = 0,
) -> Result:
    """Lower ``model`` with popxl_fx, run it on the simulator and compare with torch.

    Gradients are compared at ``grad_rtol``/``grad_atol`` (default: the forward tolerances).
    Returns the max absolute differences.
    """
    rng = np.random.default_rng(seed)
    ir, variables, outs, grads, cots, module = _build(model, inputs, grad, rng)
    with popxl.Session(ir, "cpu") as session:
        got = session.run()
        buffers_after = session.get_tensors_data(
            [variables[n] for n, _ in model.named_buffers() if n in variables]
        )
    result = Result()
    tin = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    want = [t for t in pytree.tree_leaves(model(*tin)) if isinstance(t, torch.Tensor)]
    assert len(want) == len(outs), f"{len(outs)} outputs lowered, torch returned {len(want)}"
    for i, (w, s) in enumerate(zip(want, outs)):
        result.forward = max(result.forward, _compare(f"output {i}", got[s], w, rtol, atol))
    bvars = [n for n, _ in model.named_buffers() if n in variables]
    for n, v in zip(bvars, buffers_after.values()):
        w = dict(model.named_buffers())[n]
        result.buffers = max(result.buffers, _compare(f"buffer {n}", v, w, rtol, atol))
    if grads:
        result.grad = _compare_grads(
            model, tin, want, cots, grads, got, grad_rtol or rtol, grad_atol or atol
        )
    return result


def _compare_grads(model, tin, want, cots, grads, got, rtol, atol) -> float:
    leaves = {f"input{i}": t for i, t in enumerate(tin) if t.requires_grad}
    leaves.update({n: p for n, p in model.named_parameters() if n in grads and p.requires_grad})
    keys = [k for k in leaves if k in grads]
    # cotangents go with the float outputs; those torch computes without a graph add nothing
    pairs = [(w, c) for w, c in zip([w for w in want if w.is_floating_point()], cots)]
    pairs = [(w, torch.from_numpy(c)) for w, c in pairs if w.requires_grad]
    if pairs:
        outs, cot = zip(*pairs)
        ref = torch.autograd.grad(outs, [leaves[k] for k in keys], cot, allow_unused=True)
    else:
        ref = [None] * len(keys)
    worst = 0.0
    for k, r in zip(keys, ref):
        r = torch.zeros_like(leaves[k]) if r is None else r
        worst = max(worst, _compare(f"gradient of {k}", got[grads[k]], r, rtol, atol))
    return worst


def _compare(what: str, got: np.ndarray, want: torch.Tensor, rtol: float, atol: float) -> float:
    w = want.detach().numpy()
    assert got.shape == w.shape, f"{what}: shape {got.shape}, torch {w.shape}"
    if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
        np.testing.assert_array_equal(got, w.astype(got.dtype), err_msg=what)
        return 0.0
    np.testing.assert_allclose(got, w, rtol=rtol, atol=atol, err_msg=what)
    return float(np.abs(got.astype(np.float64) - w).max()) if w.size else 0.0


def lowered_ops(model: torch.nn.Module, *inputs: torch.Tensor) -> list[str]:
    """The op types of the lowered forward graph (to check which ops a lowering used)."""
    module = Module(model)
    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = module.create_graph(*[_spec(x) for x in inputs])
    return [op.type for op in graph.graph._ops]
