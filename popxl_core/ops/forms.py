"""The rule types of the simulator's speed variants of an op (`popxl_core.sim.speed`).

The rewrites in ``popxl_core/sim/`` (multi-tensor groups, ``out=`` reuse, direct torch calls,
fused transposes, joint convolution gradients, replica folding and stacking) recognise ops
only through the sim's tables keyed by the op's `OpDef`; an op module registers its rules
there next to its kernel (``speed.declare(ROW, ...)``), with these types:

* `Foreach`: the op's multi-tensor form (``speed.FOREACH``; sim/foreach.py);
* ``speed.OUT_KERNEL``: a torch function taking ``out=``, the same arithmetic as the kernel
  (sim/inplace.py writes the result into a dead input);
* ``speed.DIRECT``: the torch call written into the generated code (sim/direct.py);
* ``speed.TRANSPOSED_KERNEL`` / ``speed.MATRIX_TRANSPOSE``: ``(a op b).T`` in one kernel
  (sim/fuse.py);
* `JointGrad`: two gradient ops computed by one call (sim/conv_pairs.py);
* `ReplicaStack`: where replicas in lock step call the op's `ReplicaFold` forms as one call
  (sim/stacking.py);
* `ReplicaReduce`: how a collective over every replica runs in a folded program
  (sim/fold.py, sim/fold_reduce.py).

This module also holds the helpers the multi-tensor forms share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from .. import dtypes
from ..graph import Op
from ..tensor import Constant, Tensor

__all__ = [
    "Foreach",
    "JointGrad",
    "ReplicaFold",
    "ReplicaReduce",
    "ReplicaStack",
    "FOLD_ROWS",
    "fold_rows",
    "fold_elementwise",
    "fold_indexed",
    "fold_axis",
    "Targets",
    "binary_direct",
    "binary_foreach",
    "columns",
    "float32_only",
    "multi_tensor_foreach",
    "shared_identity",
    "unary_foreach",
]

# (mode, input index) pairs a group may write its results into ("in0": the per-tensor operand,
# "in1": input 1 of a commutative op of two tensors); empty: the group always allocates
Targets = List[Tuple[str, int]]


@dataclass(frozen=True)
class Foreach:
    """An op's multi-tensor form: ops of one type whose ``key`` is equal run as one call.

    Args:
        key: ``op -> tuple | None``: what ops must share to run as one kernel (operand roles,
            shared scalar tensors, attributes); None for an op that is never grouped. The
            compiler prefixes the op type.
        kernel: ``(ops, key, mode) -> fn`` with ``fn(*inputs of every op, flattened) ->
            (output 0 of every op)``; ``mode`` is "fresh", "in0" or "in1" (see ``targets``).
        targets: ``key -> [(mode, input)]`` for ops that may instead write into a dead input
            of their own, as ``out=`` reuse does (None: the group's mode stays "fresh").
        any_dtype: group ops of any dtype (default: float32 only).
    """

    key: Callable[[Op], Optional[tuple]]
    kernel: Callable[[Sequence[Op], tuple, str], Callable]
    targets: Optional[Callable[[tuple], Targets]] = None
    any_dtype: bool = False


@dataclass(frozen=True)
class JointGrad:
    """Gradient ops of one forward op (a "weight" role and a "data" and/or a "bias" one) that
    read the same output gradient (input 0) and may be computed by one call
    (sim/conv_pairs.py).

    Args:
        role: "data", "weight" or "bias".
        eligible: ``op -> bool``: this op may join a call (attributes, dtypes).
        matches: ``(data or bias op, weight op) -> bool``: the two are one forward op's
            gradients.
        kernel: ``(weight op, (data?, True, bias?)) -> fn`` with ``fn(dy, x, w) -> (dx, dw,
            db)`` (None where not asked); ``x`` is the weight op's input 1, ``w`` the data
            op's input 1 or the bias op's input 2.
    """

    role: str
    eligible: Callable[[Op], bool]
    matches: Callable[[Op, Op], bool]
    kernel: Callable[[Op, Tuple[bool, bool, bool]], Callable]


@dataclass(frozen=True)
class ReplicaStack:
    """Where the calls of this op by replicas in lock step may become one call
    (sim/stacking.py): where the ``shared`` inputs are the same memory on every replica (the
    weights that sim/uniform.py shares) and the others have the same shape on every
    replica, the op's `ReplicaFold` forms run once over those others concatenated along
    dim 0 (a GEMM over R*b rows reads the weight once instead of R times; R weight
    gradients in one batched GEMM), each replica given its part. Used only where, on the
    actual shapes, that gives every replica the bits its own kernel gives (checked once
    per shape at run time).

    Args:
        shared: indexes of the inputs that must be one tensor on every replica; the
            others are per replica in the op's ``fold`` rule.
    """

    shared: Tuple[int, ...]


@dataclass(frozen=True)
class ReplicaReduce:
    """How this collective over every replica runs in a folded program (sim/fold.py), where
    each replica's value is its rows of one tensor: the op's own reduction of the replicas'
    values in replica order, once (the same function of the same values: the same bits),
    one result for all replicas.

    Args:
        summed: the reductions (the op's ``op`` attribute) that one sum over the replica
            dim may make instead (`collectives.summed`; sim/fold_reduce.py): alone into a
            kept buffer, in one call for a run of consecutive ones, or by the folded op
            making the value (`ReplicaFold.reduced`); each checked bit for bit against the
            op's own reduction at its first run.
    """

    summed: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplicaFold:
    """How R data-parallel replicas' calls of this op become one call over their values
    concatenated along dim 0 (sim/fold.py): a per-replica input of shape ``(b, ...)`` is one
    tensor ``(R*b, ...)``, the replicas' rows in replica order; an input the same on every
    replica (a weight) is one tensor of its own shape. Used only where, on the actual shapes,
    the folded call gives every replica the bits its own call gives (checked once per shape
    at run time; else the replicas' calls are made one by one).

    Args:
        rows: ``(attrs, per-replica input shapes, which inputs are per replica) -> bool``:
            the kernel on the concatenated inputs (attributes from ``attrs``) computes each
            replica's outputs as its own rows of dim 0, in replica order.
        attrs: ``(attrs, replicas) -> attrs`` of the folded call (None: the op's own).
        kernels: folded kernels of its own, tried in order (the first giving every
            replica's bits is used), ``(args, replicas, dead, buffers, **attrs) -> outputs``
            (``dead``: the indexes of outputs nothing reads, None there; ``buffers``: a dict
            to keep output buffers in between runs, or None); outputs not batch-major (a
            weight gradient per replica) as ``(R*out, ...)`` all the same, a rank-0 output
            (a replica's loss) as ``(R,)``.
        reduced: folded kernels, tried in order, that return outputs ``reduces`` already
            all-reduced over every replica where only such an all-reduce reads them (a
            weight gradient: the R values added in replica order, a mean divided after, as
            the all-reduce does; sim/fold_reduce.py fuses the pair and checks the bits),
            ``(args, replicas, dead, buffers, reduce, **attrs)``, ``reduce``: output index
            -> ``"add"`` or ``"mean"`` (the other outputs as ``kernels`` return them).
        reduces: the output indexes ``reduced`` can all-reduce.
        exact: the folded call gives every replica's bits by construction, whatever the
            kernel's blocking: it only moves data (a view, a reshape) or rounds each element
            once from that element's operands (IEEE add, sub, mul). Then it is emitted as
            the op's own call with the folded attributes (inline where the op is direct),
            unchecked, instead of a checked site.
        together: outputs ``together_outputs`` of several calls of the op (the same shapes
            and attributes) in one call, where only one group all-reduce reads them (the
            parameter gradients of a network's layer norms, sim/fold_together.py):
            ``(list of K calls' args, replicas, **attrs) -> per output, one contiguous
            (R, K, ...) tensor: call k's value on replica r at [r, k]``. The calls
            themselves then run ``rest``.
        together_into: ``together`` is ``(calls, replicas, outs, **attrs) -> None``
            instead, writing call k's output m, every replica's, into ``outs[k][m]``
            (``(R, ...)``, a view of the group's rows): its calls need not share shapes.
        together_outputs: the output indexes ``together`` computes (all only a group reads).
        rest: ``(args, replicas, dead, **attrs) -> outputs, None at together_outputs``: one
            call's other outputs, over all replicas' rows (``dead``: as for ``kernels``).
    """

    rows: Callable[..., bool]
    attrs: Optional[Callable[[dict, int], dict]] = None
    kernels: Tuple[Callable[..., Tuple[object, ...]], ...] = ()
    reduced: Tuple[Callable[..., Tuple[object, ...]], ...] = ()
    reduces: Tuple[int, ...] = ()
    exact: bool = False
    together: Optional[Callable[..., List[List[object]]]] = None
    together_into: bool = False
    together_outputs: Tuple[int, ...] = ()
    rest: Optional[Callable[..., Tuple[object, ...]]] = None


def _all_rows(attrs, shapes, per) -> bool:
    return True


# an op computing each row of dim 0 from that row of each input (all batch-major)
FOLD_ROWS = ReplicaFold(rows=_all_rows)


def fold_rows(
    *batch_inputs: int, attrs: Optional[Callable[[dict, int], dict]] = None, exact: bool = False
):
    """An op computing each row of dim 0 from that row of inputs ``batch_inputs`` and the
    whole of the others (weights, biases), which must then be the same on every replica
    (``exact``: `ReplicaFold.exact`)."""

    def rows(attrs, shapes, per) -> bool:
        return not any(p for i, p in enumerate(per) if i not in batch_inputs)

    return ReplicaFold(rows=rows, attrs=attrs, exact=exact)


def _elementwise_rows(attrs, shapes, per) -> bool:
    """Broadcasting operands: the per-replica ones have the output's rank and dim 0 (no
    broadcast across rows), a shared one broadcasts over dim 0 (lower rank or dim 0 of 1)."""
    rank = max(len(s) for s in shapes)
    lead = [s[0] for s, p in zip(shapes, per) if p]
    if any(len(s) != rank for s, p in zip(shapes, per) if p) or len(set(lead)) != 1:
        return False
    return all(len(s) < rank or s[0] == 1 for s, p in zip(shapes, per) if not p)


def fold_elementwise(exact: bool = False) -> ReplicaFold:
    """Elementwise ops over broadcast operands (``exact``: each element rounded once from its
    own operands, `ReplicaFold.exact`)."""
    return ReplicaFold(rows=_elementwise_rows, exact=exact)


def fold_axis(*names: str, every: bool = False, attrs=None) -> ReplicaFold:
    """An op acting along the axes named by attributes ``names`` (ints or sequences) of its
    first input, row-wise elsewhere: folds where none of them is axis 0 (``every``: and
    every input is per replica, as a concatenation's must be)."""

    def rows(attrs, shapes, per) -> bool:
        if every and not all(per):
            return False
        rank = len(shapes[0])
        for name in names:
            value = attrs.get(name)
            axes = value if isinstance(value, (tuple, list)) else (value,)
            if any(a is None or int(a) % max(rank, 1) == 0 for a in axes):
                return False
        return True

    return ReplicaFold(rows=rows, attrs=attrs)


def _indexed_rows(attrs, shapes, per) -> bool:
    return tuple(per) == (False, True) and attrs["axis"] % len(shapes[0]) == 0


def fold_indexed() -> ReplicaFold:
    """A shared table (input 0) indexed along axis 0 by per-replica indices (input 1, attribute
    ``axis``): each replica's rows of indices give its rows of the result (a gather)."""
    return ReplicaFold(rows=_indexed_rows)


def shared_identity(t: Tensor) -> object:
    """A shared operand's identity in a group key: the tensor, or a constant's value
    (``x + 1e-3`` makes one constant per op; equal values may share a kernel)."""
    if isinstance(t, Constant):
        return ("constant", t.dtype.name, t._data.tobytes())
    return t


def columns(flat: Sequence, n: int) -> List[list]:
    """The flattened inputs of a group's ops (``n`` each) as one list per input position."""
    return [list(flat[i::n]) for i in range(n)]


def _shape(t: Tensor) -> tuple:
    return tuple(t.shape)


def _scalar(t: Tensor) -> bool:
    return tuple(t.shape) == ()


# binary ops -------------------------------------------------------------------------
def binary_foreach(
    fresh: Callable, inplace: Callable, commutative: bool, scalar_rhs: bool = True
) -> Foreach:
    """Add/Sub/Mul/Div: two tensors of the output's shape ("LL"), a tensor and one shared
    scalar tensor ("LS", with ``scalar_rhs``), or (commutative ops) a shared scalar and a
    tensor ("SL")."""

    def key(op: Op) -> Optional[tuple]:
        if op.attrs:
            return None
        (a, b), out = op.inputs, _shape(op.outputs[0])
        if _shape(a) == out and _shape(b) == out:
            return ("LL",)
        if _shape(a) == out and _scalar(b) and scalar_rhs:
            return ("LS", shared_identity(b))
        if _scalar(a) and _shape(b) == out and commutative:
            return ("SL", shared_identity(a))
        return None

    def targets(key: tuple) -> Targets:
        if key[0] == "LL":
            return [("in0", 0)] + ([("in1", 1)] if commutative else [])
        return [("in0", 1 if key[0] == "SL" else 0)]

    def kernel(ops, key: tuple, mode: str) -> Callable:
        return _binary_kernel(fresh, inplace, key[0], mode, len(ops[0].inputs))

    return Foreach(key, kernel, targets)


def _binary_kernel(fresh, inplace, roles: str, mode: str, n: int) -> Callable:
    if roles == "LL":
        if mode == "fresh":
            return lambda *flat: tuple(fresh(*columns(flat, n)))
        first = 0 if mode == "in0" else 1  # in1 only for commutative ops: b op a == a op b

        def into(*flat):
            cols = columns(flat, n)
            inplace(cols[first], cols[1 - first])
            return tuple(cols[first])

        return into
    li = 1 if roles == "SL" else 0

    def with_scalar(*flat):
        cols = columns(flat, n)
        tensors, scalar = cols[li], cols[1 - li][0]
        if mode == "fresh":
            return tuple(fresh(tensors, scalar))
        inplace(tensors, scalar)
        return tuple(tensors)

    return with_scalar


# unary ops --------------------------------------------------------------------------
def unary_foreach(fresh: Callable, inplace: Callable, writes_input: bool = False) -> Foreach:
    """Sqrt/Neg: one tensor; with ``writes_input`` the group may write into its dead inputs."""

    def kernel(ops, key: tuple, mode: str) -> Callable:
        if mode == "in0":
            return lambda *flat: _apply_(inplace, list(flat))
        return lambda *flat: tuple(fresh(list(flat)))

    targets = (lambda key: [("in0", 0)]) if writes_input else None
    return Foreach(lambda op: () if not op.attrs else None, kernel, targets)


def _apply_(fn: Callable, tensors: list) -> tuple:
    fn(tensors)
    return tuple(tensors)


# ops with a multi-tensor kernel of their own ----------------------------------------
def multi_tensor_foreach(multi: Callable, shared_roles: Tuple[str, ...]) -> Foreach:
    """An op (torch's fused optimizer steps) whose list kernel ``multi(values, **attrs)``
    takes one ``{role: tensor}`` dict per op (``attrs["roles"]`` names the inputs) and
    returns each op's output 0. Ops with the same attributes, parameter dtype and
    hyper-parameter tensors (``shared_roles``) run as one call, as ``torch.optim(fused=True)``
    updates a param group; any dtype."""

    def key(op: Op) -> tuple:
        roles = op.attrs["roles"]
        shared = tuple(shared_identity(t) for r, t in zip(roles, op.inputs) if r in shared_roles)
        return (op.outputs[0].dtype.name, tuple(sorted(op.attrs.items())), shared)

    def kernel(ops, key: tuple, mode: str) -> Callable:
        attrs = dict(ops[0].attrs)
        roles, n = attrs.pop("roles"), len(ops[0].inputs)

        def run(*flat):
            values = [dict(zip(roles, flat[i : i + n])) for i in range(0, len(flat), n)]
            return tuple(multi(values, **attrs))

        return run

    return Foreach(key, kernel, any_dtype=True)


def float32_only(op: Op) -> bool:
    """Every input and output of ``op`` is float32."""
    return all(t.dtype is dtypes.float32 for t in (*op.inputs, *op.outputs))


def binary_direct(fn: str) -> Callable[[Op, List[str], Callable], Optional[str]]:
    """``speed.DIRECT`` of a binary op without attributes: ``fn(a, b)`` (e.g. "torch.add")."""

    def call(op: Op, ins: List[str], literal: Callable) -> Optional[str]:
        if op.attrs or len(ins) != 2:
            return None
        return f"{fn}({ins[0]}, {ins[1]})"

    return call
