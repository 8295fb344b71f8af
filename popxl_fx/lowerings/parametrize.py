"""Parametrizations (``torch.nn.utils.parametrizations``): a parametrized module is traced
through (`capture.is_leaf`), so its ``weight`` is computed in the graph from the original
parameters by the parametrization module, and the gradient reaches the originals.

``weight_norm``'s parametrization runs torch's own ``_weight_norm`` (forward and gradient):
eager's fused kernel, where a decomposition into norms and divisions rounds differently.
``spectral_norm``'s runs its power iteration in training (buffers ``_u``, ``_v`` updated, as
eager updates them in place) and divides the weight by the estimated norm, each with torch's
own ops on eager's layouts (a decomposition lost the buffer updates: a silent wrong number).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.parametrizations import _SpectralNorm, _WeightNorm

from popxl_core import ops

from ..lowering import lowers
from .aten_kernels import lower_torch_function, torch_call

__all__ = ["PowerMethod", "SpectralNormalised"]


@lowers(_WeightNorm)
def _weight_norm(ctx, module, weight_g, weight_v):
    return torch_call(torch._weight_norm, weight_v, weight_g, module.dim)


# the legacy hook-based torch.nn.utils.weight_norm calls it from its forward pre-hook
lowers(torch._weight_norm)(lower_torch_function)


def _as_matrix(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """spectral_norm's view of the weight as a matrix: ``dim`` first, the rest flattened."""
    if dim != 0:
        weight = weight.permute(dim, *(d for d in range(weight.dim()) if d != dim))
    return weight.flatten(1)


@dataclass(frozen=True)
class PowerMethod:
    """``n`` power iterations from ``(u, v)`` on the weight, as spectral_norm runs them in
    training (no gradient; ``W.H`` a transposed view, as in eager's ``mv``)."""

    dim: int
    n: int
    eps: float

    def __call__(self, weight, u, v):
        with torch.no_grad():
            w = _as_matrix(weight, self.dim)
            for _ in range(self.n):
                u = F.normalize(torch.mv(w, v), dim=0, eps=self.eps)
                v = F.normalize(torch.mv(w.H, u), dim=0, eps=self.eps)
        return u, v


@dataclass(frozen=True)
class SpectralNormalised:
    """The weight divided by its spectral norm estimated from ``(u, v)``."""

    dim: int

    def __call__(self, weight, u, v):
        return weight / torch.vdot(u, torch.mv(_as_matrix(weight, self.dim), v))


@lowers(_SpectralNorm)
def _spectral_norm(ctx, module, weight):
    if weight.rank == 1:
        return torch_call(F.normalize, weight, dim=0, eps=module.eps)
    u, v = ctx.buffer("_u"), ctx.buffer("_v")
    if ctx.training:
        # the iteration updates the buffers in place, under no_grad: the next step starts
        # from them, as eager's next call does
        step = PowerMethod(module.dim, module.n_power_iterations, module.eps)
        u, v = torch_call(step, ops.detach(weight), u, v)
        ctx.update_buffer("_u", u)
        ctx.update_buffer("_v", v)
    return torch_call(SpectralNormalised(module.dim), weight, ops.detach(u), ops.detach(v))
