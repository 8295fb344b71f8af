"""The fast mode's step traced by make_fx, compiled by inductor (sim/inductor_trace.py).

Against the same function run eagerly: a variable written in place and the outputs, within the
fast mode's tolerances (test_inductor_kernels.py); an input whose strides change is traced
again (dynamo's guard, kept); Python that branches on data falls back to torch.compile; the
kernels see ``is_compiling()`` as under torch.compile; the trace is the same graph each time
(what inductor's on-disk cache keys on).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.test_inductor_kernels import ATOL, RTOL


@pytest.fixture(scope="module")
def it():
    """sim/inductor_trace.py, imported as the tests run rather than as the module is collected:
    every xdist worker collects every module, and this import (torch._inductor and
    torch._dynamo, ~2.5 s of CPU) is then paid only by the worker that runs the inductor tests
    (conftest.py SHARED_IMPORTS puts them in one unit)."""
    return importlib.import_module("popxl_core.sim.inductor_trace")


def _sgd_step(V, L):
    """A linear layer's SGD step: ``V = [w, unused, b]``, ``L = [x, lr]``; returns the loss."""
    w, b = V[0], V[2]
    x, lr = L
    y = torch.tanh(x @ w.t() + b)
    loss = (y * y).mean()
    g = 2 * (1 - y * y) * y / y.numel()
    w.sub_(lr * (g.t() @ x))
    b.sub_(lr * g.sum(0))
    return (loss.clone(),)


def _state():
    gen = torch.Generator().manual_seed(0)
    w, b, x = (torch.randn(*s, generator=gen) for s in ((3, 4), (3,), (5, 4)))
    return [w, None, b], [x, torch.tensor(0.1)]


def _run_both(it):
    """Two steps compiled and two eager, from the same state."""
    V, L = _state()
    eager_V = [None if v is None else v.clone() for v in V]
    step = it.TracedStep(_sgd_step, {})
    for _ in range(2):
        got, want = step(V, L), _sgd_step(eager_V, L)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(V[0], eager_V[0], rtol=RTOL, atol=ATOL)
    return step, V, L, eager_V


def test_changed_strides_trace_again(it):
    """Compiled once for steps with the same inputs, matching eager (the variables written
    in place); a variable replaced by a tensor of other strides (dynamo would recompile):
    traced and compiled again, and the update lands in the new tensor."""
    step, V, L, eager_V = _run_both(it)
    torch.testing.assert_close(V[2], eager_V[2], rtol=RTOL, atol=ATOL)
    assert step.stats == {"inductor_traces": 1}
    V[0] = V[0].t().contiguous().t()  # same values, column-major
    eager_V[0] = eager_V[0].clone()
    torch.testing.assert_close(step(V, L), _sgd_step(eager_V, L), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(V[0], eager_V[0], rtol=RTOL, atol=ATOL)
    assert step.stats == {"inductor_traces": 2}


def _branchy(V, L):
    """Python that reads a value: no fake tensor can trace it."""
    if float(L[0].sum()) > 0:
        V[0].add_(L[0])
    return (V[0] * 2,)


def test_branch_on_data_falls_back_to_torch_compile(it):
    V, L = [torch.zeros(3)], [torch.ones(3)]
    step = it.TracedStep(_branchy, {})
    for _ in range(2):
        step(V, L)
    assert step.stats == {"inductor_dynamo": 1}
    assert torch.equal(V[0], torch.full((3,), 2.0))


def test_kernels_see_compiling_and_trace_is_deterministic(it):
    """Inside the trace ``torch.compiler.is_compiling()`` is true (the kernels' in-graph
    forms); two traces of one step print the same code (inductor's cache key)."""
    seen = []

    def step(x):
        seen.append(torch.compiler.is_compiling())
        return (x * 2,)

    x = torch.ones(2)
    codes = {it.trace_step(step, [x]).code for _ in range(2)}
    assert seen == [True, True] and len(codes) == 1 and not torch.compiler.is_compiling()
    V, L = _state()
    f = lambda *a: _sgd_step([a[0], None, a[1]], list(a[2:]))
    codes = {it.trace_step(f, [V[0], V[2], *L]).code for _ in range(2)}
    assert len(codes) == 1
