"""`conditional`: run one of two graphs depending on a boolean tensor."""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from ..context import gcg
from ..graph import Graph, Op
from ..tensor import Tensor, constant
from .call import call, call_with_info
from .call_site import CallSiteInfo, _call_cost, _check_callable, _prep_inputs
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
    from .unary import sin

    def build_for(flag: bool):
        def build(x, w):
            ir = gcg().ir
            then_g = ir.create_graph(lambda a, b: a * b + a, x, w)
            else_g = ir.create_graph(lambda a: sin(a) * 3.0, x)
            cond = constant(flag, dtypes.bool)
            return conditional(cond, then_g, else_g, then_inputs=[x, w], else_inputs=[x])[0]

        return build

    rng = np.random.default_rng(2)
    data = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    return [
        Sample(data, build_for(True), lambda x, w: x * w + x, name="then"),
        Sample(data, build_for(False), lambda x, w: x.sin() * 3.0, name="else"),
    ]


def _cond_grad(ctx) -> List[Optional[Tensor]]:
    """A conditional over two grad branches. Each recomputes its forward branch (the taken
    branch's activations exist only inside it) and runs that branch's grad graph; both output a
    gradient for every then- and else-input, zeros for the inputs of the branch not taken."""
    op = ctx.op
    then_g, else_g = op.called_graphs
    n = op.attrs["n_then"]
    cots = [ctx.grad_output_or_zero(i) for i in range(len(op.outputs))]
    vals = [ctx.input(i) for i in range(1, len(op.inputs))]
    t_vals, e_vals = vals[:n], vals[n:]
    known = ctx.differentiator.known
    ir = gcg().ir
    t_specs, e_specs = [v.spec for v in t_vals], [v.spec for v in e_vals]
    t_wrap = ir.create_graph(_grad_branch(then_g, known, len(cots), [], e_specs), *cots, *t_vals)
    e_wrap = ir.create_graph(_grad_branch(else_g, known, len(cots), t_specs, []), *cots, *e_vals)
    grads = conditional(ctx.input(0), t_wrap, e_wrap, [*cots, *t_vals], [*cots, *e_vals])
    return [None, *grads]


def _grad_branch(branch: Graph, known, m: int, zeros_before, zeros_after):
    """The body of one grad branch: ``(cotangents, branch inputs) -> grads``, padded with zeros
    for the other branch's inputs (``zeros_before`` / ``zeros_after``: their specs)."""

    def build(*args):
        cots, ins = list(args[:m]), list(args[m:])
        grads = _grads_through(branch, known, cots, ins)
        pad = [_zeros(s) for s in zeros_before], [_zeros(s) for s in zeros_after]
        return (*pad[0], *grads, *pad[1])

    return build


def _zeros(spec) -> Tensor:
    from .io import init

    return init(spec.shape, spec.dtype, "zeros", "zero")


def _grads_through(g: Graph, known, cots: List[Tensor], ins: List[Tensor]) -> List[Tensor]:
    """Call ``g`` on ``ins`` and its grad graph on ``cots``: one gradient per input of ``g``."""
    from ..transforms.autodiff import ExpectedConnectionType, autodiff

    outs = list(g._outputs[: len(cots)])
    info = known.get(g) or autodiff(
        g, grads_provided=outs, grads_required=g._inputs, called_graphs_grad_info=known
    )
    known[g] = info
    site = call_with_info(g, *ins)
    args = []
    for c in info.expected_inputs:
        if c.connection_type is ExpectedConnectionType.FwdGrad:
            idx = outs.index(c.fwd_tensor) if c.fwd_tensor in outs else -1
            args.append(cots[idx] if idx >= 0 else _zeros(c.fwd_tensor.spec))
        else:
            args.append(site.graph_to_parent(c.fwd_tensor))
    res = call(info.graph, *args)
    grads: List[Optional[Tensor]] = [None] * len(ins)
    for c, gt in zip(info.expected_outputs, res):
        grads[g._inputs.index(c.fwd_tensor)] = gt
    return [gr if gr is not None else _zeros(t.spec) for gr, t in zip(grads, g._inputs)]


CONDITIONAL = register(
    OpDef(
        "If",
        _cond_infer,
        emit=_emit_conditional,
        grad=_cond_grad,
        cost=_call_cost,
        samples=_conditional_samples,
    )
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
    op = outs[0].producer if outs else gcg()._ops[-1]
    assert op is not None  # an op's output has its producer
    return op


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
