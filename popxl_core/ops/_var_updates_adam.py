"""var_updates for Adam-family optimisers: AdamUpdater (Adam, AdaMax, LAMB) and AdamVarUpdate.

Part of the `popxl.ops.var_updates` namespace (re-exported by var_updates.py).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor, TensorSpec
from ._utils import rand
from ._var_updates_common import check_float, check_scalar, f32
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["adam_updater", "adam_var_update", "adamax_updater", "lamb_updater"]

Value = float | Tensor | None
_HYPER = ("weight_decay", "beta1", "beta2", "epsilon")


def _per_element_cost(flops: int):
    def cost(ins, outs, attrs) -> Cost:
        n = max(s.nelms for s in outs)
        return Cost(flops * n, sum(s.nbytes for s in (*ins, *outs)))

    return cost


# AdamUpdater ------------------------------------------------------------------------------
def _adam_infer(ins, mode, roles, **hyper):
    s: dict[str, TensorSpec] = dict(zip(roles, ins))
    m, v = s["m"], s["v"]
    check_float("acc_first_order", m)
    check_float("acc_second_order", v)
    for name in ("v", "weight"):
        if name in s and s[name].shape != m.shape:
            raise ValueError(f"{name} has shape {s[name].shape}, acc_first_order has {m.shape}")
    if "step" in s and (s["step"].dtype is not dtypes.float32 or s["step"].nelms != 1):
        raise TypeError(
            f"time_step must be a float32 scalar, got {s['step'].shape} {s['step'].dtype.name}"
        )
    for name in _HYPER:
        if name in s:
            check_scalar(name, s[name])
    return [TensorSpec(m.shape, m.dtype)]


def _adam_kernel(*args, mode, roles, **hyper):
    val = dict(zip(roles, args))

    def hp(name):
        return f32(val[name] if name in val else hyper[name])

    m, v = val["m"].float(), val["v"].float()
    if "step" in val:
        val["step"].add_(1)  # popart increments the step in place, then corrects with it
        t = val["step"].float().reshape(())
        m = m / (1 - hp("beta1") ** t)
        if mode != "adamax":
            v = v / (1 - hp("beta2") ** t)
    x = m / (v + hp("epsilon")) if mode == "adamax" else m / (torch.sqrt(v) + hp("epsilon"))
    if "weight" in val:
        x = x + hp("weight_decay") * val["weight"].float()
    return x.to(val["m"].dtype)  # the op's output has the first moment's dtype (its spec)


def _adam_ref(m, v, step=None, w=None, wd=0.0, b1=0.9, b2=0.999, eps=1e-7, mode="adam"):
    m, v = m.float(), v.float()
    if step is not None:
        t = step + 1
        m = m / (1 - torch.as_tensor(b1) ** t)
        v = v if mode == "adamax" else v / (1 - torch.as_tensor(b2) ** t)
    x = m / (v + eps) if mode == "adamax" else m / (torch.sqrt(v) + eps)
    return x if w is None else x + wd * w


def _adam_samples() -> list[Sample]:
    m, v, w = rand(2, 3, seed=50), rand(2, 3, low=0.0, seed=51), rand(2, 3, seed=52)
    m16, step = rand(2, 2, seed=53, dtype=np.float16), np.array(0.0, np.float32)
    v22 = rand(2, 2, low=0.0, seed=54)
    hyp = [np.array(x, np.float32) for x in (0.01, 0.8, 0.99, 1e-5)]
    return [
        Sample(
            [m16, v22, step],
            lambda a, b, s: (
                adam_updater(a, b, time_step=s, weight_decay=0.0, beta1=0.9, beta2=0.999),
                s,
            ),
            lambda a, b, s: (_adam_ref(a, b, s).half(), s + 1),
            grad=False,
            rtol=1e-3,
            name="adam_float16_m_step_increments",
        ),
        Sample(
            [m, v, w],
            lambda a, b, c: adam_updater(a, b, weight=c, weight_decay=0.1),
            lambda a, b, c: _adam_ref(a, b, w=c, wd=0.1),
            grad=False,
            name="no_bias_wd",
        ),
        Sample(
            [m, v, w, np.array(3.0, np.float32), *hyp],
            lambda a, b, c, s, wd, b1, b2, e: adam_updater(a, b, c, s, wd, b1, b2, e),
            lambda a, b, c, s, wd, b1, b2, e: _adam_ref(a, b, s, c, wd, b1, b2, e),
            grad=False,
            name="tensor_hyperparameters",
        ),
        Sample(
            [m, v, np.array(4.0, np.float32)],
            lambda a, b, s: adamax_updater(a, b, time_step=s, beta1=0.8),
            lambda a, b, s: _adam_ref(a, b, s, b1=0.8, mode="adamax"),
            grad=False,
            name="adamax",
        ),
        Sample(
            [m, v, w, step],
            lambda a, b, c, s: lamb_updater(a, b, c, s, 0.01, beta1=0.9, beta2=0.999),
            lambda a, b, c, s: _adam_ref(a, b, s, c, 0.01),
            grad=False,
            name="lamb",
        ),
    ]


ADAM_UPDATER = register(
    OpDef(
        "AdamUpdater",
        _adam_infer,
        _adam_kernel,
        cost=_per_element_cost(10),
        samples=_adam_samples,
        out_name="adamupdater_out",
    )
)


def _uses_weight_decay(weight_decay: Value) -> bool:
    return isinstance(weight_decay, Tensor) or (weight_decay is not None and weight_decay != 0)


def _updater(
    mode: str,
    m: Tensor,
    v: Tensor,
    weight: Tensor | None,
    time_step: Tensor | None,
    hyper: dict[str, Value],
) -> Tensor:
    """Build an AdamUpdater; inputs in popart's index order: weight, m, v, step, then the
    optimiser values that are tensors (weight decay, beta1, beta2, epsilon)."""
    roles, ins = [], []
    if _uses_weight_decay(hyper["weight_decay"]):
        if weight is None:
            raise ValueError(
                f"{mode}_updater: weight decay {hyper['weight_decay']!r} needs the `weight` tensor."
            )
        roles.append("weight")
        ins.append(weight)
    roles += ["m", "v"]
    ins += [m, v]
    if time_step is not None:
        roles.append("step")
        ins.append(time_step)
    attrs: dict[str, object] = {"mode": mode}
    for name in _HYPER:
        value = hyper[name]
        if isinstance(value, Tensor):
            roles.append(name)
            ins.append(value)
        attrs[name] = None if value is None or isinstance(value, Tensor) else float(value)
    attrs["roles"] = tuple(roles)
    out = create_op(ADAM_UPDATER, ins, attrs)[0]
    if time_step is not None:
        # The op writes the step (an input that output 0 does not alias).
        assert out.producer is not None  # an op's output has its producer
        out.producer.by_ref_modified.add(roles.index("step"))
    return out


def _bias_mode(name: str, time_step, beta1, beta2) -> str:
    if time_step is None:
        return f"{name}_no_bias"
    if beta1 is None or beta2 is None:
        raise ValueError(
            f"{name}_updater: bias correction (time_step given) needs beta1 and "
            f"beta2, got beta1={beta1!r}, beta2={beta2!r}."
        )
    return name


def adam_updater(
    acc_first_order: Tensor,
    acc_second_order: Tensor,
    weight: Tensor | None = None,
    time_step: Tensor | None = None,
    weight_decay: Value = None,
    beta1: Value = None,
    beta2: Value = None,
    epsilon: Value = 1e-07,
) -> Tensor:
    """The Adam update term m̂/(sqrt(v̂)+eps) (+ wd*w); increments ``time_step`` in place."""
    mode = _bias_mode("adam", time_step, beta1, beta2)
    hyper = {"weight_decay": weight_decay, "beta1": beta1, "beta2": beta2, "epsilon": epsilon}
    return _updater(mode, acc_first_order, acc_second_order, weight, time_step, hyper)


def lamb_updater(
    acc_first_order: Tensor,
    acc_second_order: Tensor,
    weight: Tensor | None = None,
    time_step: Tensor | None = None,
    weight_decay: Value = None,
    beta1: Value = None,
    beta2: Value = None,
    epsilon: Value = 1e-07,
) -> Tensor:
    """The LAMB update term (as Adam's; scale it with adam_var_update's trust ratio)."""
    mode = _bias_mode("lamb", time_step, beta1, beta2)
    hyper = {"weight_decay": weight_decay, "beta1": beta1, "beta2": beta2, "epsilon": epsilon}
    return _updater(mode, acc_first_order, acc_second_order, weight, time_step, hyper)


def adamax_updater(
    acc_first_order: Tensor,
    acc_second_order: Tensor,
    weight: Tensor | None = None,
    time_step: Tensor | None = None,
    weight_decay: Value = None,
    beta1: Value = 0.9,
    epsilon: Value = 1e-07,
) -> Tensor:
    """The AdaMax update term m/(1-b1^t)/(u+eps) (+ wd*w); increments ``time_step``."""
    if time_step is None:
        raise ValueError("adamax_updater: AdaMax needs time_step for its bias correction.")
    if beta1 is None:
        raise ValueError("adamax_updater: beta1 must be given.")
    hyper = {"weight_decay": weight_decay, "beta1": beta1, "beta2": None, "epsilon": epsilon}
    return _updater("adamax", acc_first_order, acc_second_order, weight, time_step, hyper)


# AdamVarUpdate ----------------------------------------------------------------------------
def _var_update_infer(ins, roles, learning_rate, max_weight_norm):
    s = dict(zip(roles, ins))
    check_float("t", s["t"])
    check_float("x", s["x"])
    if s["x"].shape != s["t"].shape:
        raise ValueError(f"x has shape {s['x'].shape}, the weight has {s['t'].shape}")
    for name in ("r1", "r2", "learning_rate", "max_weight_norm"):
        if name in s:
            check_scalar(name, s[name])
    return [s["t"]]


def _var_update_kernel(*args, roles, learning_rate, max_weight_norm):
    val = dict(zip(roles, args))
    lr = f32(val.get("learning_rate", learning_rate))
    mwn = f32(val.get("max_weight_norm", max_weight_norm))
    # r1, r2 are sums of squares (lamb_square); the trust ratio uses the norms, with the
    # weight norm clipped to max_weight_norm and a ratio of 1 when either norm is zero.
    r1 = torch.minimum(torch.sqrt(f32(val["r1"])), mwn)
    r2 = torch.sqrt(f32(val["r2"]))
    ratio = torch.where((r1 == 0) | (r2 == 0), torch.ones(()), r1 / torch.where(r2 == 0, 1, r2))
    t = val["t"]
    t.copy_(t.float() - (lr * ratio) * val["x"].float())
    return t


def _var_update_ref(t, x, r1, r2, lr, mwn=float("inf")):
    n1 = torch.clamp(torch.sqrt(r1), max=mwn)
    n2 = torch.sqrt(r2)
    ratio = 1.0 if n1 == 0 or n2 == 0 else n1 / n2
    return t - lr * ratio * x


def _var_update_samples() -> list[Sample]:
    t, x = rand(3, 4, seed=60), rand(3, 4, seed=61)
    r1, r2 = np.array(4.0, np.float32), np.array(2.25, np.float32)
    zero, lr = np.array(0.0, np.float32), np.array(0.1, np.float32)
    return [
        Sample(
            [t, x, r1, r2],
            lambda a, b, c, d: adam_var_update(a, b, c, d, 0.01),
            lambda a, b, c, d: _var_update_ref(a, b, c, d, 0.01),
            grad=False,
        ),
        Sample(
            [t, x, r1, r2, lr],
            lambda a, b, c, d, e: adam_var_update(a, b, c, d, e, 1.5),
            lambda a, b, c, d, e: _var_update_ref(a, b, c, d, e, 1.5),
            grad=False,
            name="tensor_lr_clipped",
        ),
        Sample(
            [t, x, zero, r2],
            lambda a, b, c, d: adam_var_update(a, b, c, d, 0.01),
            lambda a, b, c, d: a - 0.01 * b,
            grad=False,
            name="zero_norm_ratio_one",
        ),
    ]


ADAM_VAR_UPDATE = register(
    OpDef(
        "AdamVarUpdate",
        _var_update_infer,
        _var_update_kernel,
        cost=_per_element_cost(2),
        inplace=(0,),
        samples=_var_update_samples,
        out_name="adamvarupdate_out",
    )
)


def adam_var_update(
    t: Tensor,
    x: Tensor,
    r1: Tensor,
    r2: Tensor,
    learning_rate: Value = None,
    max_weight_norm: Value = None,
) -> Tensor:
    """In place: t -= lr * (min(sqrt(r1), mwn) / sqrt(r2)) * x, with r1, r2 sums of squares
    (ratio 1 when a norm is 0). learning_rate None means 0; max_weight_norm None, no clip."""
    roles, ins = ["t", "x", "r1", "r2"], [t, x, r1, r2]
    attrs: dict[str, object] = {}
    for name, value, default in (
        ("learning_rate", learning_rate, 0.0),
        ("max_weight_norm", max_weight_norm, float("inf")),
    ):
        if isinstance(value, Tensor):
            roles.append(name)
            ins.append(value)
        attrs[name] = default if value is None or isinstance(value, Tensor) else float(value)
    attrs["roles"] = tuple(roles)
    return create_op(ADAM_VAR_UPDATE, ins, attrs)[0]
