"""Attention that hands its log-sum-exp to its gradient: ScaledDotProductFlashAttention and
ScaledDotProductFlashAttentionGrad, eager PyTorch's own CPU pair
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward).

``ScaledDotProductAttention``'s gradient op recomputes the forward under autograd, so a
training step runs every attention twice plus autograd's bookkeeping; eager autograd keeps
the output and the row log-sum-exp of its one forward and runs the flash backward on them.
popxl_fx lowers ``F.scaled_dot_product_attention`` without a mask, dropout or grouped heads to
this pair (float32): the forward outputs ``(out, logsumexp)`` and the gradient op reads both.

Which kernel eager runs is torch's choice at run time (``torch._fused_sdp_choice``: shapes,
strides, the backends a user switched off); both kernels ask it the same way. Where torch
picks its flash kernel they call the flash pair itself, as eager's ``F.scaled_dot_product_
attention`` and its autograd node do; otherwise the forward runs ``F.scaled_dot_product_
attention`` (the log-sum-exp output then unused) and the gradient recomputes it under autograd
as ``ScaledDotProductAttentionGrad`` does. Either way the same calls as eager: the same bits.
Where nothing reads the log-sum-exp (inference), the forward is eager's inference call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from .. import dtypes
from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import rand, spec
from .attention import SDPA_GRAD, _attrs, _cost, _infer
from .forms import fold_rows
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["flash_attention", "flash_attention_applies"]

_aten = torch.ops.aten
_FLASH = int(SDPBackend.FLASH_ATTENTION.value)


def flash_attention_applies(q: Tensor, k: Tensor, v: Tensor, mask, dropout_p, gqa) -> bool:
    """Whether the pair can stand for ``F.scaled_dot_product_attention`` here: float32 q, k,
    v of rank 4 with the same batch and heads and one head size (what torch's flash kernel
    takes), no mask, no dropout, no grouped heads."""
    ranks = all(len(t.shape) == 4 for t in (q, k, v))
    f32 = all(t.dtype is dtypes.float32 for t in (q, k, v))
    same = ranks and q.shape[:2] == k.shape[:2] == v.shape[:2] and q.shape[-1] == v.shape[-1]
    return same and f32 and mask is None and not dropout_p and not gqa


def _torch_picks_flash(q, k, v, is_causal, scale) -> bool:
    """torch's own choice, as eager makes it. Under torch.compile (``kernels="inductor"``, not
    bitwise) the choice cannot be traced (a graph break per call): the flash pair, which
    computes the same attention for every input `flash_attention_applies` admits."""
    if torch.compiler.is_compiling():
        return True
    return torch._fused_sdp_choice(q, k, v, None, 0.0, is_causal, scale=scale) == _FLASH


def _infer_flash(ins, is_causal, scale):
    (out,) = _infer(ins, is_causal, scale, False, False, False, 0.0)
    return [out, spec(ins[0].shape[:-1], dtypes.float32)]


def _kernel(q, k, v, is_causal, scale):
    if _torch_picks_flash(q, k, v, is_causal, scale):
        return _aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, scale=scale
        )
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    return out, q.new_empty(q.shape[:-1])  # torch runs its math kernel: no statistic


def _out_only(q, k, v, is_causal, scale):
    """The log-sum-exp is dead: eager's inference call, the same output."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale), None


def _grad_infer(ins, **_):
    return list(ins[1:4])


def _grad_kernel(g, q, k, v, out, lse, is_causal, scale):
    if _torch_picks_flash(q, k, v, is_causal, scale):
        return _aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, out, lse, 0.0, is_causal, scale=scale
        )
    return SDPA_GRAD.kernel(g, q, k, v, **_attrs(is_causal, scale))


def _grad_cost(ins, outs, attrs) -> Cost:
    fwd = _cost(ins[1:4], ins[:1], attrs)  # twice the forward's work, no recomputation
    return Cost(2 * fwd.flops, sum(t.nbytes for t in (*ins, *outs)))


def _grad(ctx):
    ins = [ctx.grad_output(0), *(ctx.input(i) for i in range(3)), ctx.output(0), ctx.output(1)]
    return list(create_op(FLASH_GRAD, ins, dict(ctx.attrs)))


_CASES = [  # q, k, v shapes (B, H, L|S, D), is_causal, scale
    ((2, 3, 4, 8), (2, 3, 4, 8), True, None),
    ((2, 3, 4, 8), (2, 3, 5, 8), False, 0.3),
]


def _qkv(i, qs, ks):
    seed = 870 + 10 * i
    return [rand(*qs, seed=seed), rand(*ks, seed=seed + 1), rand(*ks, seed=seed + 2)]


def _samples():
    """Bitwise against eager F.scaled_dot_product_attention: the forward and, through the
    table's gradient check, the gradient eager's autograd computes."""
    out = []
    for i, (qs, ks, causal, scale) in enumerate(_CASES):

        def build(q, k, v, causal=causal, scale=scale):
            return flash_attention(q, k, v, causal, scale)

        def ref(q, k, v, causal=causal, scale=scale):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

        out.append(Sample(_qkv(i, qs, ks), build, ref, rtol=0.0, atol=0.0, name=f"case{i}"))
    return out


def _grad_samples():
    out = []
    for i, (qs, ks, causal, scale) in enumerate(_CASES):
        attrs = {"is_causal": causal, "scale": scale}
        g = rand(*qs[:-1], ks[-1], seed=880 + i)

        def build(g, q, k, v, attrs=attrs):
            y, lse = create_op(FLASH, [q, k, v], attrs)
            return tuple(create_op(FLASH_GRAD, [g, q, k, v, y, lse], attrs))

        def ref(g, q, k, v, causal=causal, scale=scale):  # eager autograd
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            with torch.enable_grad():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
                return torch.autograd.grad(y, (q, k, v), g)

        inputs = [g, *_qkv(i, qs, ks)]
        out.append(Sample(inputs, build, ref, grad=False, rtol=0.0, atol=0.0, name=f"case{i}"))
    return out


FLASH = register(
    OpDef(
        "ScaledDotProductFlashAttention",
        _infer_flash,
        _kernel,
        grad=_grad,
        cost=lambda ins, outs, attrs: _cost(ins, outs[:1], attrs),
        samples=_samples,
        out_name="flash_attention_out",
    )
)
declare(FLASH, dead_output_kernels={frozenset({1}): _out_only}, replica_fold=fold_rows(0, 1, 2))
FLASH_GRAD = register(
    OpDef(
        "ScaledDotProductFlashAttentionGrad",
        _grad_infer,
        _grad_kernel,
        cost=_grad_cost,
        samples=_grad_samples,
        out_name="flash_attention_grad_out",
    )
)
declare(FLASH_GRAD, replica_fold=fold_rows(0, 1, 2, 3, 4, 5))


def flash_attention(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, scale: float | None = None
) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=, scale=)`` (float32, rank 4, no
    mask, dropout or grouped heads) as ScaledDotProductFlashAttention; returns the output (the
    log-sum-exp is the op's second output, read by its gradient)."""
    if not flash_attention_applies(q, k, v, None, 0.0, False):
        raise ValueError(
            f"flash_attention: q {q.shape} {q.dtype.name}, k {k.shape}, v {v.shape}: it takes "
            "float32 tensors of rank 4; use ops.scaled_dot_product_attention."
        )
    attrs = {"is_causal": bool(is_causal), "scale": None if scale is None else float(scale)}
    return create_op(FLASH, [q, k, v], attrs)[0]
