"""Math ops PopTorch programs use that the core tables lack: ``erfc``, ``median``,
``bucketize``, ``index_reduce`` and ``bincount`` (PopTorch's static-length form).

All but ``bincount`` are torch's own kernels (forward and gradient), so they are eager's
numbers bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedError
from ..lowering import LoweringContext, lowers, unsupported
from .aten_kernels import lower_with_torch_kernel, torch_call

__all__ = ["static_bincount"]

aten = torch.ops.aten

lowers(aten.erfc, aten.median, aten.bucketize, aten.index_reduce)(lower_with_torch_kernel)

# PopTorch's words: an IPU program has static shapes, so the bins are those of `minlength`
BINCOUNT_NEEDS_MINLENGTH = (
    "Bincount `minlength` must be specified and must be a constant. On the IPU MK2 platform "
    "the minimum length is also the maximum length"
)


def static_bincount(x: torch.Tensor, weights: Any, minlength: int) -> torch.Tensor:
    """``torch.bincount(x, weights, minlength)`` with exactly ``minlength`` bins: values
    beyond the last bin are dropped, as on the IPU. The bins are summed in input order with
    ``scatter_add``, as torch's own kernel adds them, so weighted counts round as eager's."""
    keep = x < minlength
    index = torch.where(keep, x, 0)
    if weights is None:
        values = keep.to(torch.int64)
    else:
        values = torch.where(keep, weights, torch.zeros((), dtype=weights.dtype))
    return torch.zeros(minlength, dtype=values.dtype).scatter_add(0, index, values)


@lowers(torch.bincount, "bincount")
def _bincount(ctx: LoweringContext, x: Any, weights: Any = None, minlength: int = 0) -> Any:
    if not isinstance(minlength, int) or minlength <= 0:
        issue = unsupported(ctx.node, "torch.bincount", hint=BINCOUNT_NEEDS_MINLENGTH + ".")
        raise UnsupportedError(type(ctx.owner.torch_module).__name__, [issue])
    return torch_call(static_bincount, x, weights, minlength)
