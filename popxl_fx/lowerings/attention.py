"""Attention: F.scaled_dot_product_attention (bool/float attn_mask, is_causal, scale, GQA,
dropout), nn.MultiheadAttention (batch_first, kdim/vdim, key_padding_mask, attn_mask,
need_weights with head averaging), and the transformer layers/stacks built from them.

Both run eager's own kernels (`attention_eager`): one attention op whose kernel is torch's
F.scaled_dot_product_attention, masks or not. Only dropout drawn from the simulator's stream
(``Options(rng="ipu")``, not eager's masks) takes the composite of PopXL ops here.

MultiheadAttention's bool masks mark positions to *ignore*; SDPA's bool mask marks positions
that *take part* (torch's conventions, kept here).
"""

from __future__ import annotations

import math

import numpy as np
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lookup, lowers
from ._sub import call_child, child_ctx, dropout
from .attention_eager import additive, eager_mha, sdpa

__all__ = ["attention", "multi_head_attention"]


def _causal(n_q: int, n_k: int) -> popxl.Tensor:
    return popxl.constant(np.tril(np.ones((n_q, n_k), bool)))


def attention(
    ctx,
    q: popxl.Tensor,
    k: popxl.Tensor,
    v: popxl.Tensor,
    mask: popxl.Tensor | None = None,
    dropout_p: float = 0.0,
    scale=None,
):
    """softmax(q k^T * scale + mask) v with dropout from the simulator's seeded stream
    (``Options(rng="ipu")``, where eager's masks are not drawn): a composite of PopXL ops."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = ops.matmul(q * s, swap_last(k))
    if mask is not None:
        scores = scores + mask
    weights = ops.softmax(scores, scores.rank - 1)
    weights = dropout(ctx, weights, dropout_p, dropout_p > 0)
    return ops.matmul(weights, v)


def swap_last(t: popxl.Tensor) -> popxl.Tensor:
    perm = list(range(t.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ops.transpose(t, perm)


def _repeat_heads(t, n: int):
    """(N, Hk, S, D) -> (N, Hk*n, S, D), each head repeated n times (repeat_interleave)."""
    if n == 1:
        return t
    shape = list(t.shape)
    e = ops.expand(ops.unsqueeze(t, t.rank - 2), shape[:-2] + [n] + shape[-2:])
    return ops.reshape(e, shape[:-3] + [shape[-3] * n] + shape[-2:])


@lowers(F.scaled_dot_product_attention)
def _sdpa(
    ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: is_causal with an explicit attn_mask")
    out = sdpa(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if out is not None:
        return out
    if enable_gqa and q.rank >= 3:
        k = _repeat_heads(k, q.shape[-3] // k.shape[-3])
        v = _repeat_heads(v, q.shape[-3] // v.shape[-3])
    mask = _causal(q.shape[-2], k.shape[-2]) if is_causal else attn_mask
    if mask is not None:
        mask = additive(mask, q.dtype, keep_when_true=True)
    return attention(ctx, q, k, v, mask, dropout_p, scale)


# nn.MultiheadAttention -----------------------------------------------------------------------
def _mha_mask(m, attn_mask, key_padding_mask, n, length, s, dtype):
    mask = None
    if attn_mask is not None:
        mask = additive(attn_mask, dtype, keep_when_true=False)
        if mask.rank == 3:  # (N*H, L, S)
            mask = ops.reshape(mask, (n, m.num_heads, length, s))
    if key_padding_mask is not None:
        kpm = additive(key_padding_mask, dtype, keep_when_true=False)
        kpm = ops.reshape(kpm, (n, 1, 1, s))
        mask = kpm if mask is None else mask + kpm
    return mask


def _project(ctx, m, x, i: int, name: str):
    e = m.embed_dim
    if m._qkv_same_embed_dim:
        w = ops.slice(ctx.param("in_proj_weight"), i * e, (i + 1) * e, axis=0)
    else:
        w = ctx.param(f"{name}_proj_weight")
    y = ops.matmul(x, ops.transpose(w))
    if m.in_proj_bias is not None:
        y = y + ops.slice(ctx.param("in_proj_bias"), i * e, (i + 1) * e, axis=0)
    return y


def _heads(t, h: int):
    """(N, L, E) -> (N, H, L, E/H)."""
    n, length, e = t.shape
    return ops.transpose(ops.reshape(t, (n, length, h, e // h)), (0, 2, 1, 3))


def _composite_mha(ctx, m, query, key, value, key_padding_mask, attn_mask, is_causal):
    """MultiheadAttention without weights, dropout from the simulator's stream."""
    unbatched = query.rank == 2
    if unbatched:
        axis = 0 if m.batch_first else 1
        query, key, value = (ops.unsqueeze(t, axis) for t in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = ops.unsqueeze(key_padding_mask, 0)
    if not m.batch_first:
        query, key, value = (ops.transpose(t, (1, 0, 2)) for t in (query, key, value))
    n, length, s = query.shape[0], query.shape[1], key.shape[1]
    q, k, v = (
        _heads(_project(ctx, m, t, i, name), m.num_heads)
        for i, (t, name) in enumerate(((query, "q"), (key, "k"), (value, "v")))
    )
    if is_causal and key_padding_mask is None:
        attn_mask = ops.logical_not(_causal(length, s))
    mask = _mha_mask(m, attn_mask, key_padding_mask, n, length, s, q.dtype)
    out = attention(ctx, q, k, v, mask, m.dropout)
    out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (n, length, m.embed_dim))
    out = call_child(ctx, m, "out_proj", out)
    if not m.batch_first:
        out = ops.transpose(out, (1, 0, 2))
    return ops.squeeze(out, [0 if m.batch_first else 1]) if unbatched else out


def multi_head_attention(
    ctx,
    m,
    query,
    key,
    value,
    key_padding_mask=None,
    need_weights=True,
    attn_mask=None,
    average_attn_weights=True,
    is_causal=False,
):
    """nn.MultiheadAttention.forward; returns (output, weights or None)."""
    if m.bias_k is not None or m.add_zero_attn:
        raise NotImplementedError(
            f"{ctx.module_path}: MultiheadAttention with add_bias_kv or "
            "add_zero_attn is not supported"
        )
    args = (key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal)
    res = eager_mha(ctx, m, query, key, value, *args)
    if res is not None:
        return res
    out = _composite_mha(ctx, m, query, key, value, key_padding_mask, attn_mask, is_causal)
    return out, None


@lowers(nn.MultiheadAttention)
def _mha_module(
    ctx,
    m,
    query,
    key,
    value,
    key_padding_mask=None,
    need_weights=True,
    attn_mask=None,
    average_attn_weights=True,
    is_causal=False,
):
    return multi_head_attention(
        ctx,
        m,
        query,
        key,
        value,
        key_padding_mask,
        need_weights,
        attn_mask,
        average_attn_weights,
        is_causal,
    )


# transformer layers --------------------------------------------------------------------------
def _activation(ctx, layer, x):
    act = layer.activation
    if isinstance(act, nn.Module):
        return call_child(ctx, layer, "activation", x)
    fn = lookup(act)
    if fn is None:
        raise NotImplementedError(f"{ctx.module_path}: activation {act!r} has no lowering")
    return fn(ctx, x)


def _norm(ctx, layer, name: str, x):
    return call_child(ctx, layer, name, x)


def _drop(ctx, layer, name: str, x):
    return dropout(ctx, x, getattr(layer, name).p, ctx.training)


def _ff(ctx, layer, x):
    h = _activation(ctx, layer, call_child(ctx, layer, "linear1", x))
    h = call_child(ctx, layer, "linear2", _drop(ctx, layer, "dropout", h))
    return h


def _attention(ctx, layer, child, dropout, x, kv, mask, key_padding_mask, is_causal):
    """``layer.<child>`` attending from ``x`` to ``kv`` (weights not needed), then its dropout."""
    y = call_child(
        ctx,
        layer,
        child,
        x,
        kv,
        kv,
        attn_mask=mask,
        key_padding_mask=key_padding_mask,
        need_weights=False,
        is_causal=is_causal,
    )[0]
    return _drop(ctx, layer, dropout, y)


def _self_attention(ctx, layer, x, mask, key_padding_mask, is_causal):
    return _attention(ctx, layer, "self_attn", "dropout1", x, x, mask, key_padding_mask, is_causal)


@lowers(nn.TransformerEncoderLayer)
def encoder_layer(
    ctx,
    m: nn.TransformerEncoderLayer,
    src: popxl.Tensor,
    src_mask=None,
    src_key_padding_mask=None,
    is_causal: bool = False,
) -> popxl.Tensor:
    x = src
    if m.norm_first:
        x = x + _self_attention(
            ctx, m, _norm(ctx, m, "norm1", x), src_mask, src_key_padding_mask, is_causal
        )
        return x + _drop(ctx, m, "dropout2", _ff(ctx, m, _norm(ctx, m, "norm2", x)))
    x = _norm(
        ctx, m, "norm1", x + _self_attention(ctx, m, x, src_mask, src_key_padding_mask, is_causal)
    )
    return _norm(ctx, m, "norm2", x + _drop(ctx, m, "dropout2", _ff(ctx, m, x)))


def _cross_attention(ctx, layer, x, memory, mask, key_padding_mask, is_causal):
    return _attention(
        ctx, layer, "multihead_attn", "dropout2", x, memory, mask, key_padding_mask, is_causal
    )


@lowers(nn.TransformerDecoderLayer)
def decoder_layer(
    ctx,
    m,
    tgt,
    memory,
    tgt_mask=None,
    memory_mask=None,
    tgt_key_padding_mask=None,
    memory_key_padding_mask=None,
    tgt_is_causal=False,
    memory_is_causal=False,
):
    x = tgt
    sa = (tgt_mask, tgt_key_padding_mask, tgt_is_causal)
    ca = (memory_mask, memory_key_padding_mask, memory_is_causal)
    if m.norm_first:
        x = x + _self_attention(ctx, m, _norm(ctx, m, "norm1", x), *sa)
        x = x + _cross_attention(ctx, m, _norm(ctx, m, "norm2", x), memory, *ca)
        return x + _drop(ctx, m, "dropout3", _ff(ctx, m, _norm(ctx, m, "norm3", x)))
    x = _norm(ctx, m, "norm1", x + _self_attention(ctx, m, x, *sa))
    x = _norm(ctx, m, "norm2", x + _cross_attention(ctx, m, x, memory, *ca))
    return _norm(ctx, m, "norm3", x + _drop(ctx, m, "dropout3", _ff(ctx, m, x)))


def _layers(ctx, m):
    for i, layer in enumerate(m.layers):
        yield child_ctx(ctx, f"layers.{i}", layer), layer


@lowers(nn.TransformerEncoder)
def _encoder(ctx, m, src, mask=None, src_key_padding_mask=None, is_causal=None):
    x = src
    for sub, layer in _layers(ctx, m):
        x = encoder_layer(sub, layer, x, mask, src_key_padding_mask, bool(is_causal))
    return call_child(ctx, m, "norm", x) if m.norm is not None else x


@lowers(nn.TransformerDecoder)
def _decoder(
    ctx,
    m,
    tgt,
    memory,
    tgt_mask=None,
    memory_mask=None,
    tgt_key_padding_mask=None,
    memory_key_padding_mask=None,
    tgt_is_causal=None,
    memory_is_causal=False,
):
    x = tgt
    for sub, layer in _layers(ctx, m):
        x = decoder_layer(
            sub,
            layer,
            x,
            memory,
            tgt_mask,
            memory_mask,
            tgt_key_padding_mask,
            memory_key_padding_mask,
            bool(tgt_is_causal),
            memory_is_causal,
        )
    return call_child(ctx, m, "norm", x) if m.norm is not None else x
