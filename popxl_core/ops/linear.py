"""``linear``: ``x @ w.T + b`` with the kernels eager torch's ``F.linear`` and autograd use.

torch computes a linear layer in one of two ways, and they round differently: ``addmm`` (bias
folded into the GEMM) for 2-D inputs and contiguous N-D inputs, or ``mm`` followed by an
in-place bias add for other inputs (``at::linear``'s matmul path, e.g. the transposed input of
``nn.MultiheadAttention``'s projection). The ``fold`` attribute picks one, so a lowering that
knows eager's input layout reproduces eager's numbers bit for bit.

The gradient op is what autograd runs for both (``mm_mat1_backward``/``mm_mat2_backward`` of
a row-major input and the transposed weight, then ``sum_to`` for the bias):
``dx = g @ w``, ``dw = g.T @ x``, ``db = g.sum(0)``, all on the inputs flattened to 2-D.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..sim.speed import declare
from ..tensor import Tensor
from ._linear_fold import dx_rest, folded_forward, grads_into
from ._utils import rand, same_dtype, spec
from .collectives.collectives import divide_mean, summed
from .forms import ReplicaFold, ReplicaStack, fold_rows
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["linear"]

_FOLDS = ("addmm", "mm")


def _infer(ins, fold):
    if fold not in _FOLDS:
        raise ValueError(f"fold must be one of {_FOLDS}, got {fold!r}")
    x, w = ins[0], ins[1]
    same_dtype(*ins)
    if not x.dtype.is_floating_point:
        raise TypeError(f"linear needs floating point tensors, got {x.dtype.name}")
    if len(x.shape) < 2 or len(w.shape) != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"input {x.shape} (rank >= 2) and weight {w.shape} (out, in) do not fit")
    if len(ins) > 2 and tuple(ins[2].shape) != (w.shape[0],):
        raise ValueError(f"bias {ins[2].shape} must have shape ({w.shape[0]},)")
    return [spec((*x.shape[:-1], w.shape[0]), x.dtype)]


def _kernel(x, w, *bias, fold):
    if bias and fold == "addmm" and (x.dim() == 2 or (x.dim() == 3 and x.is_contiguous())):
        # at::linear's own addmm path (flattened to 2-D for a contiguous 3-D input): the
        # calls below in one (fewer Python calls a layer)
        return F.linear(x, w, bias[0])
    x2 = x.reshape(-1, x.shape[-1])
    if bias and fold == "addmm":
        y = torch.addmm(bias[0], x2, w.t())
    else:
        y = torch.mm(x2, w.t())
        if bias:
            y.add_(bias[0])
    return y.view(*x.shape[:-1], w.shape[0])


_FOLDED_FORWARD = tuple(  # tried in order (sim/batched_site.py), the first with the bits used
    functools.partial(folded_forward, kernel=_kernel, batched=b) for b in (0, 1)
)


def _grad_infer(ins, has_bias):
    g, x, w = ins
    outs = [x, w]
    return outs + [spec((w.shape[0],), w.dtype)] if has_bias else outs


def _grad_kernel(g, x, w, has_bias, skip_dx=False, dw_out=None):
    """``dx``, ``dw`` (and ``db``). The compiler's variants (`speed.DEAD_OUTPUT_KERNELS`,
    `speed.BUFFERED_KERNEL`): ``skip_dx`` when
    nothing reads ``dx`` (a first layer: eager skips that GEMM too), ``dw_out`` a buffer
    ``dw`` is written into (``mm(..., out=)`` is the same GEMM call: same bits)."""
    g2 = g.reshape(-1, g.shape[-1])
    dx = None if skip_dx else g2.mm(w).view(x.shape)
    dw = torch.mm(g2.t(), x.reshape(-1, x.shape[-1]), out=dw_out)
    return (dx, dw, g2.sum(0)) if has_bias else (dx, dw)


def _buffered_grad_kernel(op, dead: frozenset):
    """`_grad_kernel` writing ``dw`` into one buffer kept for the program's life, for an op the
    compiler knows runs at most once per run and whose ``dw`` dies within it (a training
    step's weight gradients: allocating them fresh each step lets the allocator hand the
    memory back to the OS and fault it in again, ~1/3 of the seed MLP's batch-8 step).
    None: not offered."""
    if not dead <= {0}:
        return None
    w_spec = op.inputs[2]
    buf = torch.empty(tuple(w_spec.shape), dtype=w_spec.dtype.as_torch())
    return functools.partial(_grad_kernel, skip_dx=0 in dead, dw_out=buf)


def _folded_grads(args, replicas, dead, buffers, has_bias, batched=True, sums=True):
    """Replicas folded (sim/fold.py): ``g``, ``x`` every replica's rows, ``w`` shared.
    ``dx`` as one GEMM over all rows, the R ``dw`` as one batched GEMM (replicas stacked too;
    ``batched=False``: each replica's own GEMM, into its part of one buffer), the R ``db``
    as one sum over each replica's rows (``sums=False``: each replica's own sum); ``dw``,
    ``db`` as ``(R*out, ...)``."""
    g, x, w = args
    g2 = g.reshape(-1, g.shape[-1])
    dx = None if 0 in dead else g2.mm(w).view(*g.shape[:-1], w.shape[1])
    gs = g2.view(replicas, -1, g.shape[-1])
    xs = x.reshape(replicas, -1, x.shape[-1])
    out = _kept(buffers, (replicas, *w.shape), w.dtype)
    if batched:
        dw = torch.bmm(gs.transpose(1, 2), xs, out=out)
    else:
        dw = torch.empty((replicas, *w.shape), dtype=w.dtype) if out is None else out
        for r in range(replicas):
            torch.mm(gs[r].t(), xs[r], out=dw[r])
    dw = dw.view(-1, w.shape[1])
    if not has_bias:
        return dx, dw
    db = gs.sum(1).view(-1) if sums else torch.cat([part.sum(0) for part in gs])
    return dx, dw, db


def _reduced_grads(
    args, replicas, dead, buffers, reduce, has_bias, batched=True, sums=True, blocked=False
):
    """`_folded_grads` with ``dw`` (and ``db``) already all-reduced where ``reduce`` says
    (`ReplicaFold.reduced`). ``dw``: replica 0's GEMM into one weight-sized buffer, each
    later replica's GEMM added onto it (its product, then one rounding add: the all-reduce's
    in-order sum where the GEMM adds C after its K loop, as the check finds), a mean divided
    after: ``torch.addbmm`` with ``beta=0`` (ATen's CPU loop of those ``addmm_`` calls, in
    one call), or ``batched=False`` the calls one by one; no ``(R, out, in)`` stack is
    written and read again and no separate sum is run. ``blocked``: all of that per block of
    ``dw``'s rows that fits in a core's L2 cache (`BLOCK_BYTES`), so the R passes over a block
    and its division hit L2, not L3 (each block's GEMMs are smaller ones: the site's check
    decides whether they give the same bits). ``db``: the replicas' sums summed over the
    replica dim."""
    if 1 not in reduce:  # the bias's all-reduce alone
        dx, dw, db = _folded_grads(args, replicas, dead, buffers, has_bias, batched, sums)
        return dx, dw, _reduced_sum(db.view(replicas, -1), reduce[2], buffers)
    g, x, w = args
    g2 = g.reshape(-1, g.shape[-1])
    dx = None if 0 in dead else g2.mm(w).view(*g.shape[:-1], w.shape[1])
    gs = g2.view(replicas, -1, g.shape[-1])
    xs = x.reshape(replicas, -1, x.shape[-1])
    dw, parts = _dw_blocks(buffers, w, blocked)
    _reduced_dw(dw, parts, gs.transpose(1, 2), xs, batched, reduce[1] == "mean")
    if not has_bias:
        return dx, dw
    db = gs.sum(1) if sums else torch.stack([part.sum(0) for part in gs])
    return dx, dw, _reduced_sum(db, reduce[2], buffers) if 2 in reduce else db.view(-1)


# a block of a reduced weight gradient's rows (`_reduced_grads`, ``blocked``) is at most this
# many bytes: the AMD EPYC host's L2 is 1 MiB a core (measured on the seed MLP r4 step, one
# thread: 768 KiB blocks ~2 % faster than the whole 1.6 MB gradient, 384 and 512 KiB less)
BLOCK_BYTES = 768 * 2**10


def _row_blocks(shape, itemsize: int, blocked: bool) -> tuple:
    """``(start, end)`` of each block of a ``(out, in)`` gradient's rows: as many blocks as
    `BLOCK_BYTES` needs, of equal rows rounded up to a multiple of 16 (a GEMM's row tile; the
    last block takes the rest); one block ``(0, out)`` unless ``blocked``."""
    return _blocks(tuple(shape), itemsize, BLOCK_BYTES if blocked else 0)


@functools.lru_cache(maxsize=256)
def _blocks(shape: tuple, itemsize: int, block_bytes: int) -> tuple:
    rows, row_bytes = shape[0], shape[1] * itemsize
    n = -(-rows * row_bytes // block_bytes) if block_bytes else 1
    step = -(-rows // max(n, 1))
    step = min(rows, -(-step // 16) * 16)
    return tuple((s, min(s + step, rows)) for s in range(0, rows, step))


def _dw_blocks(buffers, w, blocked: bool) -> tuple:
    """The weight gradient's buffer (kept in ``buffers`` where given, with its blocks: the
    blocks the site's first call checked stay, whatever `BLOCK_BYTES` is later) and, where it
    has several `_row_blocks`, each block's rows of it and their slice."""
    key = ("blocks", tuple(w.shape), w.dtype, blocked)
    found = buffers.get(key) if buffers is not None else None
    if found is not None:
        return found
    dw = _kept(buffers, tuple(w.shape), w.dtype)
    if dw is None:
        dw = torch.empty(tuple(w.shape), dtype=w.dtype)
    blocks = _row_blocks(w.shape, w.element_size(), blocked)
    parts = [(dw[s:e], slice(s, e)) for s, e in blocks] if len(blocks) > 1 else []
    if buffers is not None:
        buffers[key] = dw, parts
    return dw, parts


def _reduced_dw(dw, parts, gT, xs, batched: bool, mean: bool) -> None:
    """``dw`` = the replicas' ``gT[r] @ xs[r]`` added in replica order, then divided by R
    for a mean (`divide_mean`), block by block where `_dw_blocks` gave ``parts``; one
    Python call a site (each counts in a step of small ops)."""
    r = gT.shape[0]
    for out, rows in parts or ((dw, None),):
        a = gT if rows is None else gT[:, rows]
        if batched:
            torch.addbmm(out, a, xs, beta=0, out=out)
        else:
            torch.mm(a[0], xs[0], out=out)
            for i in range(1, r):
                out.addmm_(a[i], xs[i])
        if mean:
            divide_mean(out, r)


def _reduced_sum(rows, kind: str, buffers):
    """The replicas' values ``rows`` ``(R, n)`` summed over the replica dim (a mean divided
    after), into a kept buffer where given."""
    out = _kept(buffers, tuple(rows.shape[1:]), rows.dtype)
    if kind == "mean" and rows.dtype in (torch.float32, torch.float64):
        # ATen's CPU mean of these dtypes: this sum, then ``div_`` by R (one Python call,
        # not two; half types take another path)
        return torch.mean(rows, 0, out=out)
    return summed(rows, kind, out)


def _folded_variant(batched: bool, sums: bool):
    def grads(args, replicas, dead, buffers, has_bias):
        return _folded_grads(args, replicas, dead, buffers, has_bias, batched, sums)

    return grads


# tried in order (sim/batched_site.py): the first giving every replica's bits is used
_FOLDED_GRADS = tuple(_folded_variant(b, s) for b in (True, False) for s in (True, False))
_REDUCED_GRADS = tuple(
    functools.partial(_reduced_grads, batched=b, sums=s, blocked=k)
    for k in (True, False)
    for b in (True, False)
    for s in (True, False)
)


def _kept(buffers, shape, dtype):
    if buffers is None:
        return None
    if shape not in buffers:
        buffers[shape] = torch.empty(shape, dtype=dtype)
    return buffers[shape]


def _cost(ins, outs, attrs) -> Cost:
    x, w = ins[0], ins[1]
    rows = x.nelms // x.shape[-1]
    return Cost(2 * rows * w.shape[0] * w.shape[1], sum(s.nbytes for s in (*ins, *outs)))


def _grad_cost(ins, outs, attrs) -> Cost:
    fwd = _cost(ins[1:], outs[:1], attrs)
    return Cost(2 * fwd.flops, sum(s.nbytes for s in (*ins, *outs)))


def _grad(ctx):
    ins = [ctx.grad_output(0), ctx.input(0), ctx.input(1)]
    has_bias = len(ctx.op.inputs) > 2
    return create_op(LINEAR_GRAD, ins, {"has_bias": has_bias})


def _seq_first_linear(x, w, b):
    """F.linear on a non-contiguous input with a weight that requires grad (at::matmul then
    folds the input into a matrix; without grad it would batch the GEMM instead)."""
    x = x.transpose(0, 1).contiguous().transpose(0, 1)
    if w.requires_grad:  # the harness's gradient check
        return torch.nn.functional.linear(x, w, b)
    with torch.enable_grad():
        return torch.nn.functional.linear(x, w.detach().requires_grad_(), b).detach()


def _samples():
    """Bitwise (rtol=atol=0) against F.linear and autograd on the same layouts."""
    x2, x3, w, b = rand(6, 5, seed=1), rand(2, 3, 5, seed=2), rand(4, 5, seed=3), rand(4, seed=4)
    exact = {"rtol": 0.0, "atol": 0.0}
    return [
        Sample(
            [x2, w, b],
            lambda x, w, b: linear(x, w, b),
            torch.nn.functional.linear,
            name="2d_addmm",
            **exact,
        ),
        Sample(
            [x3, w, b],
            lambda x, w, b: linear(x, w, b),
            torch.nn.functional.linear,
            name="3d_addmm",
            **exact,
        ),
        Sample(
            [x3, w], lambda x, w: linear(x, w), torch.nn.functional.linear, name="no_bias", **exact
        ),
        # eager's matmul path: a non-contiguous 3-D input (seq-first view of batch-first data)
        Sample(
            [x3, w, b],
            lambda x, w, b: linear(x, w, b, fold="mm"),
            _seq_first_linear,
            name="3d_mm",
            **exact,
        ),
    ]


def _grad_samples():
    def build(g, x, w, b):
        return tuple(create_op(LINEAR_GRAD, [g, x, w], {"has_bias": True}))

    def ref(g, x, w, b):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        with torch.enable_grad():
            return torch.autograd.grad(torch.nn.functional.linear(x, w, b), (x, w, b), g)

    inputs = [rand(2, 3, 4, seed=5), rand(2, 3, 5, seed=6), rand(4, 5, seed=7), rand(4, seed=8)]
    return [Sample(inputs, build, ref, grad=False, rtol=0.0, atol=0.0)]


LINEAR = register(
    OpDef(
        "Linear",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="linear_out",
    )
)
declare(
    LINEAR,
    replica_stack=ReplicaStack(shared=(1, 2)),
    replica_fold=ReplicaFold(rows=fold_rows(0).rows, kernels=_FOLDED_FORWARD),
)
LINEAR_GRAD = register(
    OpDef(
        "LinearGrad",
        _grad_infer,
        _grad_kernel,
        cost=_grad_cost,
        samples=_grad_samples,
        out_name="linear_grad_out",
    )
)
declare(
    LINEAR_GRAD,
    dead_output_kernels={frozenset({0}): functools.partial(_grad_kernel, skip_dx=True)},
    buffered_kernel=_buffered_grad_kernel,
    replica_stack=ReplicaStack(shared=(2,)),
    replica_fold=ReplicaFold(
        rows=fold_rows(0, 1).rows,
        kernels=_FOLDED_GRADS,
        reduced=_REDUCED_GRADS,
        reduces=(1, 2),
        together=grads_into,
        together_into=True,
        together_outputs=(1, 2),
        rest=dx_rest,
    ),
)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, fold: str = "addmm") -> Tensor:
    """``x @ weight.T + bias`` (weight is (out, in), torch's layout) over the last axis of
    ``x``. ``fold="addmm"`` adds the bias inside the GEMM, as eager does for 2-D and
    contiguous inputs; ``fold="mm"`` multiplies first and adds after, as eager does for a
    non-contiguous N-D input."""
    ins = [x, weight] + ([bias] if bias is not None else [])
    return create_op(LINEAR, ins, {"fold": fold})[0]
