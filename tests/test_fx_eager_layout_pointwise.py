"""Pointwise ops of a strided view (a transpose, a slice, a chunk) bit for bit with eager
(tolerance 0), forward and the gradients of a random cotangent: issue 34's follow-up to
`tests/test_fx_eager_layout_views.py` (the activations).

ATen's vectorised loops run over a strided view's rows in memory order and compute each row's
tail with the scalar function, which for exp, log, tanh, sin, erf, pow, ... can round
otherwise than the vectorised one: on the simulator's contiguous copy other elements fall in
the tails. The inputs are 5 x 37 so that the rows have tails.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_core as popxl
from popxl_fx.module import Module
from tests.fx_harness import check_lowering

VIEWS = {
    "transpose": lambda x: x.transpose(0, 1),
    "slice": lambda x: x[:, 1:],
    "chunk": lambda x: x.chunk(2, -1)[1],
}

# op(view, w): w a parameter of the view's last size (broadcast over its rows)
UNARY = {
    "exp": torch.exp,
    "log": torch.log,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
    "tanh": torch.tanh,
    "sin": torch.sin,
    "cos": torch.cos,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "erf": torch.erf,
    "pow_2": lambda t: t.pow(2),
    "pow_half": lambda t: t**0.5,
    "pow_3": lambda t: torch.pow(t, 3),
    "pow_1_7": lambda t: t.pow(1.7),
    "pow_m1_5": lambda t: t**-1.5,
    "pow_self": lambda t: t.pow(t),
    "rpow_scalar": lambda t: 1.3**t,
    "clamp": lambda t: t.clamp(0.5, 2.0),
    "softmax": lambda t: F.softmax(t, -1),
    "softmax_dim0": lambda t: F.softmax(t, 0),
    "log_softmax": lambda t: F.log_softmax(t, -1),
    "log_softmax_dim0": lambda t: F.log_softmax(t, 0),
}
BINARY = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=0.3),
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "rdiv": lambda a, b: b / a,
    "pow_tensor": torch.pow,
    "rpow_tensor": lambda a, b: torch.pow(b, a),
    "where": lambda a, b: torch.where(a > 1.0, a, b),
}


class OnView(nn.Module):
    def __init__(self, op, view, binary: bool) -> None:
        super().__init__()
        self.op, self.view, self.binary = op, view, binary
        n = view(torch.empty(5, 37)).shape[-1]
        gen = torch.Generator().manual_seed(3)
        self.w = nn.Parameter(torch.rand(n, generator=gen) + 0.5)

    def forward(self, x):
        v = self.view(x)
        return self.op(v, self.w) if self.binary else self.op(v)


def _x() -> torch.Tensor:
    # positive (log, sqrt, pow of a fractional exponent), spread over a few binades
    return torch.rand(5, 37, generator=torch.Generator().manual_seed(1)) * 3 + 0.05


def _check(op, view, binary: bool):
    torch.manual_seed(0)
    check_lowering(OnView(op, VIEWS[view], binary), _x(), rtol=0, atol=0, grad=True)


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_of_a_view(name, view):
    _check(UNARY[name], view, False)


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_of_a_view(name, view):
    _check(BINARY[name], view, True)


def _op_types(model: nn.Module, numerics: str) -> list[str]:
    module = Module(model, numerics=numerics)
    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = module.create_graph(popxl.TensorSpec((5, 37), popxl.float32))
    return [op.type for op in graph.graph._ops]


@pytest.mark.parametrize("name", ["pow_self", "add_alpha"])
def test_ipu_numerics_keep_popxl_ops(name):
    """Under ``numerics="ipu"`` the IPU's numbers do not depend on eager's layout: PopXL's ops."""
    table, binary = (UNARY, False) if name in UNARY else (BINARY, True)
    model = OnView(table[name], VIEWS["chunk"], binary)
    assert "Aten" in _op_types(model, "torch")
    assert "Aten" not in _op_types(model, "ipu")
