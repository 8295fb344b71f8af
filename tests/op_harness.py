"""Runs one op-table `Sample` on the simulator and against eager torch.

Forward outputs are compared with the sample's torch reference; gradients of every
floating-point input are compared with torch autograd for a *random* cotangent; and the
Session runs in spec-checking mode, so every kernel output must match the op table's
inferred shape and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_core.ops.registry import OpDef, Sample
from popxl_core.sim import CompileOptions

__all__ = ["run_sample", "build_sample", "BuiltSample"]


def _as_tuple(x) -> Tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _ops_in(graph, seen=None) -> List[str]:
    seen = set() if seen is None else seen
    names = []
    for op in graph._ops:
        names.append(op.type)
        for g in op.called_graphs:
            if g not in seen:
                seen.add(g)
                names += _ops_in(g, seen)
    return names


def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def run_sample(opdef: OpDef, sample: Sample) -> None:
    built = build_sample(opdef, sample)
    session = popxl.Session(built.ir, "ipu_hw", compile_options=CompileOptions(check_specs=True))
    with session:
        results = session.run({})
    _compare_forward(sample, built.inputs, [results[s] for s in built.fwd_streams])
    if built.bwd is not None:
        _compare_grads(
            sample, built.inputs, built.cotangents, [results[s] for s in built.grad_streams]
        )


@dataclass
class BuiltSample:
    """The Ir of one sample: its op (in a called subgraph) on variables holding the sample's
    inputs, its outputs and (where the op has a gradient) input gradients streamed out."""

    ir: popxl.Ir
    inputs: List[np.ndarray]
    variables: List
    fwd_streams: List
    grad_streams: List
    cotangents: List[np.ndarray]
    bwd: object


def build_sample(opdef: OpDef, sample: Sample) -> BuiltSample:
    inputs = [np.asarray(a) for a in sample.inputs]
    ir = popxl.Ir()
    with ir.main_graph:
        variables = [
            popxl.variable(a, popxl.dtype.as_dtype(a), name=f"in{i}", downcast=False)
            for i, a in enumerate(inputs)
        ]
        graph = ir.create_graph(
            lambda *xs: _as_tuple(sample.build(*xs)), *[v.spec for v in variables]
        )
        assert opdef.name in _ops_in(graph), (
            f"sample {sample.name!r} does not create a {opdef.name} op"
        )
        float_ins = [t for t, a in zip(graph.inputs, inputs) if _is_float(a)]
        want_grad = (
            sample.grad and float_ins and all(t.dtype.is_floating_point for t in graph.outputs)
        )
        bwd = transforms.autodiff(graph, grads_required=float_ins) if want_grad else None
        site = ops.call_with_info(graph, *variables)
        fwd_streams = _store_all(site.outputs[: len(_fwd_outputs(graph, bwd))])
        cotangents, grad_streams = [], []
        if bwd is not None:
            rng = np.random.default_rng(1234)
            cotangents = [
                rng.standard_normal(t.shape).astype(t.dtype.as_numpy()) for t in fwd_outputs_of(bwd)
            ]
            consts = [popxl.constant(c, t.dtype) for c, t in zip(cotangents, fwd_outputs_of(bwd))]
            grads = ops.call(bwd.graph, *consts, inputs_dict=bwd.inputs_dict(site))
            grad_streams = _store_all(grads)
    return BuiltSample(ir, inputs, variables, fwd_streams, grad_streams, cotangents, bwd)


def fwd_outputs_of(bwd) -> List:
    return [c.fwd_tensor for c in bwd.expected_inputs if c.connection_type.name == "FwdGrad"]


def _fwd_outputs(graph, bwd) -> List:
    return fwd_outputs_of(bwd) if bwd is not None else list(graph.outputs)


def _store_all(tensors) -> List:
    streams = []
    for t in tensors:
        s = popxl.d2h_stream(t.shape, t.dtype, f"out_{len(streams)}")
        ops.host_store(s, t)
        streams.append(s)
    return streams


def _reference(sample: Sample, inputs, requires_grad: bool):
    tins = [torch.tensor(a, requires_grad=requires_grad and _is_float(a)) for a in inputs]
    return tins, _as_tuple(sample.reference(*tins))


def _compare_forward(sample: Sample, inputs, got) -> None:
    _, want = _reference(sample, inputs, False)
    assert len(got) == len(want), f"{len(got)} outputs, reference has {len(want)}"
    for g, w in zip(got, want):
        w = w.detach().numpy()
        assert g.shape == w.shape, f"shape {g.shape} != reference {w.shape}"
        np.testing.assert_allclose(
            g.astype(np.float64), w.astype(np.float64), rtol=sample.rtol, atol=sample.atol
        )


def _compare_grads(sample: Sample, inputs, cotangents, got) -> None:
    tins, outs = _reference(sample, inputs, True)
    leaves = [t for t in tins if t.requires_grad]
    cots = [torch.tensor(c) for c in cotangents]
    want = torch.autograd.grad(outs, leaves, cots, allow_unused=True)
    for g, w, leaf in zip(got, want, leaves):
        w = torch.zeros_like(leaf) if w is None else w
        np.testing.assert_allclose(
            g.astype(np.float64),
            w.detach().numpy().astype(np.float64),
            rtol=max(sample.rtol, 1e-5) * 10,
            atol=max(sample.atol, 1e-6) * 10,
        )
