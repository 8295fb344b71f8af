"""`CaptureTracer.create_arg` takes proxies and plain scalars without torch.fx's chain of type
tests: the graphs are those fx's own ``create_arg`` makes."""

from __future__ import annotations

import enum

import pytest
import torch
import torch.fx as fx
from torch import nn

from popxl_fx.capture import CaptureTracer, trace_module
from popxl_fx.capture_writes import written_node

from .fx_zoo import ZOO


class _FxArgs(CaptureTracer):
    """The tracer as it was: every argument through fx's ``create_arg``."""

    def create_arg(self, a):
        written = written_node(self, a) if isinstance(a, torch.Tensor) else None
        return written if written is not None else fx.Tracer.create_arg(self, a)


class Mode(enum.IntEnum):
    TWO = 2


class Scalars(nn.Module):
    def forward(self, x):
        y = x.transpose(0, 1).reshape(-1) * 2.5 + True
        return y.clamp(min=None, max=3.0).sum(dim=0, dtype=torch.float32) * Mode.TWO


def _graph(tracer_class, model, inputs) -> tuple:
    gm = trace_module(tracer_class(model, inputs), model)
    nodes = [(n.name, n.op, str(n.target), str(n.args), str(n.kwargs)) for n in gm.graph.nodes]
    return gm.code, nodes


@pytest.mark.parametrize("name", ["gpt", "seed_mlp", "small_cnn", "scalars"])
def test_the_graph_is_the_one_fxs_create_arg_makes(name):
    case = ZOO[name]() if name in ZOO else None
    model, inputs = (case.model, case.inputs) if case else (Scalars(), (torch.randn(3, 2),))
    assert _graph(CaptureTracer, model, inputs) == _graph(_FxArgs, model, inputs)
