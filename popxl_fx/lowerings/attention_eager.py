"""Attention as eager torch computes it on CPU, op for op, so traced transformers match eager
bit for bit: SDPA through torch's CPU flash-attention kernel when eager's dispatcher picks it,
and nn.MultiheadAttention's own sequence (F.multi_head_attention_forward without weights or
masks): the in-projection GEMMs grouped as torch groups them, on the sequence-first input whose
layout decides addmm vs mm, the flash kernel, then the out-projection.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.attention import SDPBackend

from popxl_core import ops

from ._sub import call_child
from .basic import linear

__all__ = ["eager_mha", "eager_mha_applies", "eager_uses_flash"]


def eager_uses_flash(shapes, dtype, dropout_p: float, is_causal: bool = False) -> bool:
    """Whether eager's SDPA runs torch's CPU flash kernel on these (mask-free) inputs; with
    dropout the masks are torch's random numbers, which the simulator does not reproduce."""
    if dropout_p > 0 or any(len(s) != 4 for s in shapes):
        return False
    dt = dtype.as_torch()
    if dt not in (torch.float32, torch.float64, torch.float16):
        return False  # (float16: popxl_fx's numerics="torch" runs torch's float16 kernels)
    empty = [torch.empty(s, dtype=dt) for s in shapes]
    choice = torch._fused_sdp_choice(*empty, None, 0.0, is_causal)
    return choice == int(SDPBackend.FLASH_ATTENTION)


# eager's own sequence (F.multi_head_attention_forward without weights or masks): the packed
# in-projection on the sequence-first input, torch's CPU flash attention, the out-projection
def eager_mha_applies(ctx, m, q, k, v, key_padding_mask, need_weights, attn_mask) -> bool:
    if need_weights or attn_mask is not None or key_padding_mask is not None or q.rank != 3:
        return False
    dropout_p = m.dropout if ctx.training else 0.0
    n, length, s = (
        (q.shape[0], q.shape[1], k.shape[1])
        if m.batch_first
        else (q.shape[1], q.shape[0], k.shape[0])
    )
    h, d = m.num_heads, m.head_dim
    return eager_uses_flash([(n, h, x, d) for x in (length, s, s)], q.dtype, dropout_p)


def _seq_first(m, t):
    """The input as F.multi_head_attention_forward sees it: (L, N, E), and eager's layout."""
    if not m.batch_first:
        return t, None
    n, length, e = t.shape
    return ops.transpose(t, (1, 0, 2)), torch.empty(n, length, e).transpose(0, 1)


def _in_proj(ctx, m, query, key, value):
    """q, k, v projections, (L|S, N, E) each, grouped into GEMMs as torch groups them."""
    e = m.embed_dim
    q_in, q_eager = _seq_first(m, query)
    k_in, k_eager = _seq_first(m, key)
    v_in, v_eager = _seq_first(m, value)
    if not m._qkv_same_embed_dim:
        names = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
        ws = [ctx.param(n) for n in names]
        bs = _bias_chunks(ctx, m, [e, e, e])
        ins = ((q_in, q_eager), (k_in, k_eager), (v_in, v_eager))
        return [linear(w, x, b, xe) for w, b, (x, xe) in zip(ws, bs, ins)]
    w = ctx.param("in_proj_weight")
    if query is key and key is value:
        proj = linear(w, q_in, _bias(ctx, m), q_eager)
        return _unpack(proj, 3, e)
    if key is value:
        wq, wkv = ops.slice(w, 0, e, axis=0), ops.slice(w, e, 3 * e, axis=0)
        bq, bkv = _bias_chunks(ctx, m, [e, 2 * e])
        q = linear(wq, q_in, bq, q_eager)
        return [q, *_unpack(linear(wkv, k_in, bkv, k_eager), 2, e)]
    ws = [ops.slice(w, i * e, (i + 1) * e, axis=0) for i in range(3)]
    bs = _bias_chunks(ctx, m, [e, e, e])
    ins = ((q_in, q_eager), (k_in, k_eager), (v_in, v_eager))
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


def eager_mha(ctx, m, query, key, value):
    h, d = m.num_heads, m.head_dim
    q, k, v = _in_proj(ctx, m, query, key, value)
    heads = [  # (L, N, E) -> (N, H, L, D), torch's views
        ops.transpose(ops.reshape(t, (t.shape[0], t.shape[1], h, d)), (1, 2, 0, 3))
        for t in (q, k, v)
    ]
    out = ops.flash_attention(*heads)
    n, length = out.shape[0], out.shape[2]
    out = ops.reshape(ops.transpose(out, (2, 0, 1, 3)), (length * n, m.embed_dim))
    out = ops.reshape(call_child(ctx, m, "out_proj", out), (length, n, m.embed_dim))
    return ops.transpose(out, (1, 0, 2)) if m.batch_first else out
