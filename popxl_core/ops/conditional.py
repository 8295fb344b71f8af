"""`conditional`: run one of two graphs depending on a boolean tensor."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

from ..context import gcg
from ..graph import Graph, Op
from ..tensor import Tensor, constant
from .call import CallSiteInfo, _call_cost, _check_callable, _prep_inputs
from .registry import OpDef, Sample, create_op, register

__all__ = ["conditional", "conditional_with_info", "ConditionalSiteInfo"]

ConditionalSiteInfo = CallSiteInfo


# Conditional ------------------------------------------------------------------------
def _cond_infer(ins, then_branch, else_branch, n_then):
    return [t.spec for t in then_branch._outputs]


def _emit_conditional(op: Op, em) -> None:
    then_g, else_g = op.called_graphs
    n = op.attrs["n_then"]
    names = [em.name(t) for t in op.inputs]
    t_call = f"{em.graph_fn(then_g)}({', '.join(_clone_mod(em, then_g, names[1 : 1 + n]))})"
    e_call = f"{em.graph_fn(else_g)}({', '.join(_clone_mod(em, else_g, names[1 + n :]))})"
    outs = [em.name(t) for t in op.outputs]
    lhs = f"{', '.join(outs)}, = " if outs else ""
    em.emit(f"{lhs}({t_call} if bool({names[0]}) else {e_call})[:{len(outs)}]")


def _clone_mod(em, g: Graph, names: List[str]) -> List[str]:
    mod = em.program.modified_inputs[g]
    return [f"{nm}.clone()" if i in mod else nm for i, nm in enumerate(names)]


def _conditional_samples():
    from .. import dtypes

    def build(x):
        ir = gcg().ir
        then_g = ir.create_graph(lambda a: a * 2.0, x)
        else_g = ir.create_graph(lambda a: a * -1.0, x)
        flag = constant(True, dtypes.bool)
        return conditional(flag, then_g, else_g, then_inputs=[x], else_inputs=[x])[0]

    return [
        Sample([np.arange(6, dtype=np.float32).reshape(2, 3)], build, lambda x: x * 2.0, grad=False)
    ]


CONDITIONAL = register(
    OpDef("If", _cond_infer, emit=_emit_conditional, cost=_call_cost, samples=_conditional_samples)
)


def _make_conditional(
    cond,
    then_branch,
    else_branch,
    then_inputs,
    else_inputs,
    then_inputs_dict,
    else_inputs_dict,
    check_inputs,
) -> Op:
    _check_callable(then_branch)
    _check_callable(else_branch)
    t_out, e_out = then_branch._outputs, else_branch._outputs
    if [(t.shape, t.dtype) for t in t_out] != [(t.shape, t.dtype) for t in e_out]:
        raise ValueError(
            f"conditional: branches {then_branch.id!r} and {else_branch.id!r} must "
            "have the same number, shapes and dtypes of outputs."
        )
    if cond.nelms != 1:
        raise ValueError(
            f"conditional: condition {cond.id!r} must have one element, has shape {cond.shape}."
        )
    t_in = _prep_inputs(then_branch, then_inputs or [], then_inputs_dict, check_inputs)
    e_in = _prep_inputs(else_branch, else_inputs or [], else_inputs_dict, check_inputs)
    attrs = {"then_branch": then_branch, "else_branch": else_branch, "n_then": len(t_in)}
    outs = create_op(
        CONDITIONAL,
        [cond, *t_in, *e_in],
        attrs,
        called_graphs=(then_branch, else_branch),
        out_names=[t.name for t in t_out] or None,
    )
    return outs[0].producer if outs else gcg()._ops[-1]


def conditional(
    cond: Tensor,
    then_branch: Graph,
    else_branch: Graph,
    then_inputs=None,
    else_inputs=None,
    then_inputs_dict=None,
    else_inputs_dict=None,
) -> Tuple[Tensor, ...]:
    """Run ``then_branch`` if ``cond`` is true, else ``else_branch``."""
    info = conditional_with_info(
        cond, then_branch, else_branch, then_inputs, else_inputs, then_inputs_dict, else_inputs_dict
    )
    return info.outputs


def conditional_with_info(
    cond,
    then_branch,
    else_branch,
    then_inputs=None,
    else_inputs=None,
    then_inputs_dict=None,
    else_inputs_dict=None,
    check_inputs=True,
):
    return CallSiteInfo(
        _make_conditional(
            cond,
            then_branch,
            else_branch,
            then_inputs,
            else_inputs,
            then_inputs_dict,
            else_inputs_dict,
            check_inputs,
        )
    )
