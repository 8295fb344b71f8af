"""The lowering driver takes its fallback from the caller (the table never imports it): a node
without a lowering goes to the fallback it is given, or is an UnsupportedError without one."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import popxl_core as popxl
from popxl_fx.errors import UnsupportedError
from popxl_fx.lowering import LoweringContext, run_graph


def no_lowering(x):  # a plain python function: the table has no entry for it
    return x + 1


fx.wrap("no_lowering")


class _Net(torch.nn.Module):
    def forward(self, x):
        return no_lowering(x)


class _Owner:
    def __init__(self, module):
        self.torch_module = module


def _lower(fallback):
    gm = fx.symbolic_trace(_Net())
    owner = _Owner(gm)
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable([1.0, 2.0], popxl.float32, name="x")
        return run_graph(
            gm,
            [x],
            lambda n: LoweringContext(owner, n, "", False),
            lambda gm_, target: getattr(gm_, target),
            fallback=fallback,
        )


def test_a_node_without_lowering_goes_to_the_given_fallback():
    seen = []

    def fallback(node, args, kwargs, ctx):
        seen.append((node.target, args, kwargs, ctx.node is node))
        return args[0] * 3

    out = _lower(fallback)
    assert len(seen) == 1 and seen[0][0] is no_lowering and seen[0][3]
    assert out.producer.type == "Mul"


def test_without_a_fallback_the_node_is_unsupported():
    with pytest.raises(UnsupportedError, match="no_lowering"):
        _lower(None)
