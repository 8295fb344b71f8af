"""RReLU's ATen op in evaluation: no randomness, torch's leaky ReLU with the mean slope.

``nn.RReLU`` / ``F.rrelu`` called by a model are lowered whole (`nn_layers`, training
included). This is their ATen op, ``rrelu_with_noise``, met when an unlowered function
decomposes to it: torch's kernel computes it as ``leaky_relu(x, (lower + upper) / 2)`` when not
training, and here that is torch's own kernel, so the numbers and the gradient are eager's.
The ATen op in training draws a slope per element and is reported as a random op.
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
