"""LinearGrad with data-parallel replicas folded (sim/fold.py), where only the group
all-reduce after the backward graph reads its weight and bias gradients
(`ReplicaFold.together_into`, sim/fold_together.py): the site computes ``dx`` over all
replicas' rows (`dx_rest`), and the group writes every replica's ``dw`` (one batched GEMM)
and ``db`` (one sum over each replica's rows) straight into its rows (`grads_into`): the
arithmetic of `linear._folded_grads` (batched, summed), checked bit for bit against the
replicas' own calls at the group's first call.
"""

from __future__ import annotations

import torch

__all__ = ["dx_rest", "grads_into"]


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
