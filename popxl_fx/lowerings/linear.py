"""matmul/mm/bmm/addmm/baddbmm/outer, einsum (any number of operands, contracted pairwise
into matmuls), embedding (padding_idx rows get no gradient) and nn.Identity.

(nn.Linear and F.linear live in basic.py.)
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const, promote, single
from .aten_kernels import (
    Method,
    eager_requires_grad,
    eager_stride,
    lower_as_eager_matmul,
    torch_call,
)

__all__ = ["einsum", "embedding"]


@lowers(torch.matmul, operator.matmul, "matmul", "__matmul__", torch.mm, "mm", torch.bmm, "bmm")
def _matmul(ctx, a, b):
    fn = _EAGER_FN.get(ctx.node.target, torch.matmul)
    if any(eager_stride(x) for x in ctx.node.args[:2]) or _folds_in_eager(ctx, fn, a, b):
        # a transposed view in eager (q @ k.transpose(-2, -1)), or a matrix times a batch that
        # eager folds into one mm: BLAS and autograd's backward round by the operands' layout
        # and by the kernel at::matmul picks, so torch's own call as eager made it
        return lower_as_eager_matmul(ctx, fn, a, b)
    a, b = promote(a, b)
    return ops.matmul(a, b)


_EAGER_FN = {torch.mm: torch.mm, "mm": torch.mm, torch.bmm: torch.bmm, "bmm": torch.bmm}


def _folds_in_eager(ctx, fn, a, b) -> bool:
    """``w @ x`` of a matrix (or vector) ``w`` and a batch ``x``: at::matmul makes it one mm on
    ``x``'s rows (then a transposed view) when ``w`` requires grad, and one bmm of the expanded
    ``w`` otherwise; the simulator's operands never require grad, and MatMul's gradient sums
    per-batch products. (A batch times a matrix is folded either way, as MatMul does.) Under
    ``Options(numerics="ipu")``: PopXL's MatMul, as `linear`."""
    if fn is not torch.matmul or not a.rank <= 2 < b.rank or popxl.gcg().ir.numerics == "ipu":
        return False
    return eager_requires_grad(ctx.node.args[0])


@lowers(torch.addmm, "addmm", torch.baddbmm, "baddbmm", torch.addmv, "addmv")
def _addmm(ctx, *args, **kwargs):
    # BLAS accumulates the product into beta * bias: torch's own kernel, bit for bit. The
    # arguments pass through as the user wrote them: each op names its operands differently
    # (mat1/mat2, batch1/batch2, mat/vec) and BLOOM's alibi passes them by keyword.
    fn = Method(ctx.node.target) if isinstance(ctx.node.target, str) else ctx.node.target
    return torch_call(fn, *args, **kwargs)


@lowers(torch.outer, "outer", torch.ger)
def _outer(ctx, a, b):
    return ops.unsqueeze(a, 1) * ops.unsqueeze(b, 0)


@lowers(torch.dot, "dot", torch.inner)
def _dot(ctx, a, b):
    return torch_call(torch.inner if ctx.node.target is torch.inner else torch.dot, a, b)


@lowers(nn.Identity)
def _identity(ctx, m, x, *args, **kwargs):
    return x


# einsum --------------------------------------------------------------------------------------
def _parse(equation: str, operands: Sequence) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, out = eq.split("->") if "->" in eq else (eq, None)
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum {equation!r}: {len(terms)} terms for {len(operands)} operands")
    free = "".join(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq)
    ell = max((t.rank - len(s.replace("...", "")) for s, t in zip(terms, operands)), default=0)
    terms = [_fill(s, t, free, ell) for s, t in zip(terms, operands)]
    if out is None:
        counts = {c: "".join(terms).count(c) for c in set("".join(terms))}
        out = free[:ell] + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in free))
    else:
        out = out.replace("...", free[:ell])
    return terms, out


def _fill(term: str, t, free: str, ell: int) -> str:
    if "..." not in term:
        if len(term) != t.rank:
            raise ValueError(f"einsum term {term!r} does not match an operand of rank {t.rank}")
        return term
    n = t.rank - len(term.replace("...", ""))
    return term.replace("...", free[ell - n : ell])


def _reduce_own(t, term: str, keep: str):
    """Sum the letters only this operand has; take diagonals of repeated letters."""
    if len(set(term)) != len(term):
        raise NotImplementedError(f"einsum: repeated index in {term!r} (diagonal) is not supported")
    drop = [i for i, c in enumerate(term) if c not in keep]
    if drop:
        t = ops.sum(t, tuple(drop))
        term = "".join(c for c in term if c in keep)
    return t, term


def _pair(a, ta: str, b, tb: str, keep: str):
    """Contract two operands: batch (both, kept) x free x contracted -> one matmul."""
    batch = [c for c in ta if c in tb and c in keep]
    contract = [c for c in ta if c in tb and c not in keep]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    size = {c: n for term, t in ((ta, a), (tb, b)) for c, n in zip(term, t.shape)}
    size.update(
        {c: max(dict(zip(ta, a.shape)).get(c, 1), dict(zip(tb, b.shape)).get(c, 1)) for c in batch}
    )
    a = _arrange(a, ta, batch + fa + contract, size, [len(batch), len(fa), len(contract)])
    b = _arrange(b, tb, batch + contract + fb, size, [len(batch), len(contract), len(fb)])
    y = ops.matmul(a, b)
    shape = [size[c] for c in batch + fa + fb]
    return ops.reshape(y, shape), "".join(batch + fa + fb)


def _arrange(t, term: str, order: list, size: dict, groups: list):
    perm = [term.index(c) for c in order]
    if perm != list(range(len(perm))):
        t = ops.transpose(t, perm)
    full = [size[c] for c in order]
    if tuple(t.shape) != tuple(full):
        t = ops.expand(t, full)  # broadcast batch dims of size 1
    dims, at = [], 0
    for g in groups:
        dims.append(int(np.prod(full[at : at + g])) if g else 1)
        at += g
    return ops.reshape(t, dims)


def einsum(equation: str, *operands) -> popxl.Tensor:
    """torch.einsum, contracting left to right."""
    operands = single(operands)
    terms, out = _parse(equation, operands)
    rest = [set("".join(terms[i + 1 :])) | set(out) for i in range(len(terms))]
    acc, term = _reduce_own(operands[0], terms[0], "".join(rest[0]) + "".join(terms[1:2]))
    for i in range(1, len(terms)):
        b, tb = _reduce_own(operands[i], terms[i], "".join(rest[i]) + term)
        acc, term = _pair(acc, term, b, tb, "".join(rest[i]))
    acc, term = _reduce_own(acc, term, out)
    perm = [term.index(c) for c in out]
    return ops.transpose(acc, perm) if perm != list(range(len(perm))) else acc


@lowers(torch.einsum)
def _einsum(ctx, equation, *operands):
    return einsum(equation, *operands)


# embedding -----------------------------------------------------------------------------------
def embedding(
    indices: popxl.Tensor, weight: popxl.Tensor, padding_idx: int | None = None
) -> popxl.Tensor:
    """weight[indices]; rows at ``padding_idx`` are read but receive no gradient (torch)."""
    if not indices.dtype.is_int:
        raise TypeError(f"embedding indices must be integers, got {indices.dtype.name}")
    rows = ops.gather(weight, indices, 0)
    if padding_idx is None:
        return rows
    pad = padding_idx % weight.shape[0]
    is_pad = ops.unsqueeze(ops.equal(indices, const(pad, indices.dtype)), indices.rank)
    return ops.where(is_pad, ops.detach(rows), rows)


@lowers(F.embedding)
def _embedding(
    ctx,
    indices,
    weight,
    padding_idx=None,
    max_norm=None,
    norm_type=2.0,
    scale_grad_by_freq=False,
    sparse=False,
):
    if max_norm is not None or scale_grad_by_freq:
        raise NotImplementedError("embedding: max_norm and scale_grad_by_freq are not supported")
    return embedding(indices, weight, padding_idx)


@lowers(nn.Embedding)
def _embedding_module(ctx, m, indices):
    if m.max_norm is not None or m.scale_grad_by_freq:
        raise NotImplementedError(
            f"{ctx.module_path}: Embedding max_norm and scale_grad_by_freq are not supported"
        )
    return embedding(indices, ctx.param("weight"), m.padding_idx)
