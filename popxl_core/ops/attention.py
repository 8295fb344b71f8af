"""``flash_attention``: softmax(q k^T * scale) v with the CPU kernel eager torch's
``F.scaled_dot_product_attention`` dispatches to (``_scaled_dot_product_flash_attention_for_cpu``,
a blocked online softmax), and its backward kernel as the gradient op.

A matmul-softmax-matmul composite rounds differently from that kernel, so models whose
attention eager runs on this backend (``torch._fused_sdp_choice`` on CPU, no dropout) use this
op to match eager bit for bit. The forward's second output, the per-row log-sum-exp, is what
the backward kernel reads instead of the attention weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tensor import Tensor
from ._utils import rand, same_dtype, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["flash_attention"]

_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _infer(ins, is_causal, scale):
    q, k, v = ins
    same_dtype(q, k, v)
    if not q.dtype.is_floating_point:
        raise TypeError(f"attention needs floating point tensors, got {q.dtype.name}")
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4 or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} must be (N, H, L|S, D)")
    if q.shape[:2] != k.shape[:2] or v.shape[:2] != q.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: batch, heads or D differ")
    n, h, length, _ = q.shape
    return [spec((n, h, length, v.shape[3]), q.dtype), spec((n, h, length), q.dtype)]


def _kernel(q, k, v, is_causal, scale):
    return tuple(_FWD(q, k, v, 0.0, is_causal, scale=scale))


def _grad_infer(ins, is_causal, scale):
    return [ins[1], ins[2], ins[3]]


def _grad_kernel(g, q, k, v, out, lse, is_causal, scale):
    return tuple(_BWD(g, q, k, v, out, lse, 0.0, is_causal, scale=scale))


def _cost(ins, outs, attrs) -> Cost:
    q, k, v = ins
    n, h, length, d = q.shape
    s = k.shape[2]
    flops = 2 * n * h * length * s * (d + v.shape[3]) + 5 * n * h * length * s
    return Cost(flops, sum(t.nbytes for t in (*ins, *outs)))


def _grad_cost(ins, outs, attrs) -> Cost:
    fwd = _cost(ins[1:4], ins[4:], attrs)
    return Cost(2 * fwd.flops, sum(t.nbytes for t in (*ins, *outs)))


def _grad(ctx):
    if ctx.grad_output(1) is not None:
        raise NotImplementedError("flash_attention: no gradient through the log-sum-exp output")
    ins = [
        ctx.grad_output(0),
        ctx.input(0),
        ctx.input(1),
        ctx.input(2),
        ctx.output(0),
        ctx.output(1),
    ]
    attrs = {"is_causal": ctx.attrs["is_causal"], "scale": ctx.attrs["scale"]}
    return create_op(FLASH_ATTENTION_GRAD, ins, attrs)


def _qkv(seed: int, s: int = 5):
    return [
        rand(2, 3, 4, 8, seed=seed),
        rand(2, 3, s, 8, seed=seed + 1),
        rand(2, 3, s, 8, seed=seed + 2),
    ]


def _samples():
    """Bitwise (rtol=atol=0) against eager F.scaled_dot_product_attention, which dispatches to
    the same kernel on CPU."""
    exact = {"rtol": 0.0, "atol": 0.0}
    return [
        Sample(
            _qkv(800),
            lambda q, k, v: flash_attention(q, k, v),
            F.scaled_dot_product_attention,
            name="plain",
            **exact,
        ),
        Sample(
            _qkv(810, 4),
            lambda q, k, v: flash_attention(q, k, v, is_causal=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            name="causal",
            **exact,
        ),
        Sample(
            _qkv(820),
            lambda q, k, v: flash_attention(q, k, v, scale=0.3),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
            name="scale",
            **exact,
        ),
    ]


def _grad_samples():
    def build(g, q, k, v):
        out, lse = create_op(FLASH_ATTENTION, [q, k, v], {"is_causal": True, "scale": None})
        attrs = {"is_causal": True, "scale": None}
        return tuple(create_op(FLASH_ATTENTION_GRAD, [g, q, k, v, out, lse], attrs))

    def ref(g, q, k, v):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return torch.autograd.grad(y, (q, k, v), g)

    inputs = [rand(2, 3, 4, 8, seed=830), *_qkv(831, 4)]
    return [Sample(inputs, build, ref, grad=False, rtol=0.0, atol=0.0)]


FLASH_ATTENTION = register(
    OpDef(
        "FlashAttention",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="flash_attention_out",
    )
)
FLASH_ATTENTION_GRAD = register(
    OpDef(
        "FlashAttentionGrad",
        _grad_infer,
        _grad_kernel,
        cost=_grad_cost,
        samples=_grad_samples,
        out_name="flash_attention_grad_out",
    )
)


def flash_attention(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, scale: float | None = None
) -> Tensor:
    """softmax(q k^T * scale) v over (N, H, L, D) x (N, H, S, D), computed by torch's CPU
    flash-attention kernel (``scale`` defaults to 1/sqrt(D); ``is_causal`` masks the upper
    triangle)."""
    attrs = {"is_causal": bool(is_causal), "scale": None if scale is None else float(scale)}
    return create_op(FLASH_ATTENTION, [q, k, v], attrs)[0]
