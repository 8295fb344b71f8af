"""The torch optimizer a PopTorch training executor hands to `popxl_fx.training_model`.

``poptorch.optim.SGD`` / ``Adam`` / ``AdamW`` subclass torch's; popxl_fx builds torch's
exact optimizers only (a subclass may change the arithmetic), so the executor runs a *view*:
an optimizer of the torch class whose ``param_groups``, ``state`` and ``defaults`` are the
PopTorch optimizer's own objects. A learning rate changed on the PopTorch optimizer (or by a
scheduler) and the state written back after each step are therefore the same objects.

The IPU arguments: loss_scaling is popxl_fx's ``Options.loss_scaling`` for every model (the
backward seeded with it, the gradients divided by it in float32 before the update), so a
``model.half()`` model's small float16 gradients survive. The eager ``step`` is torch's, as
PopTorch's CPU step is: it gets the gradients the user's ``backward`` made, and for a
power-of-two scale with nothing under- or overflowing both give the same bits.
velocity_scaling likewise scales the momentum and divides it back. ``max_grad_norm`` and
AdamW's ``bias_correction`` are read from the shared param groups by popxl_fx
(`popxl_fx.optim_clip`, `popxl_fx.optim_groups.adam_hyper`), RMSprop's ``use_tf_variant`` by
`popxl_fx.optim_rmsprop`; LAMB runs as `popxl_fx.optim_lamb.LAMB`. The momentum dtypes
(``velocity_accum_type``, ``first/second_order_momentum_accum_type``) are the state's storage
dtype (`popxl_fx.optim_storage`); ``accum_type`` is checked by `check_accum_type`.
"""

from __future__ import annotations

import torch

from .. import optim_lamb
from . import optim
from .errors import Error

__all__ = ["check_accum_type", "loss_scaling", "torch_view"]

_BASES = (
    (optim.SGD, torch.optim.SGD),
    (optim.AdamW, torch.optim.AdamW),
    (optim.Adam, torch.optim.Adam),
    (optim.RMSprop, torch.optim.RMSprop),
    (optim.LAMB, optim_lamb.LAMB),
    # subclasses of torch's run as their base class, as PopTorch runs them natively
    (torch.optim.SGD, torch.optim.SGD),
    (torch.optim.AdamW, torch.optim.AdamW),
    (torch.optim.Adam, torch.optim.Adam),
    (torch.optim.RMSprop, torch.optim.RMSprop),
)


def torch_view(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer popxl_fx builds sharing ``optimizer``'s groups and state (itself when
    it is one of torch's own)."""
    if type(optimizer) in {base for _, base in _BASES}:
        return optimizer
    for poptorch_type, base in _BASES:
        if isinstance(optimizer, poptorch_type):
            view = base.__new__(base)
            view.__setstate__(optimizer.__getstate__())
            return view
    return optimizer


def check_accum_type(optimizer: torch.optim.Optimizer, accumulation: int) -> None:
    """``accum_type`` is the dtype of PopART's gradient accumulators, which exist only with
    gradient accumulation; popxl_fx accumulates in float32."""
    dtype = getattr(optimizer, "accum_type", torch.float32)
    if dtype != torch.float32 and accumulation > 1:
        raise Error(
            f"{type(optimizer).__name__}(accum_type={dtype}) with gradientAccumulation("
            f"{accumulation}): popxl_fx's PopTorch layer accumulates gradients in float32 only."
        )


def loss_scaling(optimizer: torch.optim.Optimizer) -> float:
    """The optimizer's loss scale (1 for torch's optimizers); one value for all groups."""
    scales = {float(g.get("loss_scaling", 1.0)) for g in optimizer.param_groups}
    if len(scales) > 1:
        raise Error(
            f"the param groups of {type(optimizer).__name__} have different loss_scaling "
            f"values {sorted(scales)}; the loss is scaled once, so give them one value."
        )
    return scales.pop()
