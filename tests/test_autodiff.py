"""`transforms.autodiff` against torch autograd, and its popxl contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_core.schedule import verify
from popxl_core.transforms import ExpectedConnectionType

FWD, FWD_GRAD = ExpectedConnectionType.Fwd, ExpectedConnectionType.FwdGrad
RNG = np.random.default_rng(7)


def _data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _run_fwd_bwd(build, inputs, grads_required_idx=None):
    """Build fwd graph from ``build``, autodiff it, run both; return (outs, grads, cot)."""
    ir = popxl.Ir()
    with ir.main_graph:
        vs = [popxl.variable(a, name=f"in{i}") for i, a in enumerate(inputs)]
        g = ir.create_graph(build, *[v.spec for v in vs])
        req = None if grads_required_idx is None else [g.inputs[i] for i in grads_required_idx]
        info = transforms.autodiff(g, grads_required=req)
        for gg in ir._graphs.values():
            verify(gg)
        site = ops.call_with_info(g, *vs)
        n_out = len([c for c in info.expected_inputs if c.connection_type is FWD_GRAD])
        cots = [_data(*t.shape) for t in g.outputs[:n_out]]
        grads = ops.call(
            info.graph, *[popxl.constant(c) for c in cots], inputs_dict=info.inputs_dict(site)
        )
        streams = []
        for t in (*site.outputs[:n_out], *grads):
            s = popxl.d2h_stream(t.shape, t.dtype, "o")
            ops.host_store(s, t)
            streams.append(s)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
    vals = [res[s] for s in streams]
    return vals[:n_out], vals[n_out:], cots


def _torch_grads(fn, inputs, cots, idx=None):
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    outs = fn(*ts)
    outs = outs if isinstance(outs, tuple) else (outs,)
    wanted = ts if idx is None else [ts[i] for i in idx]
    grads = torch.autograd.grad(outs, wanted, [torch.tensor(c) for c in cots])
    return [o.detach().numpy() for o in outs], [g.numpy() for g in grads]


def _check(build, ref, inputs, idx=None, rtol=1e-5, atol=1e-6):
    outs, grads, cots = _run_fwd_bwd(build, inputs, idx)
    want_outs, want_grads = _torch_grads(ref, inputs, cots, idx)
    for a, b in zip(outs, want_outs):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    assert len(grads) == len(want_grads)
    for a, b in zip(grads, want_grads):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_chain_rule_and_fan_out():
    _check(lambda x, w: (x * w) * x + w, lambda x, w: (x * w) * x + w, [_data(3, 4), _data(3, 4)])


def test_broadcasting_grads_are_reduced():
    _check(lambda x, b: x * b + b, lambda x, b: x * b + b, [_data(2, 3, 4), _data(4)])


def test_grads_required_subset_and_order():
    _check(
        lambda x, w, b: x * w + b,
        lambda x, w, b: x * w + b,
        [_data(2, 3), _data(2, 3), _data(3)],
        idx=[2, 1],
    )


def test_through_nested_call():
    def build(x, w):
        inner = popxl.gir().create_graph(lambda a, b: a * b * a, x, w)
        (y,) = ops.call(inner, x, w)
        return y + x

    _check(build, lambda x, w: x * w * x + x, [_data(3), _data(3)])


def test_through_repeat():
    def build(x, w):
        body = popxl.gir().create_graph(lambda a, b: a * b + a, x, w)
        return ops.repeat(body, 3, x, w)[0]

    def ref(x, w):
        for _ in range(3):
            x = x * w + x
        return x

    _check(build, ref, [_data(2, 2), _data(2, 2) * 0.5])


def test_inplace_op_in_forward_keeps_the_value_the_grad_needs():
    # in_sequence: reading a and then writing it in place is otherwise ambiguous in PopXL
    @popxl.in_sequence()
    def build(x, w):
        a = x * w
        b = a * a  # needs a as it was here
        ops.add_(a, x)  # ... but a is overwritten afterwards
        return b + a

    def ref(x, w):
        a = x * w
        return a * a + (a + x)

    _check(build, ref, [_data(3), _data(3)])


def test_several_inplace_writes_keep_every_value_the_grads_need():
    # a is written three times and read between the writes (also through its in-place
    # outputs): each gradient rule must see the version it read; exact against torch up to
    # float32 rounding of the same arithmetic.
    @popxl.in_sequence()
    def build(x, w):
        a = x * w
        b = a * a  # needs a before exp_
        e = ops.exp_(a)  # a and e: one storage
        c = e * x  # needs exp(a) before add_
        ops.add_(a, x)  # e too: it is a's storage
        d = ops.relu_(e * w)  # needs e * w as relu_ wrote it
        f = a * d  # needs the final a
        return b + c + f

    def ref(x, w):
        a = x * w
        e = torch.exp(a)
        a2 = e + x
        d = torch.relu(a2 * w)
        return a * a + e * x + a2 * d

    _check(build, ref, [_data(4), _data(4)])


def test_contract_names_connections_and_forward_outputs():
    ir = popxl.Ir()
    with ir.main_graph:

        def lin(x, w):
            return x * w * w

        g = ir.create_graph(
            lin, popxl.TensorSpec((2,), popxl.float32), popxl.TensorSpec((2,), popxl.float32)
        )
        n_outputs_before = len(g.outputs)
        info = transforms.autodiff(g)
    assert info.graph.id == f"{g.id}_bwd"
    assert info.forward_graph is g
    kinds = [c.connection_type for c in info.expected_inputs]
    assert kinds[0] is FWD_GRAD and info.expected_inputs[0].fwd_tensor is g.outputs[0]
    assert all(k is FWD for k in kinds[1:])
    assert [c.fwd_tensor for c in info.expected_outputs] == list(g.inputs)
    assert all(c.connection_type is FWD_GRAD for c in info.expected_outputs)
    # the intermediate x*w is needed by the grad of (x*w)*w: autodiff made it an output
    assert len(g.outputs) == n_outputs_before + 1
    assert info.graph.inputs[0].name == f"Gradient___{g.outputs[0].name}"
    text = repr(info)
    assert text.startswith(f"GradGraphInfo[\n  graph={info.graph.id}\n  expected_inputs=[\n")
    assert "(ExpectedConnectionType.FwdGrad, Tensor[" in text


def test_return_all_grad_graphs_and_second_autodiff_name():
    ir = popxl.Ir()
    with ir.main_graph:

        def outer(x):
            inner = popxl.gir().create_graph(lambda a: a * a, x)
            return ops.call(inner, x)[0] * x

        g = ir.create_graph(outer, popxl.TensorSpec((2,), popxl.float32))
        infos = transforms.autodiff(g, return_all_grad_graphs=True)
        again = transforms.autodiff(g)
    assert g in infos and len(infos) == 2
    assert again.graph.id == f"{g.id}_bwd_0"


def test_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: x * x, popxl.TensorSpec((2,), popxl.float32))
        other = ir.create_graph(lambda x: x + x, popxl.TensorSpec((2,), popxl.float32))
        with pytest.raises(ValueError, match="main graph"):
            transforms.autodiff(ir.main_graph)
        with pytest.raises(ValueError, match="grads_required"):
            transforms.autodiff(g, grads_required=[other.inputs[0]])
        with pytest.raises(TypeError):
            transforms.autodiff("not a graph")


def test_called_graphs_grad_info_is_reused():
    ir = popxl.Ir()
    with ir.main_graph:
        inner = ir.create_graph(lambda a: a * a, popxl.TensorSpec((2,), popxl.float32))
        inner_info = transforms.autodiff(inner)

        def outer(x):
            return ops.call(inner, x)[0] + x

        g = ir.create_graph(outer, popxl.TensorSpec((2,), popxl.float32))
        infos = transforms.autodiff(
            g, called_graphs_grad_info={inner: inner_info}, return_all_grad_graphs=True
        )
    assert infos[inner] is inner_info
    called = {op.called_graphs[0] for op in infos[g].graph.ops if op.called_graphs}
    assert called == {inner_info.graph}


def _repeat_grad_kernel_calls(n: int, monkeypatch) -> int:
    """Sin kernel calls made by one run of a repeat(n) loop's forward and gradient."""
    from popxl_core.sim import compile as sim_compile

    calls = {"Sin": 0}
    bound = sim_compile._bound_kernel

    def counting(op, em):
        kernel = bound(op, em)
        if op.type != "Sin":
            return kernel

        def run(*args):
            calls["Sin"] += 1
            return kernel(*args)

        return run

    monkeypatch.setattr(sim_compile, "_bound_kernel", counting)
    x0 = _data(2, 3)
    body = lambda a: ops.sin(a) * 0.9
    _run_fwd_bwd(lambda x: ops.repeat(popxl.gir().create_graph(body, x), n, x)[0], [x0])
    return calls["Sin"]


def test_repeat_grad_runs_the_body_linearly_often(monkeypatch):
    """Forward n body runs + the grad's n (stashed iterations), and the body's grad reads the
    stashed Sin input; the old recompute-from-the-start rule needed n + n(n+1)/2."""
    c8, c16 = (_repeat_grad_kernel_calls(n, monkeypatch) for n in (8, 16))
    assert c16 == 2 * c8, (c8, c16)
    assert c8 <= 3 * 8, c8


def test_repeat_grad_of_a_longer_loop_matches_torch():
    def ref(x, w):
        for _ in range(6):
            x = torch.sin(x) * w
        return x

    def build(x, w):
        body = popxl.gir().create_graph(lambda a, b: ops.sin(a) * b, x, w)
        return ops.repeat(body, 6, x, w)[0]

    _check(build, ref, [_data(2, 3), _data(2, 3)], rtol=1e-5, atol=1e-6)
