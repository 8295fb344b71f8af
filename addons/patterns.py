"""PopART's pre-alias patterns, as far as they mean anything on the simulator.

On the IPU, ``apply_pre_alias_patterns`` runs PopART's graph rewrites before inplacing: it
lowers gradient ops (``MatMulLhsGrad``, ``SoftmaxGrad``, ...) to core ops and, with
``OpToIdentity``, turns ops whose output always equals their input into Identity ops.

Here the gradient rules of the op table already emit core ops, so lowering has nothing left to
do. What remains is ``OpToIdentity``: it rewrites the (non-in-place) ops listed in
`_IDENTITY_WHEN` into ``Identity`` ops with the same input and output tensors. Each listed op
computes exactly its input, so no value changes: the rewrite only shows in schedules and cost
estimates. As on PopART, gradients of a graph taken *after* the rewrite differentiate the
Identity; popxl.addons applies the patterns after autodiff, and so should callers.
"""

from __future__ import annotations

from typing import Callable, Dict

from popxl_core import Ir
from popxl_core.graph import Op
from popxl_core.ops.registry import get_opdef

__all__ = ["PATTERN_LEVELS", "apply_pre_alias_patterns"]

# PopART's PatternsLevel names, as popxl.addons accepts them
PATTERN_LEVELS = ("no", "minimal", "default", "all")


def _reduces_over_one_replica(op: Op) -> bool:
    group = op.attrs["group"]
    n = op.graph.ir.replication_factor if group is None else group.group_size
    return n == 1 and op.attrs["op"] != "square_add"


# op type -> when its output is its input (PopART's Op::canBeReplacedByIdentity)
_IDENTITY_WHEN: Dict[str, Callable[[Op], bool]] = {
    "ReplicatedAllReduceTP": lambda op: (
        op.attrs["identical_inputs"] or _reduces_over_one_replica(op)
    ),
    "ReplicatedAllReduce": _reduces_over_one_replica,
    "Reshape": lambda op: op.outputs[0].shape == op.inputs[0].shape,
    "Transpose": lambda op: tuple(op.attrs["permutation"]) == tuple(range(op.inputs[0].rank)),
}


def apply_pre_alias_patterns(ir: Ir, level: str = "default") -> int:
    """Apply the pre-alias patterns of ``level`` to every graph of ``ir``.

    ``"no"`` and ``"minimal"`` change nothing here (the minimal patterns lower gradient ops,
    which the simulator never creates); ``"default"`` and ``"all"`` apply ``OpToIdentity``.
    Returns the number of ops rewritten (popxl.addons returns None).
    """
    if level not in PATTERN_LEVELS:
        raise ValueError(
            f"apply_pre_alias_patterns: level must be one of {PATTERN_LEVELS}, got {level!r}."
        )
    if not isinstance(ir, Ir):
        raise TypeError(f"apply_pre_alias_patterns: expected a popxl.Ir, got {type(ir).__name__}.")
    if level in ("no", "minimal"):
        return 0
    identity = get_opdef("Identity")
    # decide every op first, so an error leaves the Ir untouched
    hits = [
        op
        for g in ir.graphs
        for op in g.ops
        if op.type in _IDENTITY_WHEN and _IDENTITY_WHEN[op.type](op)
    ]
    for op in hits:
        op.opdef = identity
        op.attrs = {}
    return len(hits)
