"""``scaled_dot_product_attention``: softmax(q k^T * scale + mask) v, computed by torch's public
``F.scaled_dot_product_attention`` itself, forward and backward.

One op for every form (no mask, bool or float ``attn_mask``, ``is_causal``, ``scale``,
grouped-query heads, dropout): torch's dispatcher picks the CPU kernel (the blocked flash
kernel, or the math composite) exactly as it does in eager, so the op equals eager bit for
bit whichever it picks. The gradient op recomputes the forward under autograd and runs
torch's own backward of that kernel; the recomputation is deterministic, so its gradients are
eager's.

Dropout draws from torch's generator inside the kernel. The draw's generator state is an
input, made by `attention_rng_state` (a `torch_random` op that takes the state and advances the
generator as eager's draw does), so the op itself is pure: forward and backward run under that
state and draw eager's mask.

Eager's choice of kernel depends on one more thing than shapes: a float mask that requires
grad sends torch to the math composite (the flash kernel has no mask gradient). The op's
``mask_grad`` attribute states it, and the kernel marks the mask so torch decides the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..tensor import Tensor
from ._utils import rand, same_dtype, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["AttentionRngState", "scaled_dot_product_attention"]


def _check_mask(q, k, mask) -> None:
    if mask.dtype.name != "bool" and mask.dtype != q.dtype:
        raise TypeError(
            f"attention mask of {mask.dtype.name}: it must be bool or {q.dtype.name} (the "
            "query's dtype); cast it first"
        )
    want = (*q.shape[:-1], k.shape[-2])
    try:
        torch.broadcast_shapes(tuple(mask.shape), want)
    except RuntimeError:
        raise ValueError(
            f"attention mask {tuple(mask.shape)} does not broadcast to (..., L, S) = {want}"
        ) from None


def _infer(ins, is_causal, scale, enable_gqa, mask_grad, has_mask, dropout_p):
    q, k, v = ins[:3]
    same_dtype(q, k, v)
    if not q.dtype.is_floating_point:
        raise TypeError(f"attention needs floating point tensors, got {q.dtype.name}")
    rank = len(q.shape)
    if rank < 2 or len(k.shape) != rank or len(v.shape) != rank or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} must be (..., L|S, D)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {q.shape} and k {k.shape}: the last dimensions differ")
    if is_causal and has_mask:
        raise ValueError("attention: is_causal together with an explicit mask (pass one)")
    if has_mask:
        _check_mask(q, k, ins[3])
    if (dropout_p > 0) != (len(ins) == 4 + has_mask):
        raise ValueError("attention: dropout_p > 0 needs the generator state input, and only then")
    return [spec((*q.shape[:-1], v.shape[-1]), q.dtype)]


def _split(extra, attrs):
    """The op's inputs after q, k, v: (mask or None, generator state or None)."""
    mask = extra[0] if attrs["has_mask"] else None
    state = extra[-1] if attrs["dropout_p"] > 0 else None
    if mask is not None and attrs["mask_grad"]:  # eager's mask requires grad: mark ours
        mask = mask.detach().requires_grad_()
    return mask, state


def _call(q, k, v, mask, state, attrs):
    kw = dict(attn_mask=mask, is_causal=attrs["is_causal"], scale=attrs["scale"])
    kw["enable_gqa"] = attrs["enable_gqa"]
    if state is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with torch.random.fork_rng(devices=[]):  # eager's draw; the generator left as it was
        torch.set_rng_state(state)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=attrs["dropout_p"], **kw)


def _kernel(q, k, v, *extra, **attrs):
    # grad mode on for a mask that requires grad: torch then picks the kernel eager picks
    with torch.set_grad_enabled(attrs["mask_grad"]):
        return _call(q, k, v, *_split(extra, attrs), attrs).detach()


def _grad_infer(ins, **attrs):
    return list(ins[1:4]) + ([ins[4]] if attrs["mask_grad"] else [])


def _grad_kernel(g, q, k, v, *extra, **attrs):
    mask, state = _split(extra, attrs)
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        wrt = [q, k, v] + ([mask] if attrs["mask_grad"] else [])
        return tuple(torch.autograd.grad(_call(q, k, v, mask, state, attrs), wrt, g))


def _cost(ins, outs, attrs) -> Cost:
    q, k, v = ins[:3]
    length, d = q.shape[-2], q.shape[-1]
    rows = q.nelms // (length * d)
    s = k.shape[-2]
    flops = 2 * rows * length * s * (d + v.shape[-1]) + 5 * rows * length * s
    return Cost(flops, sum(t.nbytes for t in (*ins, *outs)))


def _grad_cost(ins, outs, attrs) -> Cost:
    fwd = _cost(ins[1:], ins[:1], attrs)  # recomputes the forward, then twice its work
    return Cost(3 * fwd.flops, sum(t.nbytes for t in (*ins, *outs)))


def _grad(ctx):
    n = len(ctx.op.inputs)
    attrs = dict(ctx.attrs)
    ins = [ctx.grad_output(0), *(ctx.input(i) for i in range(n))]
    grads = list(create_op(SDPA_GRAD, ins, attrs))
    return (grads + [None] * n)[:n]  # no gradient for a bool mask or the generator state


def _qkv(seed: int, s: int = 5):
    return [
        rand(2, 3, 4, 8, seed=seed),
        rand(2, 3, s, 8, seed=seed + 1),
        rand(2, 3, s, 8, seed=seed + 2),
    ]


def _bool_mask(seed: int):
    keep = rand(4, 5, seed=seed) > 0.0
    keep[:, 0] = True  # no fully masked row (torch gives NaN there)
    return keep


def _samples():
    """Bitwise (rtol=atol=0) against eager F.scaled_dot_product_attention, forward and gradient:
    the op runs the same call."""
    exact = {"rtol": 0.0, "atol": 0.0}

    def sdpa(**kw):
        return lambda q, k, v: scaled_dot_product_attention(q, k, v, **kw)

    def ref(**kw):
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)

    def masked(q, k, v, m):
        return scaled_dot_product_attention(q, k, v, m)

    def masked_ref(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def float_masked(q, k, v, m):
        return scaled_dot_product_attention(q, k, v, m, mask_grad=True)

    def float_masked_ref(q, k, v, m):
        with torch.enable_grad():  # eager's mask requires grad in the forward comparison too
            m = m if m.requires_grad else m.detach().requires_grad_()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def gqa_ref(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    gqa = [rand(2, 4, 4, 8, seed=840), rand(2, 2, 5, 8, seed=841), rand(2, 2, 5, 8, seed=842)]
    return [
        Sample(_qkv(800), sdpa(), ref(), name="plain", **exact),
        Sample(_qkv(810, 4), sdpa(is_causal=True), ref(is_causal=True), name="causal", **exact),
        Sample(_qkv(820), sdpa(scale=0.3), ref(scale=0.3), name="scale", **exact),
        Sample([*_qkv(830), _bool_mask(833)], masked, masked_ref, name="bool_mask", **exact),
        # a float mask that requires grad: torch's math kernel, and a gradient for the mask
        Sample([*_qkv(850), rand(2, 1, 4, 5, seed=853)], float_masked, float_masked_ref, **exact),
        Sample(gqa, sdpa(enable_gqa=True), gqa_ref, name="gqa", **exact),
    ]


def _grad_samples():
    attrs = _attrs(is_causal=True)

    def build(g, q, k, v):
        return tuple(create_op(SDPA_GRAD, [g, q, k, v], attrs))

    def ref(g, q, k, v):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return torch.autograd.grad(y, (q, k, v), g)

    inputs = [rand(2, 3, 4, 8, seed=860), *_qkv(861, 4)]
    return [Sample(inputs, build, ref, grad=False, rtol=0.0, atol=0.0)]


SDPA = register(
    OpDef(
        "ScaledDotProductAttention",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="attention_out",
    )
)
SDPA_GRAD = register(
    OpDef(
        "ScaledDotProductAttentionGrad",
        _grad_infer,
        _grad_kernel,
        cost=_grad_cost,
        samples=_grad_samples,
        out_name="attention_grad_out",
    )
)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    mask_grad: bool = False,
    dropout_p: float = 0.0,
    rng_state: Tensor | None = None,
) -> Tensor:
    """softmax(q k^T * scale + mask) v over (..., L, D) x (..., S, D), computed by torch's
    ``F.scaled_dot_product_attention`` (forward and backward, eager's kernels bit for bit).

    Args:
        attn_mask: bool (True takes part) or float (added), broadcast to (..., L, S).
        is_causal: mask the upper triangle (not with ``attn_mask``).
        scale: defaults to 1/sqrt(D).
        enable_gqa: k and v have fewer heads (dim -3) than q, shared by groups of q's heads.
        mask_grad: a float mask receives a gradient (eager: the mask requires grad, which also
            makes torch pick its math kernel); the op then has a gradient for it.
        dropout_p, rng_state: dropout on the weights, drawn from torch's generator in the
            state ``rng_state`` (``torch_random(AttentionRngState(p, weights_shape), [q])``).

    Example:
        >>> # out = scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    if mask_grad and (attn_mask is None or not attn_mask.dtype.is_floating_point):
        raise ValueError("mask_grad=True needs a floating point attn_mask")
    if (dropout_p > 0) != (rng_state is not None):
        raise ValueError("dropout_p > 0 needs rng_state (attention_rng_state), and only then")
    attrs = _attrs(is_causal, scale, enable_gqa, mask_grad, attn_mask is not None, dropout_p)
    ins = [q, k, v] + [t for t in (attn_mask, rng_state) if t is not None]
    return create_op(SDPA, ins, attrs)[0]


def _attrs(is_causal=False, scale=None, enable_gqa=False, mask_grad=False, has_mask=False, p=0.0):
    return {
        "is_causal": bool(is_causal),
        "scale": None if scale is None else float(scale),
        "enable_gqa": bool(enable_gqa),
        "mask_grad": bool(mask_grad),
        "has_mask": bool(has_mask),
        "dropout_p": float(p),
    }


@dataclass(frozen=True)
class AttentionRngState:
    """The generator state eager's SDPA dropout starts from, then the generator advanced as
    that dropout advances it: eager CPU SDPA draws ``empty_like(weights).bernoulli_(1 - p)``
    (ATen's ``_dropout_impl``) on the (..., L, S) weights. A `torch_random` fn: the output is
    the state, the input gives the weights' dtype."""

    p: float
    shape: tuple

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        state = torch.get_rng_state()
        x.new_empty(self.shape).bernoulli_(1 - self.p)
        return state

    def __str__(self) -> str:
        return f"attention_rng_state(p={self.p}, shape={self.shape})"
