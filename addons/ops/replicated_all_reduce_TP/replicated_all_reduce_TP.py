"""Tensor-parallel all-reduces (popxl.addons' ``ReplicatedAllReduceTP`` op).

In tensor-parallel (Megatron-style) layers a tensor that is identical on every replica of a
group feeds sharded computation, and the sharded partial results are summed back into an
identical tensor. Two all-reduces express this; each is the other's gradient:

- `replicated_all_reduce_identical_inputs`: the input is already identical across the group,
  so the forward is the identity; the gradient (a partial sum on each shard) is all-reduced.
- `replicated_all_reduce_identical_grad_inputs`: the forward all-reduces the partial results;
  the gradient arriving is identical across the group, so it passes through unchanged.

On the IPU these are one custom op whose forward with identical inputs PopART's
``OpToIdentity`` pre-alias pattern turns into an Identity, and whose Opx refuses to lower such
an op ("You need to run the `OpToIdentityPattern` pattern before running the IR."): a program
must call `addons.patterns.apply_pre_alias_patterns` (after autodiff) before its Session. So
does this one: building a Session of a program that still holds an identical-inputs op raises.
This project's own composites (`cross_entropy_sharded_loss`) use `_all_reduce_identity_grad`,
whose gradient is that Identity from the start.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from popxl_core import ReplicaGrouping, Tensor, ops
from popxl_core.context import gcg
from popxl_core.ops.collectives.collectives import (
    group_table,
    reduce_values,
    resolve_group,
    to_collective_op,
)
from popxl_core.ops.registry import Cost, OpDef, Sample, create_op, register
from popxl_core.sim.ring import RING_FACTOR

__all__ = [
    "replicated_all_reduce",
    "replicated_all_reduce_identical_inputs",
    "replicated_all_reduce_identical_grad_inputs",
    "TP_ALL_REDUCE",
]

# a gradient exists for the linear reductions only (as for popxl's replicated_all_reduce)
_GRAD_OPS = ("add", "mean")


def _kernel(replica, x, values, *, op, table, **_flags):
    return reduce_values(op, [values[m] for m in table.members[replica]]).to(x.dtype)


def _emit(op, em) -> None:
    """Identity (a copy) for identical inputs; otherwise an all-reduce over the group."""
    if op.attrs["identical_inputs"]:  # as the IPU's Opx: the pattern must have removed it
        raise RuntimeError(
            f"{op.type}.{op.id} (replicated_all_reduce_identical_inputs, or the gradient of "
            "replicated_all_reduce_identical_grad_inputs): You need to run the "
            "`OpToIdentityPattern` pattern before running the IR. Call "
            "popxl_addons.patterns.apply_pre_alias_patterns(ir) after autodiff."
        )
    x, out = em.name(op.inputs[0]), em.name(op.outputs[0])
    table = group_table(op.attrs["group"], em.program.ir.replication_factor)
    attrs = {k: v for k, v in op.attrs.items() if k != "group"}
    fn = functools.partial(_kernel, table=table, **attrs)
    # an attribute on the partial, which the runtime reads (named in replica-mismatch errors)
    fn.op_name = f"{op.type}.{op.id}"  # type: ignore[attr-defined]
    em.emit(f"{out} = RT.collective({x}, {em.bind_global('coll', fn)})")


def _grad(ctx):
    """The adjoint swaps the two flags: identity <-> all-reduce."""
    a = ctx.attrs
    if a["op"] not in _GRAD_OPS:
        raise NotImplementedError(
            f"ReplicatedAllReduceTP with op {a['op']!r} has no gradient (only "
            f"{', '.join(_GRAD_OPS)})."
        )
    g = ctx.grad_output(0)
    if a.get("identity_grad"):
        return [ops.identity(g)]
    return [_create(g, a["op"], a["group"], a["identical_grad_inputs"], a["identical_inputs"])]


def _samples():
    # one replica in the op tests: both directions are the identity there. The identical-inputs
    # flavour needs the pattern before a Session (tests/test_addons_tp.py runs it).
    return [
        Sample(
            [np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)],
            lambda x, f=f: f(x),
            lambda x: x * 1,
            name=name,
        )
        for name, f in (
            ("identity_grad", lambda x: _all_reduce_identity_grad(x, "add", None)),
            ("replicated_all_reduce", replicated_all_reduce),
        )
    ]


TP_ALL_REDUCE = register(
    OpDef(
        "ReplicatedAllReduceTP",
        lambda ins, **attrs: [ins[0]],
        emit=_emit,
        grad=_grad,
        cost=lambda ins, outs, attrs: _cost(ins, attrs),
        samples=_samples,
        collective=True,
    )
)


def _ring_factor(attrs) -> float:
    """The link traffic of an all-reduce's ring (the cost model, sim/ring.py), none where the
    forward is the identity (identical inputs: PopART's OpToIdentity makes it a copy)."""
    return 0.0 if attrs["identical_inputs"] else 2.0


RING_FACTOR.register(TP_ALL_REDUCE, _ring_factor)


def _cost(ins, attrs) -> Cost:
    if attrs["identical_inputs"]:
        return Cost(0, 2 * ins[0].nbytes)
    return Cost(ins[0].nelms, 2 * ins[0].nbytes)


def _create(t: Tensor, op: str, group, identical_inputs: bool, identical_grad_inputs: bool):
    attrs = {
        "op": to_collective_op(op),
        "group": resolve_group(group, gcg().ir),
        "identical_inputs": bool(identical_inputs),
        "identical_grad_inputs": bool(identical_grad_inputs),
    }
    return create_op(TP_ALL_REDUCE, [t], attrs)[0]


def _all_reduce_identity_grad(t: Tensor, op: str, group) -> Tensor:
    """`replicated_all_reduce_identical_grad_inputs` with the pattern applied to its gradient
    already (an Identity): for composites standing in for one of Graphcore's C++ ops, whose
    gradient needs no pattern."""
    out = _create(t, op, group, False, True)
    out.producer.attrs["identity_grad"] = True
    return out


def replicated_all_reduce(
    t: Tensor, op: str = "add", group: Optional[ReplicaGrouping] = None
) -> Tensor:
    """All-reduce ``t`` over ``group`` (None: all replicas); its gradient is all-reduced too."""
    return _create(t, op, group, False, False)


def replicated_all_reduce_identical_inputs(
    t: Tensor, op: str = "add", group: Optional[ReplicaGrouping] = None
) -> Tensor:
    """``t`` is identical on the replicas of ``group``: the forward is the identity and the
    gradient is all-reduced over ``group``."""
    return _create(t, op, group, True, False)


def replicated_all_reduce_identical_grad_inputs(
    t: Tensor, op: str = "add", group: Optional[ReplicaGrouping] = None
) -> Tensor:
    """All-reduce ``t`` over ``group``; the gradient, identical on the replicas of ``group``,
    passes through unchanged."""
    return _create(t, op, group, False, True)
