"""`popxl_fx.trace_patch`: inside a lowering, the capture traces patch `nn.Module` once, not
once per trace, and trace the same graphs as torch.fx's own patches."""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx as fx
import torch.fx._symbolic_trace as fx_trace
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx import trace_patch
from popxl_fx.capture import CaptureTracer, capture
from popxl_fx.outline import plan_outline


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))
        self.register_buffer("shift", torch.zeros(4))

    def forward(self, x):
        return self.fc(x) * self.scale + self.shift


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.norm = Inner(), nn.LayerNorm(4)

    def forward(self, x):
        # math.sqrt of a traced value is autowrapped by fx (its `_autowrap_check`)
        root = math.sqrt(self.inner.scale.detach().sum())
        return self.norm(self.inner(x)) / math.sqrt(x.shape[-1]) + root


def _module_patches(monkeypatch) -> list:
    """The patches of `nn.Module`'s methods torch.fx makes from now on."""
    made: list = []
    patch = fx_trace._PatchedFnSetAttr.patch

    def counted(self):
        if self.frame_dict is nn.Module:
            made.append(self.fn_name)
        patch(self)

    monkeypatch.setattr(fx_trace._PatchedFnSetAttr, "patch", counted)
    return made


def _traces(monkeypatch) -> list:
    """The `CaptureTracer` traces run from now on."""
    run: list = []
    trace = CaptureTracer.trace

    def counted(self, *args, **kwargs):
        run.append(self)
        return trace(self, *args, **kwargs)

    monkeypatch.setattr(CaptureTracer, "trace", counted)
    return run


_SCALES = [2.0]  # a global list forward reads: `check` traces the model a second time


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))

    def forward(self, x):
        return self.fc(x) * _SCALES[0]


def test_a_lowering_traces_without_patching_nn_module_per_trace(monkeypatch):
    patches, traces = _module_patches(monkeypatch), _traces(monkeypatch)
    torch.manual_seed(0)
    model = Scaled()
    trainer = popxl_fx.training_model(
        model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy
    )
    trainer(torch.randn(2, 4), torch.tensor([0, 2]))
    assert len(traces) >= 2  # the capture and check's second trace at least
    assert patches == []  # fx patched nn.Module for none of them
    assert nn.Module.__dict__["__call__"] is fx_trace._orig_module_call  # put back
    assert nn.Module.__dict__["__getattr__"] is fx_trace._orig_module_getattr


@pytest.mark.parametrize("leaf", [False, True])
def test_a_trace_through_the_kept_patches_is_fxs_own(leaf):
    class Tracer(fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return (leaf and isinstance(m, Inner)) or super().is_leaf_module(m, qualname)

    model = Outer()
    plain = Tracer().trace(model)
    with trace_patch.kept_patches():
        kept = [trace_patch.trace(Tracer(), model) for _ in range(2)]
    assert [str(g) for g in kept] == [str(plain)] * 2
    assert ("call_module", "inner") in {(n.op, n.target) for n in plain.nodes} if leaf else True
    assert any(n.target is math.sqrt for n in plain.nodes)


def test_the_window_leaves_eager_calls_and_nn_module_as_they_were():
    model, x = Outer(), torch.randn(2, 4)
    expected = model(x)
    with pytest.raises(RuntimeError, match="inside"):
        with trace_patch.kept_patches():
            trace_patch.trace(fx.Tracer(), model)
            assert torch.equal(model(x), expected)  # eager, between traces
            assert model.inner.scale is model.inner._parameters["scale"]
            raise RuntimeError("inside")
    assert nn.Module.__dict__["__call__"] is fx_trace._orig_module_call
    assert nn.Module.__dict__["__getattr__"] is fx_trace._orig_module_getattr


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Inner(), Inner()

    def forward(self, x):
        return self.second(self.first(x))


def test_an_outline_plan_and_a_check_outside_a_lowering_patch_nn_module_once(monkeypatch):
    patches, traces = _module_patches(monkeypatch), _traces(monkeypatch)
    x = torch.randn(2, 4)
    plan = plan_outline(Twice(), "auto", (x,))
    assert [g.paths for g in plan.groups] == [["first", "second"]]
    assert popxl_fx.check(Scaled(), x).ok
    assert len(traces) >= 5  # the leaf trace, each site's capture, check's two traces
    assert patches == []
    assert nn.Module.__dict__["__call__"] is fx_trace._orig_module_call
    assert nn.Module.__dict__["__getattr__"] is fx_trace._orig_module_getattr


_SQRTS: list = []  # what forward's ``math.sqrt`` was in each trace


class Rooted(nn.Module):
    def forward(self, x):
        _SQRTS.append(math.sqrt)  # fx's wrapper of it while tracing
        return x * math.sqrt(x.shape[-1]) + math.sqrt(x.detach().abs().sum())


def test_fx_wraps_a_builtin_function_once_for_every_trace():
    _SQRTS.clear()
    sqrt = math.sqrt
    graphs = [capture(Rooted(), (torch.randn(2, 4),)).gm for _ in range(2)]
    assert len(_SQRTS) == 2 and _SQRTS[0] is _SQRTS[1] and _SQRTS[0] is not sqrt
    assert math.sqrt is sqrt  # put back
    assert [[n.target for n in g.graph.nodes if n.target is sqrt] for g in graphs] == [[sqrt]] * 2
