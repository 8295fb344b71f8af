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
from ._common import const, norm_dim
from .aten_kernels import eager_stride, torch_call, torch_kernel_in_eager_layout

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


# eager function (out of place) -> its lowering on the simulator's contiguous values
_FUNCTIONS: dict[tuple, Callable] = {
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


def _activation(ctx, module: bool, eager: Callable, fn: Callable, x, *args, **kwargs):
    """``fn`` on the simulator's values, or eager's own ``eager`` on eager's layout where eager
    applied it to a strided view (`torch_kernel_in_eager_layout`: the rounding of gelu, silu,
    sigmoid, ... depends on the layout), forward and backward. Under ``Options(numerics="ipu")``
    the PopXL op: the IPU's numbers do not depend on the layout."""
    if _eager_numerics() and _own_call(ctx, module, fn) and eager_stride(ctx.node.args[0]):
        return torch_kernel_in_eager_layout(ctx, eager, x, *args, **kwargs)
    return fn(x, *args, **kwargs)


def _eager_numerics() -> bool:
    return popxl.gcg().ir.numerics == "torch"


def _own_call(ctx, module: bool, fn: Callable) -> bool:
    """Whether ``ctx.node`` is this activation's own call (its first argument ``x``): a layer's
    lowering (TransformerEncoderLayer's) lowers its activation, module or function, under the
    layer's node."""
    node = ctx.node
    if module:
        own = node.op == "call_module" and node.target == ctx.module_path
    else:
        own = node.op != "call_module" and _LOWERING_OF.get(node.target) is fn
    return own and bool(node.args)


def _function_lowering(eager: Callable, fn: Callable) -> Callable:
    """A function's lowering; torch's ``inplace`` flag is accepted (the driver applies it)."""

    def lower(ctx, x, *args, inplace=False, **kwargs):
        return _activation(ctx, False, eager, fn, x, *args, **kwargs)

    return lower


for _targets, _fn in _FUNCTIONS.items():
    lowers(*_targets)(_function_lowering(_targets[0], _fn))


# leaf modules: each is its function with the module's hyper-parameters ----------------------
_MODULES: dict = {
    nn.ReLU: (F.relu, ()),
    nn.ReLU6: (F.relu6, ()),
    nn.LeakyReLU: (F.leaky_relu, ("negative_slope",)),
    nn.ELU: (F.elu, ("alpha",)),
    nn.SELU: (F.selu, ()),
    nn.CELU: (F.celu, ("alpha",)),
    nn.GELU: (F.gelu, ("approximate",)),
    nn.SiLU: (F.silu, ()),
    nn.Mish: (F.mish, ()),
    nn.Hardswish: (F.hardswish, ()),
    nn.Hardsigmoid: (F.hardsigmoid, ()),
    nn.Hardtanh: (F.hardtanh, ("min_val", "max_val")),
    nn.Sigmoid: (torch.sigmoid, ()),
    nn.Tanh: (torch.tanh, ()),
    nn.Softplus: (F.softplus, ("beta", "threshold")),
    nn.Softsign: (F.softsign, ()),
    nn.LogSigmoid: (F.logsigmoid, ()),
    nn.GLU: (F.glu, ("dim",)),
}
_LOWERING_OF = {t: fn for targets, fn in _FUNCTIONS.items() for t in targets}


def _module_lowering(eager: Callable, attrs: tuple) -> Callable:
    def lower(ctx, module, x):
        kwargs = {a: getattr(module, a) for a in attrs}
        return _activation(ctx, True, eager, _LOWERING_OF[eager], x, **kwargs)

    return lower


for _cls, (_eager, _attrs) in _MODULES.items():
    lowers(_cls)(_module_lowering(_eager, _attrs))


@lowers(nn.PReLU)
def _prelu_module(ctx, module, x):
    return _prelu(x, ctx.param("weight"))
