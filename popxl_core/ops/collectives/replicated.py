"""Replicated collectives: all-reduce, reduce-scatter, all-gather and the RTS slices.

Gradients follow PopXL: all-reduce ('add', 'mean', 'local') is its own adjoint; a
reduce-scatter's gradient is an all-gather; an all-gather's gradient is the replica's own
slice (a 'local' reduce-scatter), which assumes the cotangent is the same on every replica.
A reduce-scatter pads the flattened tensor with zeros to a multiple of the group size, so a
shard has ``ceil(nelms / group_size)`` elements (RTS shards).
"""

from __future__ import annotations

import functools
from math import ceil, prod

import torch

from ...context import gcg
from ...sim.ring import RING_FACTOR
from ...sim.speed import declare
from ...tensor import Tensor, TensorSpec
from .._utils import rand
from ..forms import ReplicaReduce
from ..registry import Cost, OpDef, Sample, create_op, register
from .collectives import group_size, group_table, reduce_values, resolve_group, to_collective_op

__all__ = [
    "replicated_all_reduce",
    "replicated_all_reduce_",
    "replicated_reduce_scatter",
    "replicated_all_gather",
    "replica_sharded_slice",
    "replicated_slice",
]

_GRAD_OPS = ("add", "mean", "local")


def _collective_cost(ins, outs, attrs) -> Cost:
    return Cost(max(s.nelms for s in (*ins, *outs)), sum(s.nbytes for s in (*ins, *outs)))


def _emit_collective(kernel):
    """Emitter: bind the kernel with the op's replica group table, exchange unless 'local'."""

    def emit(op, em) -> None:
        table = group_table(op.attrs["group"], em.program.ir.replication_factor)
        attrs = {k: v for k, v in op.attrs.items() if k != "group"}
        fn = functools.partial(kernel, table=table, **attrs)
        # attributes on the partial, which the runtime reads (the type checker cannot see them)
        fn.op_name = f"{op.type}.{op.id}"  # type: ignore[attr-defined]  # in mismatch errors
        if kernel is _all_reduce_kernel:  # one result per group: the runtime computes it once
            fn.group_members = table.members  # type: ignore[attr-defined]
            # ... into a buffer it keeps, where the graph runs once a run (variants.py)
            keeps = em.graph in getattr(em.program, "keeps_buffers", ())
            fn.keeps_result = keeps  # type: ignore[attr-defined]
        k = em.bind_global("coll", fn)
        x, out = em.name(op.inputs[0]), em.name(op.outputs[0])
        if attrs.get("op") == "local":
            em.emit(f"{out} = {k}(RT.replica, {x}, None)")
        elif op.opdef.inplace or op.outputs[0] in getattr(em, "read", op.outputs):
            em.emit(f"{out} = RT.collective({x}, {k})")
        else:  # no op reads the result here (a follower's shared update does): no copy of it
            em.emit(f"{out} = RT.collective({x}, {k}, False)")
        if op.opdef.inplace:
            em.emit(f"{out} = {x}.copy_({out})")

    return emit


def _members(table, replica, values):
    return [values[m] for m in table.members[replica]]


# ReplicatedAllReduce(Inplace) ---------------------------------------------------------
def _all_reduce_kernel(replica, x, values, *, op, table, out=None):
    if op == "local":
        return x.clone()
    return reduce_values(op, _members(table, replica, values), out).to(x.dtype)


def _all_reduce_grad(ctx):
    op = ctx.attrs["op"]
    if op not in _GRAD_OPS:
        raise NotImplementedError(
            f"ReplicatedAllReduce with op {op!r} has no gradient (only {', '.join(_GRAD_OPS)})."
        )
    g = ctx.grad_output(0)
    return [g if op == "local" else replicated_all_reduce(g, op, ctx.attrs["group"])]


def _reduce_samples():
    return [
        Sample(
            [rand(2, 3)], lambda x, op=op: replicated_all_reduce(x, op), lambda x: x * 1, name=op
        )
        for op in ("add", "mean", "local")
    ] + [
        Sample(
            [rand(4)],
            lambda x: replicated_all_reduce(x, "max"),
            lambda x: x * 1,
            grad=False,
            name="max",
        )
    ]


ALL_REDUCE = register(
    OpDef(
        "ReplicatedAllReduce",
        lambda ins, op, group: [ins[0]],
        emit=_emit_collective(_all_reduce_kernel),
        grad=_all_reduce_grad,
        cost=_collective_cost,
        samples=_reduce_samples,
        collective=True,
    )
)
ALL_REDUCE_INPLACE = register(
    OpDef(
        "ReplicatedAllReduceInplace",
        lambda ins, op, group: [ins[0]],
        inplace=(0,),
        emit=_emit_collective(_all_reduce_kernel),
        grad=_all_reduce_grad,
        cost=_collective_cost,
        samples=lambda: [
            Sample([rand(3)], lambda x: replicated_all_reduce_(x * 1, "add"), lambda x: x * 1)
        ],
        collective=True,
    )
)


# in a folded program (sim/fold.py): the reduction over the replicas' rows, once; a sum or
# mean may be one sum over the replica dim where that gives its bits (sim/fold_reduce.py)
declare(ALL_REDUCE, replica_reduce=ReplicaReduce(summed=("add", "mean")))


def _all_reduce(opdef, t: Tensor, op: str, group) -> Tensor:
    op = to_collective_op(op)
    group = resolve_group(group, gcg().ir)
    return create_op(opdef, [t], {"op": op, "group": group})[0]


def replicated_all_reduce(t: Tensor, op: str = "add", group=None) -> Tensor:
    """Reduce ``t`` over the replicas of ``group`` (None: all replicas); every member gets
    the result."""
    return _all_reduce(ALL_REDUCE, t, op, group)


def replicated_all_reduce_(t: Tensor, op: str = "add", group=None) -> Tensor:
    """In-place `replicated_all_reduce`: ``t`` is overwritten and returned."""
    return _all_reduce(ALL_REDUCE_INPLACE, t, op, group)


# ReplicatedReduceScatter -----------------------------------------------------------------
def _scatter_infer(ins, op, group, group_size, configure):
    x = ins[0]
    meta = tuple(x.shape) if configure else ()
    return [TensorSpec((ceil(x.nelms / group_size),), x.dtype, meta)]


def _scatter_kernel(replica, x, values, *, op, table, group_size, configure):
    red = x if op == "local" else reduce_values(op, _members(table, replica, values))
    flat = red.to(x.dtype).reshape(-1)
    shard = ceil(flat.numel() / group_size)
    if flat.numel() < shard * group_size:
        flat = torch.cat([flat, flat.new_zeros(shard * group_size - flat.numel())])
    pos = table.position[replica]
    return flat[pos * shard : (pos + 1) * shard].clone()


def _scatter_grad(ctx):
    op = ctx.attrs["op"]
    if op not in _GRAD_OPS:
        raise NotImplementedError(
            f"ReplicatedReduceScatter with op {op!r} has no gradient (only {', '.join(_GRAD_OPS)})."
        )
    x = ctx.op.inputs[0]
    full = _gather(ctx.grad_output(0), ctx.attrs["group"], 0, "meta_shape", x.shape)
    if op == "mean":
        full = full * (1.0 / ctx.attrs["group_size"])
    return [full]


def _scatter_samples():
    def ref(x):
        return x.reshape(-1)

    return [
        Sample([rand(2, 3)], lambda x, op=op: replicated_reduce_scatter(x, op), ref, name=op)
        for op in ("add", "mean", "local")
    ]


REDUCE_SCATTER = register(
    OpDef(
        "ReplicatedReduceScatter",
        _scatter_infer,
        emit=_emit_collective(_scatter_kernel),
        grad=_scatter_grad,
        cost=_collective_cost,
        samples=_scatter_samples,
        collective=True,
    )
)


def replicated_reduce_scatter(
    t: Tensor, op: str = "add", group=None, configure_output_for_replicated_tensor_sharding=False
) -> Tensor:
    """Reduce ``t`` over the group and give each member one shard of the flattened result:
    shape ``(ceil(nelms / group_size),)``, zero-padded."""
    return _reduce_scatter(t, op, group, configure_output_for_replicated_tensor_sharding)


def _reduce_scatter(t: Tensor, op: str, group, configure: bool, out_name=None) -> Tensor:
    op = to_collective_op(op)
    ir = gcg().ir
    group = resolve_group(group, ir)
    attrs = dict(op=op, group=group, group_size=group_size(group, ir), configure=bool(configure))
    return create_op(REDUCE_SCATTER, [t], attrs, out_names=out_name and [out_name])[0]


def replica_sharded_slice(t: Tensor, group=None) -> Tensor:
    """This replica's RTS shard of ``t`` (flattened, padded), with ``meta_shape = t.shape``.

    Named ``<t.name>_sharded_slice`` as in PopXL (NamedTensors order their tensors by name).
    """
    return _reduce_scatter(t, "local", group, True, f"{t.name}_sharded_slice")


# ReplicatedAllGather ---------------------------------------------------------------------
def _gather_shape(x: TensorSpec, n: int, axis: int, mode: str, meta) -> tuple:
    if mode == "new_axis":
        return (*x.shape[:axis], n, *x.shape[axis:])
    if mode == "concat":
        return (*x.shape[:axis], x.shape[axis] * n, *x.shape[axis + 1 :])
    if prod(meta) > x.nelms * n:
        raise ValueError(
            f"meta_shape {tuple(meta)} has more elements than the {n} gathered "
            f"shards of shape {x.shape}"
        )
    return tuple(meta)


def _gather_infer(ins, group, group_size, axis, mode, meta):
    return [TensorSpec(_gather_shape(ins[0], group_size, axis, mode, meta), ins[0].dtype)]


def _gather_kernel(replica, x, values, *, table, group_size, axis, mode, meta):
    parts = _members(table, replica, values)
    if mode == "new_axis":
        return torch.stack(parts, axis)
    if mode == "concat":
        return torch.cat(parts, axis)
    return torch.cat([p.reshape(-1) for p in parts])[: prod(meta)].reshape(meta)


def _gather_grad(ctx):
    a = ctx.attrs
    g = ctx.grad_output(0)
    if a["mode"] == "meta_shape":
        return [replica_sharded_slice(g, a["group"])]
    # a 'new_axis' gather's axis has the group size: replicated_slice drops it again
    return [replicated_slice(g, a["axis"], a["group"])]


def _gather_samples():
    return [
        Sample(
            [rand(2, 3)],
            lambda x, m=m: replicated_all_gather(x, 1, output_shape=m),
            (lambda x: x.unsqueeze(1)) if m == "new_axis" else (lambda x: x * 1),
            name=m,
        )
        for m in ("concat", "new_axis")
    ] + [
        Sample(
            [rand(6)],
            lambda x: replicated_all_gather(replica_sharded_slice(x), output_shape="meta_shape"),
            lambda x: x * 1,
            name="meta_shape",
        )
    ]


ALL_GATHER = register(
    OpDef(
        "ReplicatedAllGather",
        _gather_infer,
        emit=_emit_collective(_gather_kernel),
        grad=_gather_grad,
        cost=_collective_cost,
        samples=_gather_samples,
        collective=True,
    )
)

_GATHER_MODES = ("auto", "concat", "new_axis", "meta_shape")


def _gather(t: Tensor, group, axis: int, mode: str, meta) -> Tensor:
    ir = gcg().ir
    group = resolve_group(group, ir)
    attrs = dict(
        group=group, group_size=group_size(group, ir), axis=axis, mode=mode, meta=tuple(meta)
    )
    return create_op(ALL_GATHER, [t], attrs)[0]


def replicated_all_gather(
    t: Tensor, axis: int = 0, group=None, output_shape: str = "auto"
) -> Tensor:
    """Gather ``t`` from every replica of the group, in replica order.

    ``output_shape``: 'concat' along ``axis``; 'new_axis' stacks at ``axis``; 'meta_shape'
    joins the flattened shards and reshapes to ``t.meta_shape`` (dropping RTS padding);
    'auto' is 'meta_shape' when ``t`` has a meta shape, else 'concat'.
    """
    if output_shape not in _GATHER_MODES:
        raise ValueError(
            f"replicated_all_gather: output_shape must be one of {_GATHER_MODES}, "
            f"got {output_shape!r}."
        )
    mode = output_shape
    if mode == "auto":
        mode = "meta_shape" if t.meta_shape else "concat"
    if mode == "meta_shape" and not t.meta_shape:
        raise ValueError(
            f"replicated_all_gather: {t.id!r} has no meta_shape; use output_shape='concat'."
        )
    rank = max(t.rank, 1) + (mode == "new_axis")
    if not -rank <= axis < rank:
        raise ValueError(
            f"replicated_all_gather: axis {axis} is out of range for {t.id!r} {t.shape}."
        )
    axis = axis % rank
    return _gather(t, group, axis, mode, t.meta_shape if mode == "meta_shape" else ())


def replicated_slice(t: Tensor, axis: int = 0, group=None) -> Tensor:
    """This replica's slice of ``t`` along ``axis`` (which the group size must divide).

    The rank is kept, except that an axis sliced down to size 1 is dropped, as PopXL does
    (its own test gathers a (4, 4, 3) tensor sliced over 4 replicas back as (4, 4, 3)).
    Its gradient is an all-gather.
    """
    from ..shape import reshape, transpose

    ir = gcg().ir
    n = group_size(resolve_group(group, ir), ir)
    if not -t.rank <= axis < max(t.rank, 1) or t.rank == 0:
        raise ValueError(f"replicated_slice: axis {axis} is out of range for {t.id!r} {t.shape}.")
    axis %= t.rank
    if t.shape[axis] % n:
        raise ValueError(
            f"replicated_slice: axis {axis} of {t.id!r} {t.shape} has size {t.shape[axis]}, "
            f"which the {n} replicas of the group do not divide."
        )
    perm = [axis, *[i for i in range(t.rank) if i != axis]]
    moved = transpose(t, perm) if axis else t
    shard = replicated_reduce_scatter(moved, "local", group)
    size = moved.shape[0] // n
    if size == 1:  # PopXL drops an axis sliced down to one element
        return reshape(shard, moved.shape[1:])
    part = reshape(shard, (size, *moved.shape[1:]))
    inverse = sorted(range(t.rank), key=lambda i: perm[i])
    return transpose(part, inverse) if axis else part


# a ring over the group: each replica sends this fraction of the tensor (sim/ring.py); an
# all-reduce is a reduce-scatter then an all-gather
RING_FACTOR.register(ALL_REDUCE, 2.0)
RING_FACTOR.register(ALL_REDUCE_INPLACE, 2.0)
RING_FACTOR.register(REDUCE_SCATTER, 1.0)
RING_FACTOR.register(ALL_GATHER, 1.0)
