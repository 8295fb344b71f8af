"""The simulator's speed variants of ops: one table per mechanism, keyed by the op's `OpDef`.

An `OpDef` says what an op means (type, shape rule, kernel, gradient, cost, aliasing); how the
simulator may run it faster with the same bits lives here, as JAX keeps batching rules apart
from its primitives. Each op family registers its variants next to its kernel, after its row::

    ADD = register(OpDef("Add", ...))
    speed.declare(ADD, out_kernel=torch.add, replica_fold=fold_elementwise(exact=True))

and the compiler's passes read them by the op's row (``BUFFERED_KERNEL.get(op.opdef)``). The
rule types are in `popxl_core.ops.forms`. This module imports nothing of the project, so both
``ops/`` (which registers) and ``sim/`` (which reads) import it without a circle.

The tables:

* `FOREACH`: the op's multi-tensor form (`forms.Foreach`; foreach.py);
* `OUT_KERNEL`: a torch function with the kernel's arithmetic taking ``out=`` (float32, no
  attributes): the op may write its result into a dead input (inplace.py);
* `DIRECT`: ``(op, input names, literal) -> source | None``, the torch call the generated code
  makes instead of the kernel, the same bits (float32, one output; direct.py);
* `TRANSPOSED_KERNEL`: ``(op, numerics) -> fn(a, b)`` computing the op's 2-D output
  transposed, with the bits of the op then a transpose (fuse.py);
* `MATRIX_TRANSPOSE`: ``op -> bool``, the op transposes a matrix (fuse.py folds it into a
  producer with a transposed kernel);
* `JOINT_GRAD`: this gradient op and its partner in one call (`forms.JointGrad`;
  conv_pairs.py);
* `DEAD_OUTPUT_KERNELS`: ``{frozenset(indexes of outputs nothing reads): kernel}``, float32
  kernels that skip those outputs (None in their place), the same bits for the others
  (variants.py);
* `BUFFERED_KERNEL`: ``(op, dead output indexes) -> kernel or None``, a float32 kernel that
  writes its outputs into buffers it keeps, used only for an op that runs at most once per
  `Session.run` (variants.py);
* `REPLICA_BATCHING`: how data-parallel replicas' calls of the op batch into one call, its
  one `ReplicaBatching` rule (batching.py): ``fold`` over their values concatenated along
  dim 0 (`forms.ReplicaFold`; fold.py), ``stack``: where replicas in lock step make that call
  at the hub, its weight shared (`forms.ReplicaStack`; stacking.py); ``reduce``: how a
  collective over every replica runs over the replicas' rows (`forms.ReplicaReduce`;
  fold.py). `declare` takes its fields as the keywords ``replica_fold=``,
  ``replica_stack=`` and ``replica_reduce=`` (or the whole rule as ``replica_batching=``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generic,
    Iterator,
    Optional,
    Tuple,
    TypeVar,
    Union,
    overload,
)

if TYPE_CHECKING:
    from ..ops.forms import ReplicaFold, ReplicaReduce, ReplicaStack
    from ..ops.registry import OpDef

__all__ = [
    "OpTable",
    "TABLES",
    "TABLE_NAMES",
    "FOREACH",
    "OUT_KERNEL",
    "DIRECT",
    "TRANSPOSED_KERNEL",
    "MATRIX_TRANSPOSE",
    "JOINT_GRAD",
    "DEAD_OUTPUT_KERNELS",
    "BUFFERED_KERNEL",
    "REPLICA_BATCHING",
    "ReplicaBatching",
    "declare",
    "fold_rule",
    "known_fold",
    "reduce_rule",
    "stack_rule",
]

Rule = TypeVar("Rule")
_D = TypeVar("_D")  # a default `OpTable.get` returns for an op without a rule


class OpTable(Generic[Rule]):
    """One speed mechanism's rules, keyed by the `OpDef` object (an op row is its identity:
    two rows never share a rule by having the same name)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: Dict["OpDef", Rule] = {}

    def register(self, opdef: "OpDef", rule: Rule) -> "OpDef":
        """Declare ``opdef``'s rule; an op has at most one rule per table."""
        if opdef in self.rows:
            raise ValueError(f"{opdef.name} already has a {self.name} rule (sim/speed.py).")
        self.rows[opdef] = rule
        return opdef

    @overload
    def get(self, opdef: "OpDef") -> Optional[Rule]: ...

    @overload
    def get(self, opdef: "OpDef", default: Rule) -> Rule: ...

    @overload
    def get(self, opdef: "OpDef", default: _D) -> Union[Rule, _D]: ...

    def get(self, opdef: "OpDef", default: Any = None) -> Any:
        return self.rows.get(opdef, default)

    def __getitem__(self, opdef: "OpDef") -> Rule:
        """The rule of an op known to have one (KeyError otherwise)."""
        return self.rows[opdef]

    def __contains__(self, opdef: object) -> bool:
        return opdef in self.rows

    def __iter__(self) -> Iterator["OpDef"]:
        return iter(self.rows)

    def __repr__(self) -> str:
        return f"OpTable({self.name!r}, {len(self.rows)} ops)"


FOREACH: OpTable = OpTable("foreach")
OUT_KERNEL: OpTable = OpTable("out_kernel")
DIRECT: OpTable = OpTable("direct")
TRANSPOSED_KERNEL: OpTable = OpTable("transposed_kernel")
MATRIX_TRANSPOSE: OpTable = OpTable("matrix_transpose")
JOINT_GRAD: OpTable = OpTable("joint_grad")
# op -> {the set of outputs nothing reads: the kernel that skips them}
DEAD_OUTPUT_KERNELS: OpTable[Dict[frozenset, Callable]] = OpTable("dead_output_kernels")
BUFFERED_KERNEL: OpTable = OpTable("buffered_kernel")


@dataclass(frozen=True)
class ReplicaBatching:
    """How data-parallel replicas' calls of one op batch into fewer calls (batching.py):
    ``fold``, one call over all replicas' values concatenated along dim 0 (the folded
    program, fold.py); ``stack``, where lock step's hub may make that call over the
    replicas' values (stacking.py): the inputs that must be one tensor for all (a weight);
    ``reduce``, how a collective over every replica runs over their rows (fold.py).
    None: not that way. Either is used only where it gives every replica the bits of its
    own call, which every op without a rule makes."""

    fold: Optional["ReplicaFold"] = None
    stack: Optional["ReplicaStack"] = None
    reduce: Optional["ReplicaReduce"] = None


REPLICA_BATCHING: OpTable[ReplicaBatching] = OpTable("replica_batching")
# `declare`'s keywords for the fields of an op's one `ReplicaBatching` rule
_REPLICA_FIELDS = {"replica_fold": "fold", "replica_stack": "stack", "replica_reduce": "reduce"}


def fold_rule(opdef) -> Optional[ReplicaFold]:
    """How replicas' calls of ``opdef`` fold into one over their rows (None: they do not)."""
    rule = REPLICA_BATCHING.get(opdef)
    return None if rule is None else rule.fold


def known_fold(opdef) -> ReplicaFold:
    """`fold_rule` of an op known to have one (a planned fold site's)."""
    rule = fold_rule(opdef)
    if rule is None:
        raise KeyError(f"{opdef.name} has no fold form in speed.REPLICA_BATCHING")
    return rule


def stack_rule(opdef) -> Optional[ReplicaStack]:
    """How replicas' calls of ``opdef`` stack at lock step's hub (None: they do not)."""
    rule = REPLICA_BATCHING.get(opdef)
    return None if rule is None else rule.stack


def reduce_rule(opdef) -> Optional[ReplicaReduce]:
    """How ``opdef``, a collective over every replica, runs over the replicas' rows (None:
    a folded program does not hold it)."""
    rule = REPLICA_BATCHING.get(opdef)
    return None if rule is None else rule.reduce


TABLES: Tuple[OpTable, ...] = (
    FOREACH,
    OUT_KERNEL,
    DIRECT,
    TRANSPOSED_KERNEL,
    MATRIX_TRANSPOSE,
    JOINT_GRAD,
    DEAD_OUTPUT_KERNELS,
    BUFFERED_KERNEL,
    REPLICA_BATCHING,
)
_BY_NAME = {t.name: t for t in TABLES}
TABLE_NAMES = frozenset(_BY_NAME) | frozenset(_REPLICA_FIELDS)  # `declare`'s keywords


def declare(opdef: "OpDef", **rules: Any) -> "OpDef":
    """Register ``opdef``'s rules in the tables named by the keywords (None: no rule), e.g.
    ``declare(ADD, out_kernel=torch.add)``; returns ``opdef``. ``replica_fold=``,
    ``replica_stack=`` and ``replica_reduce=`` are the fields of its one `ReplicaBatching`
    rule. An unknown name is
    a TypeError.
    """
    unknown = sorted(set(rules) - TABLE_NAMES)
    if unknown:
        raise TypeError(f"{opdef.name}: no speed table {unknown}; the names: {sorted(TABLE_NAMES)}")
    batching = {_REPLICA_FIELDS[k]: rules.pop(k) for k in _REPLICA_FIELDS.keys() & rules.keys()}
    if any(rule is not None for rule in batching.values()):
        if rules.get("replica_batching") is not None:
            raise TypeError(f"{opdef.name}: give replica_batching= or its fields, not both.")
        rules["replica_batching"] = ReplicaBatching(**batching)
    for name, rule in rules.items():
        if rule is not None:
            _BY_NAME[name].register(opdef, rule)
    return opdef
