"""Lowerings of optional packages' functions (torchvision's stochastic depth) are registered
when a graph first calls the function, so ``import popxl_fx`` does not import torchvision
itself; the registration must find the function fx records as the node's target even though,
while torch.fx traces, the package's global is torch.fx's patched wrapper of it.

That ``import popxl_fx`` leaves torchvision out is a new interpreter's question: each process
of tests/test_distributed.py's job answers it (`test_import_popxl_fx_does_not_import_
torchvision` there). The registration on first use runs here, with the registered lowering
taken out of the table for the test (as before a first use) and put back after it."""

from __future__ import annotations

import functools

import pytest
import torch

import popxl_core as popxl
import popxl_fx.fallback
from popxl_fx import lowering
from popxl_fx.module import Module


@pytest.fixture
def first_use(monkeypatch):
    """torchvision's stochastic_depth as before its first use: pending, not in the table; and
    no ATen fallback (a lowering that fell back would pass unnoticed)."""
    sd_module = pytest.importorskip("torchvision.ops.stochastic_depth")
    original = sd_module.stochastic_depth
    assert (original.__module__, original.__name__) in lowering._PENDING
    monkeypatch.delitem(lowering.LOWERINGS, original, raising=False)

    def no_fallback(node, *args, **kwargs):
        raise AssertionError(f"{node.format_node()} needed the ATen fallback")

    monkeypatch.setattr(popxl_fx.fallback, "lower_by_decomposition", no_fallback)
    return sd_module, original


def test_torchvision_lowering_registers_on_first_use_during_tracing(first_use, monkeypatch):
    sd_module, original = first_use
    # the first lookup happens mid-trace, where torch.fx has patched the module's global
    with monkeypatch.context() as patched:
        wrapper = functools.wraps(original)(lambda *a, **k: original(*a, **k))
        patched.setattr(sd_module, "stochastic_depth", wrapper)
        assert lowering.lookup(original) is not None, "the node's target has no lowering"
    assert sd_module.stochastic_depth is original


def test_torchvision_stochastic_depth_traces_in_a_child_module(first_use):
    import torchvision

    class Block(torch.nn.Module):  # a child module: the table is first consulted mid-trace
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)
            # its forward calls the module global torchvision wraps for torch.fx (a call of
            # torchvision.ops.stochastic_depth from user code is traced through instead)
            self.drop = torchvision.ops.StochasticDepth(0.25, "row")

        def forward(self, x):
            return self.drop(self.fc(x))

    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = Module(Block()).create_graph(popxl.TensorSpec((4, 3), popxl.float32))
    assert graph.graph.outputs[0].shape == (4, 3)
