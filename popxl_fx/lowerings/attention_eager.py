"""Attention as eager torch computes it on CPU, op for op, so traced transformers match eager
bit for bit with or without masks:

- `sdpa`: F.scaled_dot_product_attention as one `ops.scaled_dot_product_attention`, whose
  kernel is torch's own call (torch's dispatcher picks flash or math as in eager); dropout
  draws eager's mask from torch's generator (`Options(rng="torch")`).
- `eager_mha`: nn.MultiheadAttention's own sequence (F.multi_head_attention_forward): the
  in-projection GEMMs grouped as torch groups them, on the sequence-first input whose layout
  decides addmm vs mm; the masks merged as torch merges them (bool -> 0/-inf, the key padding
  mask added per head); then either SDPA (``need_weights=False``) or, for the weights, torch's
  baddbmm/softmax/bmm run by torch itself on eager's strided views; the out-projection.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from popxl_core import ops
from popxl_core.ops.attention_flash import flash_attention, flash_attention_applies

from ._common import const
from ._sub import call_child, dropout, torch_rng
from .basic import linear

__all__ = ["eager_mha", "sdpa"]

_NEG_INF = float("-inf")


def additive(mask, dtype, keep_when_true: bool):
    """A bool mask as 0 / -inf (torch's ``_canonical_mask``); float masks are added as they are."""
    if mask.dtype.name != "bool":
        return mask if mask.dtype == dtype else ops.cast(mask, dtype)
    keep = mask if keep_when_true else ops.logical_not(mask)
    return ops.where(keep, const(0.0, dtype), const(_NEG_INF, dtype))


def _mask_grad(ctx, mask) -> bool:
    """Whether eager's mask requires grad (torch then runs its math kernel)."""
    if mask is None or not mask.dtype.is_floating_point:
        return False
    probe = getattr(ctx.owner, "requires_grad", None)
    return bool(probe and probe(mask))


def sdpa(ctx, q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention with torch's kernels; ``None`` when dropout must draw
    from the simulator's stream (``Options(rng="ipu")``): the caller builds the composite."""
    if flash_attention_applies(q, k, v, mask, dropout_p, enable_gqa):
        # the forward hands its log-sum-exp to the gradient, as eager autograd does
        return flash_attention(q, k, v, bool(is_causal), scale)
    state = None
    if dropout_p > 0:
        if not torch_rng(ctx):
            return None
        batch = torch.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]))
        weights = (*batch, q.shape[-2], k.shape[-2])
        draw = ops.AttentionRngState(float(dropout_p), weights)
        state = ops.torch_random(draw, [q], (ops.Slot(0),))[0]
    return ops.scaled_dot_product_attention(
        q,
        k,
        v,
        mask,
        bool(is_causal),
        scale,
        bool(enable_gqa),
        _mask_grad(ctx, mask),
        float(dropout_p),
        state,
    )


# nn.MultiheadAttention ----------------------------------------------------------------------
def _seq_first(m, t, batched: bool):
    """The input as F.multi_head_attention_forward sees it: (L, N, E), and eager's layout."""
    if not batched:
        return ops.unsqueeze(t, 1), None
    if not m.batch_first:
        return t, None
    n, length, e = t.shape
    return ops.transpose(t, (1, 0, 2)), torch.empty(n, length, e).transpose(0, 1)


def _in_proj(ctx, m, query, key, value, batched: bool):
    """q, k, v projections, (L|S, N, E) each, grouped into GEMMs as torch groups them."""
    e = m.embed_dim
    q_in, q_eager = _seq_first(m, query, batched)
    k_in, k_eager = _seq_first(m, key, batched)
    v_in, v_eager = _seq_first(m, value, batched)
    ins = ((q_in, q_eager), (k_in, k_eager), (v_in, v_eager))
    if not m._qkv_same_embed_dim:
        ws = [ctx.param(f"{n}_proj_weight") for n in "qkv"]
        bs = _bias_chunks(ctx, m, [e, e, e])
        return [linear(w, x, b, xe) for w, b, (x, xe) in zip(ws, bs, ins)]
    w = ctx.param("in_proj_weight")
    # torch checks identity after unsqueezing an unbatched input: three tensors there
    if batched and query is key and key is value:
        return _unpack(linear(w, q_in, _bias(ctx, m), q_eager), 3, e)
    if batched and key is value:
        wq, wkv = ops.slice(w, 0, e, axis=0), ops.slice(w, e, 3 * e, axis=0)
        bq, bkv = _bias_chunks(ctx, m, [e, 2 * e])
        q = linear(wq, q_in, bq, q_eager)
        return [q, *_unpack(linear(wkv, k_in, bkv, k_eager), 2, e)]
    ws = [ops.slice(w, i * e, (i + 1) * e, axis=0) for i in range(3)]
    bs = _bias_chunks(ctx, m, [e, e, e])
    return [linear(w, x, b, xe) for w, b, (x, xe) in zip(ws, bs, ins)]


def _bias(ctx, m):
    return ctx.param("in_proj_bias") if m.in_proj_bias is not None else None


def _bias_chunks(ctx, m, sizes):
    b = _bias(ctx, m)
    if b is None:
        return [None] * len(sizes)
    starts = np.cumsum([0, *sizes])
    return [ops.slice(b, int(a), int(z), axis=0) for a, z in zip(starts[:-1], starts[1:])]


def _unpack(proj, parts: int, e: int):
    """(L, N, parts*E) -> parts tensors (L, N, E) (torch: unflatten + select)."""
    length, n = proj.shape[0], proj.shape[1]
    split = ops.reshape(proj, (length, n, parts, e))
    return [ops.squeeze(ops.slice(split, i, i + 1, axis=2), [2]) for i in range(parts)]


def _merged_mask(m, attn_mask, key_padding_mask, n, length, s, dtype):
    """attn_mask (1|N*H, L, S) plus the key padding mask (N*H, 1, S), both 0/-inf floats."""
    mask = None
    if attn_mask is not None:
        mask = additive(attn_mask, dtype, keep_when_true=False)
        if mask.rank == 2:
            mask = ops.unsqueeze(mask, 0)
    if key_padding_mask is not None:
        kpm = additive(key_padding_mask, dtype, keep_when_true=False)
        kpm = ops.expand(ops.reshape(kpm, (n, 1, 1, s)), (n, m.num_heads, 1, s))
        kpm = ops.reshape(kpm, (n * m.num_heads, 1, s))
        mask = kpm if mask is None else mask + kpm
    return mask


def _heads(t, h: int):
    """(L, N, E) -> (N, H, L, E/H) (torch: view + transpose + view)."""
    length, n, e = t.shape
    return ops.transpose(ops.reshape(t, (length, n, h, e // h)), (1, 2, 0, 3))


def mha_weights(q, k, *mask, heads: int):
    """softmax(q k^T / sqrt(D) + mask) over torch's (N*H, L, D) views of (L, N, E) inputs,
    as F.multi_head_attention_forward computes it with ``need_weights`` (baddbmm or bmm)."""
    length, n, e = q.shape  # (eager's projections are contiguous; the simulator's may not be)
    q = q.contiguous().view(length, n * heads, e // heads).transpose(0, 1)
    k = k.contiguous().view(k.shape[0], n * heads, e // heads).transpose(0, 1)
    q = q * math.sqrt(1.0 / float(e // heads))
    kt = k.transpose(-2, -1)
    scores = torch.baddbmm(mask[0], q, kt) if mask else torch.bmm(q, kt)
    return F.softmax(scores, dim=-1)


def mha_context(weights, v, heads: int):
    """weights (N*H, L, S) @ v's (N*H, S, D) view of (S, N, E), as torch's bmm."""
    s, n, e = v.shape
    return torch.bmm(weights, v.contiguous().view(s, n * heads, e // heads).transpose(0, 1))


def _with_weights(ctx, m, q, k, v, mask, p):
    """(output (L*N, E), weights (N*H, L, S)) through eager's own kernels."""
    h = m.num_heads
    ins = [q, k] + ([mask] if mask is not None else [])
    slots = tuple(ops.Slot(i) for i in range(len(ins)))
    weights = ops.aten_op(mha_weights, ins, slots, {"heads": h})[0]
    dropped = dropout(ctx, weights, p, p > 0)
    out = ops.aten_op(mha_context, [dropped, v], (ops.Slot(0), ops.Slot(1)), {"heads": h})[0]
    length, n = q.shape[0], q.shape[1]
    return ops.reshape(ops.transpose(out, (1, 0, 2)), (length * n, m.embed_dim)), weights


def _without_weights(ctx, m, q, k, v, mask, p, is_causal):
    """output (L*N, E) through SDPA, or None (dropout from the simulator's stream)."""
    h = m.num_heads
    length, n, s = q.shape[0], q.shape[1], k.shape[0]
    if mask is not None:  # (1|N*H, L|1, S) -> (1|N, 1|H, L|1, S)
        lead = (1, 1) if mask.shape[0] == 1 else (n, h)
        mask = ops.reshape(mask, (*lead, mask.shape[1], s))
    out = sdpa(ctx, _heads(q, h), _heads(k, h), _heads(v, h), mask, p, is_causal)
    if out is None:
        return None
    return ops.reshape(ops.transpose(out, (2, 0, 1, 3)), (length * n, m.embed_dim))


def eager_mha(
    ctx, m, query, key, value, key_padding_mask, need_weights, attn_mask, average, is_causal
):
    """nn.MultiheadAttention.forward as torch runs it; (output, weights or None), or None
    where only the composite can draw the dropout (``Options(rng="ipu")``)."""
    if is_causal and attn_mask is None:
        raise ValueError(
            f"{ctx.module_path}: MultiheadAttention(is_causal=True) needs attn_mask (as in torch);"
            " pass nn.Transformer.generate_square_subsequent_mask(L)"
        )
    batched = query.rank == 3
    if not batched and key_padding_mask is not None:
        key_padding_mask = ops.unsqueeze(key_padding_mask, 0)
    q, k, v = _in_proj(ctx, m, query, key, value, batched)
    length, n, s = q.shape[0], q.shape[1], k.shape[0]
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # torch's SDPA applies the causal mask itself
    else:
        is_causal = False
    mask = _merged_mask(m, attn_mask, key_padding_mask, n, length, s, q.dtype)
    p = m.dropout if ctx.training else 0.0
    weights = None
    if need_weights:
        out, weights = _with_weights(ctx, m, q, k, v, mask, p)
    else:
        out = _without_weights(ctx, m, q, k, v, mask, p, is_causal)
        if out is None:
            return None
    out = ops.reshape(call_child(ctx, m, "out_proj", out), (length, n, m.embed_dim))
    if weights is not None:
        weights = ops.reshape(weights, (n, m.num_heads, length, s))
        if average:  # torch's mean, whose gradient divides (PopXL's multiplies by 1/H)
            weights = ops.aten_op(torch.ops.aten.mean.dim, [weights], (ops.Slot(0), [1]))[0]
        weights = weights if batched else ops.squeeze(weights, [0])
    if not batched:
        return ops.squeeze(out, [1]), weights
    return (ops.transpose(out, (1, 0, 2)) if m.batch_first else out), weights
