"""Mixture-of-experts kernels (HF transformers' default expert path on CPU): ``torch.histc``
(tokens per expert) and ``torch._grouped_mm`` / ``F.grouped_mm`` (each expert's rows times its
weight), both torch's own kernels so the numbers are eager's.

``_grouped_mm(a, b, offs=offs)`` with ``a`` (S, K) and ``b`` (G, K, N): rows
``offs[g-1] <= i < offs[g]`` of ``a`` are multiplied by ``b[g]`` (``offs`` holds cumulative
row counts, torch's ``grouped_mm`` docs). The group sizes are data but every shape is static,
so the program stays static; autograd's backward of the same kernel gives the gradients of
``a`` and ``b``. HF passes ``weight.transpose(-2, -1)``: the kernel sees eager's transposed
view (`lowering_in_eager_layout`), as a matrix product's rounding follows its operands' layout.

``histc`` has no gradient in torch (its input is the sorted expert ids): forward only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ..lowering import lowers
from .aten_kernels import lower_with_torch_kernel, lowering_in_eager_layout

__all__ = ["GroupedMM"]

lowers(torch.histc, "histc")(lower_with_torch_kernel)


@dataclass(frozen=True)
class GroupedMM:
    """``torch._grouped_mm`` with a shape rule that holds on CPU: torch's meta function
    checks CUDA's dtype rule (bfloat16 only) and refuses the float32 operands that the CPU
    kernel, and so eager, takes. On fake tensors (the Aten op's shape rule) the result is a
    product of the same shape, dtype and differentiability; on real ones, torch's kernel."""

    def __call__(self, a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if isinstance(a, FakeTensor) and b.dim() == 3:
            # (S, K) x (G, K, N) -> (S, N); (G, M, K) x (G, K, N) -> (G, M, N)
            return a @ b[0] if a.dim() == 2 else a @ b
        return torch._grouped_mm(a, b, *args, **kwargs)

    def __str__(self) -> str:
        return "torch._grouped_mm"


_GROUPED = [torch._grouped_mm] + ([F.grouped_mm] if hasattr(F, "grouped_mm") else [])
lowers(*_GROUPED)(lowering_in_eager_layout(GroupedMM()))
