"""Rotary positional embeddings (popxl.addons' ``RotaryPosEmbed`` custom op), RoFormer's RoPE.

The last axis of ``t`` (batch, seq, heads, head_dim) holds ``head_dim / 2`` complex numbers as
interleaved (real, imaginary) pairs; the first ``rotary_dim`` elements are rotated by the angle
``m * theta_i`` (``m`` the sequence position), the rest pass through. ``sin`` and ``cos`` are the
tables of `trig_tables`, shape ``(seq, rotary_dim / 2)`` (or with a leading 1). The rotation is
orthogonal, so the gradient is the inverse rotation (the same op with ``inverse=True``).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import Tensor
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, register

__all__ = ["trig_tables", "trig_table_constants", "rotary_pos_embed", "ROTARY_POS_EMBED"]


def trig_tables(
    seq_len: int, rotary_dim: int, base: int = 10000, np_dtype: Any = "float32"
) -> Tuple[np.ndarray, np.ndarray]:
    """``(sin, cos)`` of ``m * base ** (-2i / rotary_dim)``, each ``(seq_len, rotary_dim // 2)``."""
    theta = base ** (-np.arange(0, rotary_dim, 2).astype(np_dtype) / rotary_dim)
    phi = np.outer(np.arange(seq_len).astype(np_dtype), theta)
    return np.sin(phi), np.cos(phi)


def trig_table_constants(
    seq_len: int, rotary_dim: int, base: int = 10000, dtype=popxl.float32
) -> Tuple[Tensor, Tensor]:
    """`trig_tables` as popxl constants of ``dtype``."""
    sin, cos = trig_tables(seq_len, rotary_dim, base, dtype.as_numpy())
    return popxl.constant(sin, dtype), popxl.constant(cos, dtype)


def _infer(ins, rotary_dim, inverse):
    t, sin, cos = ins
    if len(t.shape) != 4:
        raise ValueError(f"rotary_pos_embed needs a rank 4 tensor, got shape {t.shape}")
    if rotary_dim % 2 or not 0 < rotary_dim <= t.shape[3]:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and at most {t.shape[3]}")
    want = (1, t.shape[1], rotary_dim // 2)
    for name, table in (("sin", sin), ("cos", cos)):
        if tuple(table.shape) != want:
            raise ValueError(f"rotary_pos_embed: {name} has shape {table.shape}, want {want}")
    return [t]


def _kernel(t, sin, cos, *, rotary_dim, inverse):
    rot, rest = t[..., :rotary_dim], t[..., rotary_dim:]
    pairs = rot.unflatten(-1, (rotary_dim // 2, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    s, c = sin.unsqueeze(2), cos.unsqueeze(2)  # (1, seq, 1, rotary_dim / 2): over the heads
    if inverse:  # the IPU codelet's gradient: the rotation by minus the angle
        y_re, y_im = re * c + im * s, im * c - re * s
    else:
        y_re, y_im = re * c - im * s, im * c + re * s
    out = torch.stack([y_re, y_im], -1).flatten(-2)
    return torch.cat([out, rest], -1) if rest.shape[-1] else out


def _grad(ctx):
    a = ctx.attrs
    g = _create(ctx.grad_output(0), ctx.input(1), ctx.input(2), a["rotary_dim"], not a["inverse"])
    return [g, None, None]


def _cost(ins, outs, attrs) -> Cost:
    rotated = ins[0].nelms * attrs["rotary_dim"] // ins[0].shape[3]
    return Cost(3 * rotated, 2 * ins[0].nbytes + ins[1].nbytes + ins[2].nbytes)


def _reference(t, sin, cos, rotary_dim):
    """RoPE as complex multiplication: the pairs times ``exp(i phi)``."""
    z = torch.view_as_complex(t[..., :rotary_dim].unflatten(-1, (-1, 2)).contiguous())
    w = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))[:, :, None, :]
    out = torch.view_as_real(z * w).flatten(-2)
    return torch.cat([out, t[..., rotary_dim:]], -1)


def _samples():
    rng = np.random.default_rng(0)
    out = []
    for rotary_dim in (8, 4):
        t = rng.uniform(-1, 1, (2, 5, 3, 8)).astype(np.float32)
        sin, cos = trig_tables(5, rotary_dim)
        out.append(
            Sample(
                [t],
                lambda x, s=sin, c=cos, r=rotary_dim: rotary_pos_embed(
                    x, popxl.constant(s), popxl.constant(c), r
                ),
                lambda x, s=sin, c=cos, r=rotary_dim: _reference(
                    x, torch.tensor(s)[None], torch.tensor(c)[None], r
                ),
                name=f"rotary_dim{rotary_dim}",
            )
        )
    return out


ROTARY_POS_EMBED = register(
    OpDef(
        "RotaryPosEmbed",
        lambda ins, **attrs: _infer(ins, **attrs),
        kernel=_kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="t_rotated",
    )
)


def _create(t: Tensor, sin: Tensor, cos: Tensor, rotary_dim: int, inverse: bool) -> Tensor:
    return create_op(
        ROTARY_POS_EMBED, [t, sin, cos], {"rotary_dim": rotary_dim, "inverse": inverse}
    )[0]


def rotary_pos_embed(
    t: Tensor, sin: Tensor, cos: Tensor, rotary_dim: Optional[int] = None
) -> Tensor:
    """``t`` (batch, seq, heads, head_dim) with its first ``rotary_dim`` (default: all) elements
    rotated by the angles of ``sin`` / ``cos`` (`trig_tables`, per sequence position)."""
    rotary_dim = rotary_dim or t.shape[-1]
    sin = sin.reshape((1, *sin.shape)) if sin.rank == 2 else sin
    cos = cos.reshape((1, *cos.shape)) if cos.rank == 2 else cos
    return _create(t, sin, cos, int(rotary_dim), False)
