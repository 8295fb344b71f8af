"""``Options(precision="float16", loss_scaling=S)``: float16 arithmetic, float32 master weights.

The lowering (`pipeline.lower`; training_model and inference_model apply it):

* the model is traced as a float16 copy (``copy.deepcopy(model).half()``): every activation,
  and the arithmetic of every op, is torch's float16 arithmetic for that op;
* each float32 parameter of the user's model is a float32 *master* variable; the forward graph
  casts it to float16 where it is used (once per graph call, i.e. per step or per slice), so
  the gradient autodiff returns for it is the float16 gradient cast to float32
  (`popxl_fx.Module`'s ``master=``);
* buffers (BatchNorm running statistics) live in float16, as in ``model.half()``; the torch
  model's buffers stay float32 and receive the float16 values;
* floating inputs (and a floating target) are rounded to float16 on the host;
* static loss scaling: the backward is seeded with ``S`` in float16 (the gradient of
  ``loss * S``), and the float32 gradients are divided by ``S`` before the optimizer, which
  updates the float32 master weights and keeps its state in float32. ``loss_scaling`` applies
  in float32 precision too (PopTorch scales every model's loss): a ``model.half()`` model's
  float16 gradients are computed scaled and read into float32 before they are divided.

Eager PyTorch doing the same by hand (`half_step_reference` in the tests) is::

    half = copy.deepcopy(model).half()           # refreshed from the masters every step
    loss = loss_fn(half(x.half()), y)             # float16 forward and loss
    (loss * S).backward()                         # float16 backward
    for p, h in zip(model.parameters(), half.parameters()):
        p.grad = h.grad.float() / S               # float32 gradient
    optimizer.step()                              # float32 master weights
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

import popxl_core as popxl
from popxl_core import ops

from .options import Options

__all__ = [
    "FLOAT16_MAX",
    "check_loss_scale",
    "half_copy",
    "half_inputs",
    "loss_seed",
    "narrow_64bit",
    "scaled_seed",
    "stream_values",
    "unscale",
]

FLOAT16_MAX = 65504.0


def half_copy(model: nn.Module) -> nn.Module:
    """The float16 copy of ``model`` that is traced (its values are never used: the program's
    weights come from the float32 master variables)."""
    return copy.deepcopy(model).half()


def half_inputs(inputs: Sequence[object]) -> tuple:
    """Floating tensors rounded to float16, the rest as given."""
    return tuple(
        x.half() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
    )


# The IPU has no 64-bit types (PopTorch's rule, `Options.narrow_64bit`).
_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


def narrow_64bit(inputs: Sequence[object]) -> tuple:
    """int64 and float64 tensors as int32 and float32, the rest as given."""
    return tuple(
        x.to(_NARROW[x.dtype]) if isinstance(x, torch.Tensor) and x.dtype in _NARROW else x
        for x in inputs
    )


def stream_values(options: Options, inputs: Sequence[object]) -> tuple:
    """What the input streams carry: the inputs, floating ones in float16 for a float16
    program (`program.Inputs.feed` rounds the float32 values the user passes), 64-bit ones
    in 32 bits with ``narrow_64bit`` (`Inputs.feed` narrows the values passed likewise)."""
    if options.narrow_64bit:
        inputs = narrow_64bit(inputs)
    return half_inputs(inputs) if options.precision == "float16" else tuple(inputs)


def check_loss_scale(options: Options) -> None:
    """A float16 program seeds its backward with the loss scale in float16: it must fit."""
    if options.precision == "float16":
        _check_fits(float(options.loss_scaling))


def _check_fits(scale: float) -> None:
    if scale > FLOAT16_MAX:
        raise ValueError(
            f"Options(loss_scaling={scale:g}) is larger than float16 can hold ({FLOAT16_MAX:g}); "
            "use a smaller loss scale (a power of two such as 1024 keeps the unscaling exact)."
        )


def scaled_seed(scale: float, dtype: popxl.dtype) -> popxl.Tensor:
    """The backward's seed ``scale`` (d(loss * scale)/d(loss)) in the loss's ``dtype``; a
    float16 loss (``precision="float16"`` or a ``model.half()`` model) must hold it."""
    if dtype == popxl.float16:
        _check_fits(float(scale))
    return popxl.constant(float(scale), dtype, "loss_grad")


def loss_seed(loss: popxl.Tensor, options: Options) -> popxl.Tensor:
    """The backward's seed: d(loss * loss_scaling)/d(loss), in the loss's dtype."""
    return scaled_seed(options.loss_scaling, loss.dtype)


def unscale(grad: popxl.Tensor, options: Options) -> popxl.Tensor:
    """A gradient of the scaled loss, divided by the loss scale in float32 (PopTorch folds
    ``1 / loss_scaling`` into its float32 update, so a float16 gradient is read into float32
    first: dividing it in float16 would underflow again what scaling kept)."""
    if options.loss_scaling == 1.0:
        return grad
    if grad.dtype == popxl.float16:
        grad = ops.cast(grad, popxl.float32)
    return ops.div(grad, popxl.constant(float(options.loss_scaling), grad.dtype, "loss_scale"))
