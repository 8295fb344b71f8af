"""torch's fused optimizer kernels as var-update ops: FusedSGD, FusedAdam, FusedAdamW.

``torch.optim.SGD/Adam/AdamW(..., fused=True)`` update every parameter of a param group with
one call of ``torch._fused_sgd_`` / ``_fused_adam_`` / ``_fused_adamw_`` over lists of tensors.
Their CPU kernels fuse the whole update per element (with FMAs) and compute the scalars in
double precision from ``lr`` and the betas (Adam's ``lr / (1 - beta1**step)``, AdamW's
``1 - lr * weight_decay``), so no composition of single-tensor ops gives the same bits. These
ops call the same kernels: one op per parameter in the IR, and one kernel call per group of
them when the compiler runs the group as one (``speed.FOREACH``, see sim/foreach.py);
the kernels work tensor by tensor, so the grouped call gives the bits of the single ones.

Hyper-parameters (``lr``, ``weight_decay``, ...) are Python floats (attributes), scalar
tensors, or all of them packed in one 1-D tensor ``hyper`` (in `SGD_HYPER` / `ADAM_HYPER`
order: one stream to feed per step instead of five). torch passes them to the kernel as
doubles: float64 carries a double exactly (a float32-rounded ``lr`` changes Adam's result in
about one case in ten, measured over random learning rates), and ``.item()`` / ``.tolist()``
give that double.

Each op writes its parameter (output 0 aliases it) and the state it is given: momentum
buffer; ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` and ``step``, which Adam increments
first (torch.optim's ``_foreach_add_(state_steps, 1)`` before the kernel).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import dtypes
from ..sim.speed import declare
from ..tensor import Tensor, TensorSpec
from ._var_updates_common import check_float, check_scalar
from ._var_updates_fused_samples import adam_samples, sgd_samples
from .forms import multi_tensor_foreach
from .registry import Cost, OpDef, create_op, register

__all__ = ["fused_adam_", "fused_sgd_", "SGD_HYPER", "ADAM_HYPER"]

Value = float | Tensor
SGD_HYPER = ("lr", "weight_decay", "momentum", "dampening", "first_step")
ADAM_HYPER = ("lr", "beta1", "beta2", "weight_decay", "eps")
_SGD_STATE = ("momentum_buffer",)
_ADAM_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")


# shape rule ---------------------------------------------------------------------------
def _infer(hyper_names: tuple[str, ...]):
    def infer(ins: Sequence[TensorSpec], roles, **attrs):
        s = dict(zip(roles, ins))
        p = s["param"]
        check_float("param", p)
        for role, spec in s.items():
            if role in ("param", "step", "hyper") or role in hyper_names:
                continue
            if spec.dtype != p.dtype or spec.shape != p.shape:
                raise ValueError(
                    f"{role} is {spec.dtype.name}{spec.shape}, the parameter is "
                    f"{p.dtype.name}{p.shape}"
                )
        if "step" in s and (s["step"].dtype is not dtypes.float32 or s["step"].nelms != 1):
            raise TypeError(
                f"step must be a float32 scalar (torch's fused state), got "
                f"{s['step'].dtype.name}{s['step'].shape}"
            )
        if "hyper" in s:
            _check_packed(s["hyper"], hyper_names)
            return [p]
        for name in hyper_names:
            if name in s:
                check_scalar(name, s[name])
            elif attrs.get(name) is None:
                raise ValueError(f"{name} must be given (a float or a scalar tensor)")
        return [p]

    return infer


def _check_packed(spec: TensorSpec, names: Sequence[str]) -> None:
    check_float("hyper", spec)
    if spec.shape != (len(names),):
        raise ValueError(
            f"hyper must have shape ({len(names)},) (values of {', '.join(names)}), "
            f"got {spec.shape}"
        )


# kernels ------------------------------------------------------------------------------
def _hyper(values: dict, attrs: dict, names: Sequence[str]) -> dict[str, float]:
    """Each hyper-parameter as the Python float (a double) torch passes to its kernel."""
    if "hyper" in values:
        return dict(zip(names, values["hyper"].tolist()))
    return {h: float(values[h].item()) if h in values else float(attrs[h]) for h in names}


def _column(values: list[dict], role: str) -> list[torch.Tensor]:
    return [v[role] for v in values if role in v]


def sgd_step(values: list[dict], *, nesterov: bool, maximize: bool, **attrs) -> list:
    """``torch._fused_sgd_`` over the tensors of ``values`` (one dict of role -> tensor per
    parameter); returns the parameters, updated in place."""
    h = _hyper(values[0], attrs, SGD_HYPER)
    params = _column(values, "param")
    torch._fused_sgd_(
        params,
        [g.contiguous() for g in _column(values, "grad")],
        _column(values, "momentum_buffer"),
        weight_decay=h["weight_decay"],
        momentum=h["momentum"],
        lr=h["lr"],
        dampening=h["dampening"],
        nesterov=nesterov,
        maximize=maximize,
        is_first_step=h["first_step"] != 0,
    )
    return params


def _adam_step(kernel):
    def step(values: list[dict], *, amsgrad: bool, maximize: bool, **attrs) -> list:
        """torch.optim's ``_fused_adam``: steps + 1, then the fused kernel over the lists."""
        h = _hyper(values[0], attrs, ADAM_HYPER)
        params, steps = _column(values, "param"), _column(values, "step")
        torch._foreach_add_(steps, 1)
        kernel(
            params,
            [g.contiguous() for g in _column(values, "grad")],
            _column(values, "exp_avg"),
            _column(values, "exp_avg_sq"),
            _column(values, "max_exp_avg_sq"),
            steps,
            amsgrad=amsgrad,
            lr=h["lr"],
            beta1=h["beta1"],
            beta2=h["beta2"],
            weight_decay=h["weight_decay"],
            eps=h["eps"],
            maximize=maximize,
        )
        return params

    return step


adam_step = _adam_step(torch._fused_adam_)
adamw_step = _adam_step(torch._fused_adamw_)


def _single(multi):
    """The op's kernel: the multi-tensor step over this op's tensors alone."""

    def kernel(*args, roles, **attrs):
        return multi([dict(zip(roles, args))], **attrs)[0]

    return kernel


def _cost(flops: int):
    def cost(ins, outs, attrs) -> Cost:
        s = dict(zip(attrs["roles"], ins))
        written = sum(t.nbytes for r, t in s.items() if r == "param" or r in _STATE_ROLES)
        return Cost(flops * s["param"].nelms, sum(t.nbytes for t in ins) + written)

    return cost


_STATE_ROLES = set(_SGD_STATE) | set(_ADAM_STATE)


def _op(name: str, hyper, multi, flops: int, samples) -> OpDef:
    opdef = register(
        OpDef(
            name,
            _infer(hyper),
            _single(multi),
            cost=_cost(flops),
            inplace=(0,),
            samples=samples,
            out_name=f"{name.lower()}_out",
            fp16_in_fp32=False,
        )
    )
    return declare(opdef, foreach=multi_tensor_foreach(multi, (*hyper, "hyper")))


FUSED_SGD = _op("FusedSGD", SGD_HYPER, sgd_step, 5, sgd_samples)
FUSED_ADAM = _op("FusedAdam", ADAM_HYPER, adam_step, 14, adam_samples(False))
FUSED_ADAMW = _op("FusedAdamW", ADAM_HYPER, adamw_step, 14, adam_samples(True))


# builders -----------------------------------------------------------------------------
def _create(opdef: OpDef, tensors: dict, hyper: dict, packed: Tensor | None, attrs: dict):
    """The op on ``tensors`` (role -> tensor, param first) and ``hyper`` (name -> float or
    scalar tensor) or ``packed``; it writes the state tensors besides the parameter."""
    roles, ins = list(tensors), list(tensors.values())
    given = [n for n, v in hyper.items() if v is not None]
    if packed is not None:
        if given:
            raise ValueError(f"{opdef.name}: give hyper or {', '.join(given)}, not both")
        roles.append("hyper")
        ins.append(packed)
        hyper = {}
    for name, value in hyper.items():
        if isinstance(value, Tensor):
            roles.append(name)
            ins.append(value)
            attrs[name] = None
        else:
            attrs[name] = None if value is None else float(value)
    attrs["roles"] = tuple(roles)
    out = create_op(opdef, ins, attrs)[0]
    op = out.producer
    assert op is not None  # an op's output has its producer
    for i, role in enumerate(roles):
        if role in _STATE_ROLES:
            op.by_ref_modified.add(i)  # written, not aliased by output 0
    return out


def fused_sgd_(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor | None,
    lr: Value | None = None,
    weight_decay: Value | None = None,
    momentum: Value | None = None,
    dampening: Value | None = None,
    first_step: Value | None = None,
    nesterov: bool = False,
    maximize: bool = False,
    hyper: Tensor | None = None,
) -> Tensor:
    """In place, ``torch._fused_sgd_([param], [grad], [momentum_buffer], ...)``.

    ``first_step`` nonzero is torch's ``is_first_step``: the buffer becomes the (decayed)
    gradient. Without a momentum buffer, ``momentum`` must be 0 (as in torch). ``hyper``:
    the five values in one 1-D tensor instead (`SGD_HYPER` order).
    """
    tensors = {"param": param, "grad": grad}
    if momentum_buffer is not None:
        tensors["momentum_buffer"] = momentum_buffer
    elif isinstance(momentum, (int, float)) and momentum != 0:
        raise ValueError(f"fused_sgd_: momentum {momentum} needs a momentum_buffer")
    values = dict(zip(SGD_HYPER, (lr, weight_decay, momentum, dampening, first_step)))
    attrs = {"nesterov": bool(nesterov), "maximize": bool(maximize)}
    return _create(FUSED_SGD, tensors, values, hyper, attrs)


def fused_adam_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: Tensor,
    lr: Value | None = None,
    beta1: Value | None = None,
    beta2: Value | None = None,
    weight_decay: Value | None = None,
    eps: Value | None = None,
    max_exp_avg_sq: Tensor | None = None,
    maximize: bool = False,
    decoupled_weight_decay: bool = False,
    hyper: Tensor | None = None,
) -> Tensor:
    """In place, torch.optim's fused Adam (AdamW with ``decoupled_weight_decay``) step of one
    parameter: ``step += 1``, then ``torch._fused_adam_`` / ``_fused_adamw_``; amsgrad when
    ``max_exp_avg_sq`` is given. ``hyper``: the five values in one 1-D tensor instead
    (`ADAM_HYPER` order)."""
    tensors = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if max_exp_avg_sq is not None:
        tensors["max_exp_avg_sq"] = max_exp_avg_sq
    tensors["step"] = step
    values = dict(zip(ADAM_HYPER, (lr, beta1, beta2, weight_decay, eps)))
    attrs = {"amsgrad": max_exp_avg_sq is not None, "maximize": bool(maximize)}
    opdef = FUSED_ADAMW if decoupled_weight_decay else FUSED_ADAM
    return _create(opdef, tensors, values, hyper, attrs)
