"""Custom gradients with `Module.build_grad`, as popxl.addons defines them (issue 9).

Numbers are compared with popxl autodiff of the same forward graph; both run the same float32
matmuls and sums, so they must agree exactly.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import popxl_core as popxl
from addons import Module
from popxl_core import ops


class _Affine(Module):
    """y = x * s + c, with its gradient written by hand."""

    def build(self, x: popxl.Tensor, scale: popxl.Tensor) -> popxl.Tensor:
        c = self.add_variable_input("c", partial(np.zeros, x.shape), popxl.float32)
        self.aux["x"], self.aux["scale"], self.aux["note"] = x, scale, "kept as is"
        return x * scale + c

    def build_grad(self, dy: popxl.Tensor):
        assert self.aux["note"] == "kept as is" and self.aux["x"] is self.aux["x"]
        self.var_grad["c"] = dy
        return dy * self.aux["scale"], dy * self.aux["x"]


def _graph(module: Module):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="x")
        s = popxl.variable(np.full((2, 3), 0.5, np.float32), name="s")
        facts, fwd = module.create_graph(x, s)
    return ir, (x, s), facts, fwd


def _run(ir, fwd, facts, grad, x, s, dy):
    with ir.main_graph:
        site = fwd.bind(facts.init()).call_with_info(x, s)
        outs = grad.call(popxl.constant(dy), args=grad.grad_graph_info.inputs_dict(site))
        streams = [popxl.d2h_stream(t.shape, t.dtype) for t in outs]
        for st, t in zip(streams, outs):
            ops.host_store(st, t)
    with popxl.Session(ir, "ipu_model") as session:
        res = session.run()
    return [res[st] for st in streams]


def test_grad_graph_structure_and_numbers_match_autodiff():
    dy = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    results = {}
    for method in ("build_grad", "autodiff"):
        ir, (x, s), facts, fwd = _graph(_Affine())
        n_fwd_outputs = len(fwd.graph.outputs)
        grad = fwd.autodiff(method=method)
        if method == "build_grad":
            # the aux tensors read in build_grad became forward outputs feeding the grad graph
            assert len(fwd.graph.outputs) == n_fwd_outputs + 2
            assert len(grad.graph.inputs) == len(fwd.graph.outputs) == 3
            # in the order build_grad first read them
            assert [t.name for t in grad.graph.inputs[1:]] == ["x", "scale"]
            assert len(grad.graph.outputs) == len(fwd.graph.inputs) == 3
        results[method] = _run(ir, fwd, facts, grad, x, s, dy)
    for mine, ref in zip(results["build_grad"], results["autodiff"]):
        np.testing.assert_array_equal(mine, ref)


def test_returned_grads_map_onto_required_non_variable_inputs():
    ir, _, _, fwd = _graph(_Affine())
    x_in, s_in, c = fwd.graph.inputs
    grad = fwd.autodiff(method="build_grad", grads_required=[c, s_in, x_in])
    assert [e.fwd_tensor for e in grad.grad_graph_info.expected_outputs] == [c, s_in, x_in]
    other = _graph(_Affine())[3]
    with pytest.raises(ValueError, match="Too many outputs in the grad graph"):
        other.autodiff(method="build_grad", grads_required=[other.args.c])


def test_misuse_errors_leave_the_forward_graph_unchanged():
    ir, (x, _), _, fwd = _graph(_Affine())
    n_out = len(fwd.graph.outputs)
    with pytest.raises(ValueError, match="not a input of `fwd_graph`"):
        fwd.autodiff(method="build_grad", grads_required=[x])
    with pytest.raises(ValueError, match="not a output of `fwd_graph`"):
        fwd.autodiff(method="build_grad", grads_provided=[x])
    with pytest.raises(ValueError, match="Too many outputs"):
        fwd.autodiff(method="build_grad", grads_required=[fwd.args.c])
    assert len(fwd.graph.outputs) == n_out  # nothing exposed by the failed attempts
    fwd.autodiff(method="build_grad")


class _Broken(Module):
    def __init__(self, mistake: str):
        super().__init__()
        self.mistake = mistake

    def build(self, x: popxl.Tensor, scale: popxl.Tensor) -> popxl.Tensor:
        self.add_variable_input("c", partial(np.zeros, x.shape), popxl.float32)
        self.aux["x"] = x
        with pytest.raises(RuntimeError, match="cannot get items within the `build_graph`"):
            self.aux["x"]
        with pytest.raises(RuntimeError, match="only use var_grad inside `build_grad`"):
            self.var_grad["c"] = x
        return x * scale

    def build_grad(self, dy: popxl.Tensor):
        with pytest.raises(TypeError, match="Not a tensor"):
            self.var_grad["c"] = 1.0
        with pytest.raises(KeyError, match="Not a variable"):
            self.var_grad["nope"] = dy
        with pytest.raises(ValueError, match="Shape or meta-shape of Tensor does not match"):
            self.var_grad["c"] = ops.sum(dy)
        if self.mistake != "no var grad":
            self.var_grad["c"] = dy
        if self.mistake == "wrong shape":
            return ops.sum(dy), dy
        return (dy,) if self.mistake == "one grad" else (dy, dy)


@pytest.mark.parametrize(
    "mistake, error",
    [
        ("no var grad", "Not all variable gradients have been specified"),
        ("wrong shape", "Shape or meta-shape of output Tensor at position 0"),
        ("one grad", "Not all forward graph inputs have been specified"),
    ],
)
def test_build_grad_mistakes_are_named(mistake, error):
    _, _, _, fwd = _graph(_Broken(mistake))
    with pytest.raises(ValueError, match=error):
        fwd.autodiff(method="build_grad")


class _Outer(Module):
    def build(self, x: popxl.Tensor, scale: popxl.Tensor) -> popxl.Tensor:
        (y,) = self.call_module(_Affine())(x, scale)
        return y


def test_autodiff_refuses_a_build_grad_graph_without_its_grad_info():
    _, _, _, fwd = _graph(_Outer())
    recorded = fwd.called_graphs_grad_info
    assert len(recorded) == 1
    fwd.called_graphs_grad_info = {}
    with pytest.raises(RuntimeError, match="marked as unsafe to autodiff"):
        fwd.autodiff()
    fwd.called_graphs_grad_info = recorded
    fwd.autodiff()


def test_signature_and_cache_restrictions():
    class Star(_Affine):
        def build_grad(self, *grads):
            return grads

    with pytest.raises(TypeError, match="fixed number of positional parameters"):
        _graph(Star())[3].autodiff(method="build_grad")
    with pytest.raises(ValueError, match="cannot use graph caching"):
        _Affine(cache=True)
