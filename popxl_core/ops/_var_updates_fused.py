"""torch's fused optimizer kernels as var-update ops: FusedSGD, FusedAdam, FusedAdamW.

``torch.optim.SGD/Adam/AdamW(..., fused=True)`` update every parameter of a param group with
one call of ``torch._fused_sgd_`` / ``_fused_adam_`` / ``_fused_adamw_`` over lists of tensors.
Their CPU kernels fuse the whole update per element (with FMAs) and compute the scalars in
double precision from ``lr`` and the betas (Adam's ``lr / (1 - beta1**step)``, AdamW's
``1 - lr * weight_decay``), so no composition of single-tensor ops gives the same bits. These
ops call the same kernels: one op per parameter in the IR, and one kernel call per group of
them when the compiler runs the group as one (``extra["multi_tensor"]``, see sim/foreach.py);
the kernels work tensor by tensor, so the grouped call gives the bits of the single ones.

Hyper-parameters (``lr``, ``weight_decay``, ...) are Python floats (attributes) or scalar
tensors (fed per step). torch passes them to the kernel as doubles: a float64 scalar tensor
carries a double exactly (a float32-rounded ``lr`` changes Adam's result in about one case in
ten, measured over random learning rates), and its ``.item()`` is that double.

Each op writes its parameter (output 0 aliases it) and the state it is given: momentum
buffer; ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` and ``step``, which Adam increments
first (torch.optim's ``_foreach_add_(state_steps, 1)`` before the kernel).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor, TensorSpec
from ._utils import rand
from ._var_updates_common import check_float, check_scalar
from .registry import Cost, OpDef, Sample, create_op, register

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
            if role in ("param", "step") or role in hyper_names:
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
        for name in hyper_names:
            if name in s:
                check_scalar(name, s[name])
            elif attrs.get(name) is None:
                raise ValueError(f"{name} must be given (a float or a scalar tensor)")
        return [p]

    return infer


# kernels ------------------------------------------------------------------------------
def _hyper(values: dict, attrs: dict, names: Sequence[str]) -> dict[str, float]:
    """Each hyper-parameter as the Python float (a double) torch passes to its kernel."""
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


# samples: bitwise against torch.optim's own fused step --------------------------------
def _eager(make_opt, p, g, state: dict, keys: Sequence[str]) -> tuple:
    """One step of ``make_opt([p])`` (fused=True) from ``state``: the parameter and the state
    values ``keys`` after it."""
    p = torch.nn.Parameter(p.clone())
    p.grad = g.clone()
    opt = make_opt([p])
    if state:
        opt.state[p] = {k: v.clone() for k, v in state.items()}
    opt.step()
    return (p.detach(), *[opt.state[p][k] for k in keys])


def _f64(x: float) -> np.ndarray:
    return np.array(x, np.float64)


def _sgd_samples() -> list[Sample]:
    p, g, buf = rand(3, 7, seed=800), rand(3, 7, seed=801), rand(3, 7, seed=802)
    hyper = dict(lr=0.0123, weight_decay=1e-2, momentum=0.9, dampening=0.25)
    nesterov = {**hyper, "dampening": 0.0}  # torch's SGD requires it

    def sgd(**kw):
        return lambda ps: torch.optim.SGD(ps, fused=True, **kw)

    buf_key = ("momentum_buffer",)
    return [
        Sample(
            [p, g, buf],
            lambda a, b, c: (fused_sgd_(a, b, c, **hyper, first_step=0.0), c),
            lambda a, b, c: _eager(sgd(**hyper), a, b, {"momentum_buffer": c}, buf_key),
            grad=False,
            rtol=0,
            atol=0,
            name="momentum",
        ),
        Sample(
            [p, g, buf, *map(_f64, nesterov.values())],
            lambda a, b, c, *h: (
                fused_sgd_(a, b, c, *h, first_step=1.0, nesterov=True, maximize=True),
                c,
            ),
            lambda a, b, c, *h: _eager(
                sgd(**nesterov, nesterov=True, maximize=True), a, b, {}, buf_key
            ),
            grad=False,
            rtol=0,
            atol=0,
            name="first_step_nesterov_maximize_fed",
        ),
        Sample(
            [p, g],
            lambda a, b: fused_sgd_(
                a, b, None, lr=0.1, weight_decay=0.0, momentum=0.0, dampening=0.0, first_step=0.0
            ),
            lambda a, b: _eager(sgd(lr=0.1), a, b, {}, ())[0],
            grad=False,
            rtol=0,
            atol=0,
            name="plain",
        ),
    ]


def _adam_samples(decoupled: bool):
    def samples() -> list[Sample]:
        p, g, m = rand(3, 7, seed=810), rand(3, 7, seed=811), rand(3, 7, seed=812)
        v, vmax = rand(3, 7, seed=813, low=0.0), rand(3, 7, seed=814, low=0.5)
        step = np.array(2.0, np.float32)
        hyper = dict(lr=0.0123, beta1=0.8, beta2=0.99, weight_decay=1e-2, eps=1e-6)
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam

        def adam(**kw):
            return lambda ps: cls(
                ps, fused=True, lr=0.0123, betas=(0.8, 0.99), weight_decay=1e-2, eps=1e-6, **kw
            )

        keys = ("step", "exp_avg", "exp_avg_sq")
        return [
            Sample(
                [p, g, m, v, step],
                lambda a, b, c, d, s: (
                    fused_adam_(a, b, c, d, s, **hyper, decoupled_weight_decay=decoupled),
                    s,
                    c,
                    d,
                ),
                lambda a, b, c, d, s: _eager(adam(), a, b, dict(zip(keys, (s, c, d))), keys),
                grad=False,
                rtol=0,
                atol=0,
                name="float_hyper",
            ),
            Sample(
                [p, g, m, v, step, vmax, *map(_f64, hyper.values())],
                lambda a, b, c, d, s, e, *h: (
                    fused_adam_(
                        a,
                        b,
                        c,
                        d,
                        s,
                        *h,
                        max_exp_avg_sq=e,
                        maximize=True,
                        decoupled_weight_decay=decoupled,
                    ),
                    s,
                    c,
                    d,
                    e,
                ),
                lambda a, b, c, d, s, e, *h: _eager(
                    adam(amsgrad=True, maximize=True),
                    a,
                    b,
                    dict(zip((*keys, "max_exp_avg_sq"), (s, c, d, e))),
                    (*keys, "max_exp_avg_sq"),
                ),
                grad=False,
                rtol=0,
                atol=0,
                name="amsgrad_maximize_fed",
            ),
        ]

    return samples


def _op(name: str, hyper, multi, flops: int, samples) -> OpDef:
    return register(
        OpDef(
            name,
            _infer(hyper),
            _single(multi),
            cost=_cost(flops),
            inplace=(0,),
            samples=samples,
            out_name=f"{name.lower()}_out",
            fp16_in_fp32=False,
            extra={"multi_tensor": multi, "shared_inputs": hyper},
        )
    )


FUSED_SGD = _op("FusedSGD", SGD_HYPER, sgd_step, 5, _sgd_samples)
FUSED_ADAM = _op("FusedAdam", ADAM_HYPER, adam_step, 14, _adam_samples(False))
FUSED_ADAMW = _op("FusedAdamW", ADAM_HYPER, adamw_step, 14, _adam_samples(True))


# builders -----------------------------------------------------------------------------
def _create(opdef: OpDef, tensors: dict, hyper: dict, attrs: dict) -> Tensor:
    """The op on ``tensors`` (role -> tensor, param first) and ``hyper`` (name -> float or
    scalar tensor); it writes the state tensors besides the parameter."""
    roles, ins = list(tensors), list(tensors.values())
    for name, value in hyper.items():
        if isinstance(value, Tensor):
            roles.append(name)
            ins.append(value)
            attrs[name] = None
        else:
            attrs[name] = float(value)
    attrs["roles"] = tuple(roles)
    out = create_op(opdef, ins, attrs)[0]
    for i, role in enumerate(roles):
        if role in _STATE_ROLES:
            out.producer.by_ref_modified.add(i)  # written, not aliased by output 0
    return out


def fused_sgd_(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor | None,
    lr: Value,
    weight_decay: Value,
    momentum: Value,
    dampening: Value,
    first_step: Value,
    nesterov: bool = False,
    maximize: bool = False,
) -> Tensor:
    """In place, ``torch._fused_sgd_([param], [grad], [momentum_buffer], ...)``.

    ``first_step`` nonzero is torch's ``is_first_step``: the buffer becomes the (decayed)
    gradient. Without a momentum buffer, ``momentum`` must be 0 (as in torch).
    """
    tensors = {"param": param, "grad": grad}
    if momentum_buffer is not None:
        tensors["momentum_buffer"] = momentum_buffer
    elif not isinstance(momentum, Tensor) and momentum != 0:
        raise ValueError(f"fused_sgd_: momentum {momentum} needs a momentum_buffer")
    hyper = dict(zip(SGD_HYPER, (lr, weight_decay, momentum, dampening, first_step)))
    attrs = {"nesterov": bool(nesterov), "maximize": bool(maximize)}
    return _create(FUSED_SGD, tensors, hyper, attrs)


def fused_adam_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: Tensor,
    lr: Value,
    beta1: Value,
    beta2: Value,
    weight_decay: Value,
    eps: Value,
    max_exp_avg_sq: Tensor | None = None,
    maximize: bool = False,
    decoupled_weight_decay: bool = False,
) -> Tensor:
    """In place, torch.optim's fused Adam (AdamW with ``decoupled_weight_decay``) step of one
    parameter: ``step += 1``, then ``torch._fused_adam_`` / ``_fused_adamw_``; amsgrad when
    ``max_exp_avg_sq`` is given."""
    tensors = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if max_exp_avg_sq is not None:
        tensors["max_exp_avg_sq"] = max_exp_avg_sq
    tensors["step"] = step
    hyper = dict(zip(ADAM_HYPER, (lr, beta1, beta2, weight_decay, eps)))
    attrs = {"amsgrad": max_exp_avg_sq is not None, "maximize": bool(maximize)}
    opdef = FUSED_ADAMW if decoupled_weight_decay else FUSED_ADAM
    return _create(opdef, tensors, hyper, attrs)
