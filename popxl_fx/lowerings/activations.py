"""Activations, as functions (torch.*, F.*, tensor methods) and as leaf modules (nn.ReLU, ...).

Composites are written so that neither branch of a `where` can overflow (exp of a clamped
argument): autodiff differentiates both branches, and 0 * inf would be NaN.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const, is_t, norm_dim
from .aten_kernels import EagerLayout, Method, eager_stride, torch_call

__all__ = ["softplus"]

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _relu(x):
    return ops.relu(x)


def _leaky_relu(x, negative_slope=0.01):
    return ops.where(ops.greater(x, const(0.0, x.dtype)), x, x * float(negative_slope))


def _elu(x, alpha=1.0):
    neg = (ops.exp(ops.clip(x, max=0.0)) - 1.0) * float(alpha)
    return ops.where(ops.greater(x, const(0.0, x.dtype)), x, neg)


# selu, softplus, mish, softsign, logsigmoid, glu: torch's own kernels forward and backward
# (compositions of PopXL ops round differently: tests/test_fx_core_aten.py's OpInfo scan)
def _selu(x):
    return torch_call(F.selu, x)


def _celu(x, alpha=1.0):
    neg = (ops.exp(ops.clip(x, max=0.0) * (1.0 / alpha)) - 1.0) * float(alpha)
    return ops.where(ops.greater(x, const(0.0, x.dtype)), x, neg)


def _gelu(x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return ops.gelu(x) if approximate == "tanh" else ops.geluerf(x)


def softplus(x: popxl.Tensor, beta: float = 1.0, threshold: float = 20.0) -> popxl.Tensor:
    """torch's softplus: log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""
    return torch_call(F.softplus, x, float(beta), float(threshold))


def _mish(x):
    return torch_call(F.mish, x)


def _hardtanh(x, min_val=-1.0, max_val=1.0):
    """Clamp whose gradient, like torch's hardtanh (and relu6), is zero at the bounds
    themselves (ops.clip, like torch.clamp, passes it there)."""
    lo, hi = float(min_val), float(max_val)
    inside = ops.logical_and(ops.greater(x, const(lo, x.dtype)), ops.less(x, const(hi, x.dtype)))
    return ops.where(inside, x, ops.detach(ops.clip(x, lo, hi)))


def _relu6(x):
    return _hardtanh(x, 0.0, 6.0)


def _hardsigmoid(x):
    return ops.hardsigmoid(x)


def _hardswish(x):
    return ops.hardswish(x)


def _softsign(x):
    return torch_call(F.softsign, x)


def _logsigmoid(x):
    return torch_call(F.logsigmoid, x)


def _glu(x, dim=-1):
    d = norm_dim(dim, x.rank)
    if x.shape[d] % 2:
        raise ValueError(f"glu: dim {dim} of {tuple(x.shape)} must have an even size")
    return torch_call(F.glu, x, d)


def _prelu(x, weight):
    w = weight
    if x.rank >= 2 and weight.nelms > 1:
        w = ops.reshape(weight, (weight.nelms,) + (1,) * (x.rank - 2))
    elif weight.nelms == 1:
        w = ops.reshape(weight, ())
    return ops.where(ops.greater(x, const(0.0, x.dtype)), x, x * w)


def _silu(x):
    return ops.swish(x)


def _no_inplace(fn: Callable) -> Callable:
    """A function lowering that accepts (and ignores) torch's ``inplace`` flag."""

    def lower(ctx, x, *args, inplace=False, **kwargs):
        return fn(x, *args, **kwargs)

    return lower


_FUNCTIONS = {
    (torch.relu, F.relu, "relu", "relu_", torch.relu_, F.relu_): _relu,
    (F.relu6,): _relu6,
    (F.leaky_relu,): _leaky_relu,
    (F.elu,): _elu,
    (F.selu, torch.selu): _selu,
    (F.celu, torch.celu): _celu,
    (F.gelu,): _gelu,
    (F.silu,): _silu,
    (F.mish,): _mish,
    (F.hardswish,): _hardswish,
    (F.hardsigmoid,): _hardsigmoid,
    (F.hardtanh,): _hardtanh,
    (torch.sigmoid, F.sigmoid, "sigmoid"): ops.sigmoid,
    (torch.tanh, F.tanh, "tanh"): ops.tanh,
    (F.softplus,): softplus,
    (F.softsign,): _softsign,
    (F.logsigmoid,): _logsigmoid,
    (F.glu,): _glu,
    (F.prelu, torch.prelu, "prelu"): _prelu,
}
# transcendental: torch's CPU loop rounds its vectorised body and its scalar tail differently,
# and which elements fall in the tail depends on the layout: on a strided view in eager
# (Qwen2-MoE's act(gate) of gate_up.chunk(2, -1)) the function runs on eager's layout
_LAYOUT_SENSITIVE = frozenset(
    {_elu, _selu, _celu, _gelu, _silu, _mish, softplus, _softsign, _logsigmoid}
    | {ops.sigmoid, ops.tanh}
)


def _in_eager_layout(lower: Callable) -> Callable:
    """``lower``, or torch's own function on eager's layout where the input was a strided
    view in eager (`EagerLayout`)."""

    def lowering(ctx, x, *args, inplace=False, **kwargs):
        stride = eager_stride(ctx.node.args[0]) if ctx.node.args else None
        if stride is None or not is_t(x):
            return lower(ctx, x, *args, **kwargs)
        target = ctx.node.target
        fn = Method(target) if isinstance(target, str) else target
        return torch_call(EagerLayout(fn, (stride,)), x, *args, **kwargs)

    return lowering


for _targets, _fn in _FUNCTIONS.items():
    _lower = _no_inplace(_fn)
    lowers(*_targets)(_in_eager_layout(_lower) if _fn in _LAYOUT_SENSITIVE else _lower)


# leaf modules: each reads its hyper-parameters from the torch module -----------------------
_MODULES: dict = {
    nn.ReLU: lambda m, x: _relu(x),
    nn.ReLU6: lambda m, x: _relu6(x),
    nn.LeakyReLU: lambda m, x: _leaky_relu(x, m.negative_slope),
    nn.ELU: lambda m, x: _elu(x, m.alpha),
    nn.SELU: lambda m, x: _selu(x),
    nn.CELU: lambda m, x: _celu(x, m.alpha),
    nn.GELU: lambda m, x: _gelu(x, m.approximate),
    nn.SiLU: lambda m, x: _silu(x),
    nn.Mish: lambda m, x: _mish(x),
    nn.Hardswish: lambda m, x: _hardswish(x),
    nn.Hardsigmoid: lambda m, x: _hardsigmoid(x),
    nn.Hardtanh: lambda m, x: _hardtanh(x, m.min_val, m.max_val),
    nn.Sigmoid: lambda m, x: ops.sigmoid(x),
    nn.Tanh: lambda m, x: ops.tanh(x),
    nn.Softplus: lambda m, x: softplus(x, m.beta, m.threshold),
    nn.Softsign: lambda m, x: _softsign(x),
    nn.LogSigmoid: lambda m, x: _logsigmoid(x),
    nn.GLU: lambda m, x: _glu(x, m.dim),
}


def _module_lowering(fn: Callable) -> Callable:
    def lower(ctx, module, x):
        return fn(module, x)

    return lower


for _cls, _fn in _MODULES.items():
    lowers(_cls)(_module_lowering(_fn))


@lowers(nn.PReLU)
def _prelu_module(ctx, module, x):
    return _prelu(x, ctx.param("weight"))
