"""nn.RNN (tanh/relu), nn.LSTM and nn.GRU as unrolled composites (any num_layers,
batch_first, bidirectional, initial states, dropout between layers, LSTM's proj_size), and
their *Cell modules.

The input projection of a whole sequence is one matmul; each time step adds the recurrent
matmul and the gate arithmetic, in torch's gate order (LSTM: i, f, g, o; GRU: r, z, n).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.nn as nn

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const
from ._sub import dropout

__all__ = ["gru_step", "lstm_step", "rnn_step"]


def _linear(x, w, b):
    y = ops.matmul(x, ops.transpose(w))
    return y if b is None else y + b


def rnn_step(
    xw: popxl.Tensor,
    h: popxl.Tensor,
    w_hh: popxl.Tensor,
    b_hh: popxl.Tensor | None,
    nonlinearity: str = "tanh",
) -> tuple[popxl.Tensor]:
    pre = xw + _linear(h, w_hh, b_hh)
    return (ops.tanh(pre) if nonlinearity == "tanh" else ops.relu(pre),)


def lstm_step(
    xw: popxl.Tensor,
    h: popxl.Tensor,
    c: popxl.Tensor,
    w_hh: popxl.Tensor,
    b_hh: popxl.Tensor | None,
    w_hr: popxl.Tensor | None = None,
) -> tuple[popxl.Tensor, popxl.Tensor]:
    """One LSTM step; with ``w_hr`` (proj_size > 0) the new h is projected by it."""
    i, f, g, o = ops.split(xw + _linear(h, w_hh, b_hh), 4, axis=xw.rank - 1)
    c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
    h = ops.sigmoid(o) * ops.tanh(c)
    return (h if w_hr is None else _linear(h, w_hr, None)), c


def gru_step(
    xw: popxl.Tensor, h: popxl.Tensor, w_hh: popxl.Tensor, b_hh: popxl.Tensor | None
) -> tuple[popxl.Tensor]:
    xr, xz, xn = ops.split(xw, 3, axis=xw.rank - 1)
    hr, hz, hn = ops.split(_linear(h, w_hh, b_hh), 3, axis=xw.rank - 1)
    r = ops.sigmoid(xr + hr)
    z = ops.sigmoid(xz + hz)
    n = ops.tanh(xn + r * hn)
    return (n + z * (h - n),)  # (1 - z) * n + z * h


def _step(mode: str, xw, state, w_hh, b_hh, w_hr=None):
    if mode == "LSTM":
        return lstm_step(xw, state[0], state[1], w_hh, b_hh, w_hr)
    if mode == "GRU":
        return gru_step(xw, state[0], w_hh, b_hh)
    return rnn_step(xw, state[0], w_hh, b_hh, "relu" if mode == "RNN_RELU" else "tanh")


def _params(ctx, m, layer: int, reverse: bool):
    sfx = f"_l{layer}" + ("_reverse" if reverse else "")
    names = [f"weight_ih{sfx}", f"weight_hh{sfx}", f"bias_ih{sfx}", f"bias_hh{sfx}"]
    params = [ctx.param(n) if m.bias or n.startswith("weight") else None for n in names]
    return params + [ctx.param(f"weight_hr{sfx}") if getattr(m, "proj_size", 0) else None]


def _direction(ctx, m, x, state, layer: int, reverse: bool):
    """One layer in one direction over x (L, N, In); returns outputs (L, N, H) and the
    final state."""
    w_ih, w_hh, b_ih, b_hh, w_hr = _params(ctx, m, layer, reverse)
    xw = _linear(x, w_ih, b_ih)  # the whole sequence at once
    steps = ops.split(xw, [1] * x.shape[0], 0) if x.shape[0] > 1 else [xw]
    outs: list[Any] = [None] * x.shape[0]  # each step fills its row
    for t in reversed(range(x.shape[0])) if reverse else range(x.shape[0]):
        state = _step(m.mode, ops.squeeze(steps[t], [0]), state, w_hh, b_hh, w_hr)
        outs[t] = ops.unsqueeze(state[0], 0)
    return (ops.concat(outs, 0) if len(outs) > 1 else outs[0]), state


def _initial(m, hx, n: int, dtype, batched: bool):
    """Per (layer, direction) initial states, each a tuple (h,) or (h, c)."""
    dirs = 2 if m.bidirectional else 1
    count = m.num_layers * dirs
    if hx is None:
        zeros = const(np.zeros((n, m.hidden_size)), dtype)
        h_size = getattr(m, "proj_size", 0) or m.hidden_size  # LSTM's h is projected
        h0 = zeros if h_size == m.hidden_size else const(np.zeros((n, h_size)), dtype)
        return [(h0, zeros) if m.mode == "LSTM" else (zeros,)] * count
    parts = list(hx) if m.mode == "LSTM" else [hx]
    if not batched:
        parts = [ops.unsqueeze(p, 1) for p in parts]
    split = [ops.split(p, [1] * count, 0) if count > 1 else [p] for p in parts]
    return [tuple(ops.squeeze(s[k], [0]) for s in split) for k in range(count)]


def _final(states: list, mode: str, batched: bool):
    def stack(i):
        t = ops.concat([ops.unsqueeze(s[i], 0) for s in states], 0)
        return t if batched else ops.squeeze(t, [1])

    return (stack(0), stack(1)) if mode == "LSTM" else stack(0)


@lowers(nn.RNN, nn.LSTM, nn.GRU)
def recurrent(ctx, m: nn.RNNBase, x: popxl.Tensor, hx=None) -> tuple:
    batched = x.rank == 3
    if not batched:
        x = ops.unsqueeze(x, 1)
    elif m.batch_first:
        x = ops.transpose(x, (1, 0, 2))
    states = _initial(m, hx, x.shape[1], x.dtype, batched)
    finals = []
    for layer in range(m.num_layers):
        if layer > 0:
            x = dropout(ctx, x, m.dropout, ctx.training)
        outs = []
        for d in range(2 if m.bidirectional else 1):
            y, final = _direction(
                ctx, m, x, states[layer * (1 + m.bidirectional) + d], layer, d == 1
            )
            outs.append(y)
            finals.append(final)
        x = ops.concat(outs, 2) if len(outs) > 1 else outs[0]
    out = x if not batched else (ops.transpose(x, (1, 0, 2)) if m.batch_first else x)
    if not batched:
        out = ops.squeeze(out, [1])
    return out, _final(finals, m.mode, batched)


# cells ---------------------------------------------------------------------------------------
def _cell_params(ctx, m):
    return [
        ctx.param(n) if m.bias or n.startswith("weight") else None
        for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    ]


def _cell(ctx, m, x, hx, mode: str):
    batched = x.rank == 2
    if not batched:
        x = ops.unsqueeze(x, 0)
    w_ih, w_hh, b_ih, b_hh = _cell_params(ctx, m)
    zeros = const(np.zeros((x.shape[0], m.hidden_size)), x.dtype)
    state: tuple[popxl.Tensor, ...] = (zeros, zeros) if mode == "LSTM" else (zeros,)
    if hx is not None:
        state = tuple(hx) if mode == "LSTM" else (hx,)
        state = state if batched else tuple(ops.unsqueeze(s, 0) for s in state)
    out = _step(mode, _linear(x, w_ih, b_ih), state, w_hh, b_hh)
    out = out if batched else tuple(ops.squeeze(s, [0]) for s in out)
    return out if mode == "LSTM" else out[0]


@lowers(nn.LSTMCell)
def _lstm_cell(ctx, m, x, hx=None):
    return _cell(ctx, m, x, hx, "LSTM")


@lowers(nn.GRUCell)
def _gru_cell(ctx, m, x, hx=None):
    return _cell(ctx, m, x, hx, "GRU")


@lowers(nn.RNNCell)
def _rnn_cell(ctx, m, x, hx=None):
    return _cell(ctx, m, x, hx, "RNN_RELU" if m.nonlinearity == "relu" else "RNN_TANH")
