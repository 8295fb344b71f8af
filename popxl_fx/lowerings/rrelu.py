"""RReLU's ATen op in evaluation: no randomness, torch's leaky ReLU with the mean slope.

``nn.RReLU`` / ``F.rrelu`` decompose to ``rrelu_with_noise``, which torch's kernel computes as
``leaky_relu(x, (lower + upper) / 2)`` when not training; here that is torch's own kernel, so
the numbers and the gradient are eager's. Training draws a slope per element and stays
unsupported (reported as a random op).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..lowering import LoweringContext, lowers
from .aten_kernels import torch_call

__all__: list = []

aten = torch.ops.aten


@lowers(aten.rrelu_with_noise, aten.rrelu_with_noise_functional)
def _rrelu_with_noise(
    ctx: LoweringContext, x, noise, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None
):
    if training:
        raise NotImplementedError(
            f"RReLU in training (fx node '{ctx.node.name}') draws a random slope per element, "
            "which the simulator does not implement; call model.eval() or use nn.LeakyReLU."
        )
    out = torch_call(F.leaky_relu, x, (float(lower) + float(upper)) / 2)
    functional = (
        getattr(ctx.node.target, "overloadpacket", None) is aten.rrelu_with_noise_functional
    )
    return (out, noise) if functional else out
