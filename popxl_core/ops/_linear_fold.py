"""Linear and LinearGrad with data-parallel replicas folded (`folded_forward`: the
forward over all replicas' rows). LinearGrad folded (sim/fold.py), where only the group
all-reduce after the backward graph reads its weight and bias gradients
(`ReplicaFold.together_into`, sim/fold_together.py): the site computes ``dx`` over all
replicas' rows (`dx_rest`), and the group writes every replica's ``dw`` (one batched GEMM)
and ``db`` (one sum over each replica's rows) straight into its rows (`grads_into`): the
arithmetic of `linear._folded_grads` (batched, summed), checked bit for bit against the
replicas' own calls at the group's first call.
"""

from __future__ import annotations

import torch

__all__ = ["dx_rest", "folded_forward", "grads_into"]


def dx_rest(args, replicas, dead, has_bias):
    """``dx = g @ w`` over all replicas' rows (None where nothing reads it); None for
    ``dw`` (and ``db``)."""
    g, x, w = args
    dx = None if 0 in dead else g.reshape(-1, g.shape[-1]).mm(w).view(x.shape)
    return (dx, None, None) if has_bias else (dx, None)


def grads_into(calls, replicas, outs, has_bias):
    """Each call's ``dw`` into ``outs[k][0]`` (``(R, out, in)``) and ``db`` into
    ``outs[k][1]`` (``(R, out)``): replica r's from its own rows."""
    for (g, x, _w), dest in zip(calls, outs):
        gs = g.reshape(replicas, -1, g.shape[-1])
        torch.bmm(gs.transpose(1, 2), x.reshape(replicas, -1, x.shape[-1]), out=dest[0])
        if has_bias:
            torch.sum(gs, 1, out=dest[1])


def folded_forward(args, replicas, dead, buffers, fold, kernel, batched=False):
    """Replicas folded (sim/fold.py): ``x`` every replica's rows, ``w`` (and the bias)
    shared. One GEMM over all rows (``kernel``, the op's own), or ``batched``: one batched
    GEMM of R matrices, each replica's rows its own matrix, the GEMM shape of its own call
    (where MKL picks another kernel for R times the rows, as on the Intel Xeon host, this
    still gives each replica's bits; the site's check decides)."""
    x, w, *bias = args
    if not batched:
        return kernel(x, w, *bias, fold=fold)
    xs = x.reshape(replicas, -1, x.shape[-1])
    wt = w.t().expand(replicas, *w.t().shape)
    if bias and fold == "addmm":
        y = torch.baddbmm(bias[0], xs, wt)
    else:
        y = torch.bmm(xs, wt)
        if bias:
            y.add_(bias[0])
    return y.view(*x.shape[:-1], w.shape[0])
