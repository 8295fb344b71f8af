"""``torch.optim.RMSprop`` as var-update ops, in the order and rounding of torch's CPU
single-tensor implementation (``_single_tensor_rmsprop``), and PopTorch's TensorFlow variant.

torch's step: ``square_avg = alpha * square_avg + (1 - alpha) * g * g``; centered, the
gradient's running mean ``grad_avg`` (a ``lerp_``) is subtracted under the root; the
denominator is ``sqrt(...) + eps``; with momentum, ``buf = momentum * buf + g / denom`` and
``p -= lr * buf``, else ``p -= lr * g / denom``.

A param group with ``use_tf_variant=True`` (``poptorch.optim.RMSprop``) is TensorFlow's
RMSprop, as PopTorch documents it: ``square_avg`` starts at ones, ``eps`` is added under the
root, and the momentum buffer accumulates ``lr * g / denom`` (``p -= buf``). `tf_step` is that
update in torch (the eager step of such an optimizer); `build_update` writes the same ops.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

import popxl_core as popxl
from popxl_core import ops

__all__ = ["HYPER", "build_update", "hyper_values", "initial_fill", "structure", "tf_step"]

HYPER = ("neg_lr", "lr", "alpha", "c", "eps", "weight_decay", "momentum")


def tf_variant(pg: Mapping) -> bool:
    return bool(pg.get("use_tf_variant", False))


def structure(pg: Mapping) -> tuple:
    """What a built program depends on besides the fed hyper-parameters."""
    return (
        pg["momentum"] > 0,
        bool(pg["centered"]),
        pg["weight_decay"] != 0,
        bool(pg["maximize"]),
        tf_variant(pg),
        pg.get("differentiable"),
        pg.get("capturable"),
    )


def hyper_values(pg: Mapping, step: int = 0) -> dict[str, float]:
    """The hyper-parameters fed each step, computed in double as torch does on the host."""
    lr, alpha = float(pg["lr"]), float(pg["alpha"])
    return {
        "neg_lr": -lr,
        "lr": lr,
        "alpha": alpha,
        "c": 1 - alpha,
        "eps": float(pg["eps"]),
        "weight_decay": float(pg["weight_decay"]),
        "momentum": float(pg["momentum"]),
    }


def initial_fill(pg: Mapping, key: str) -> float:
    """A state tensor's value before the first step (TF's ``square_avg`` starts at one)."""
    return 1.0 if key == "square_avg" and tf_variant(pg) else 0.0


def build_update(state_var, name: str, p, grad, hp: Mapping, pg: Mapping) -> None:
    """The update of ``p`` by ``grad``; ``state_var(name, key, like)`` makes a state tensor."""
    if pg["maximize"]:
        grad = ops.negate(grad)
    ops.var_updates.accumulate_(state_var(name, "step", p), popxl.constant(1.0, popxl.float32))
    if pg["weight_decay"] != 0:
        grad = ops.scaled_add(grad, p, b=hp["weight_decay"])
    sq = state_var(name, "square_avg", p)
    ops.var_updates.accumulator_scale_(sq, hp["alpha"])
    ops.var_updates.addcmul_(sq, grad, grad, hp["c"])
    avg = sq
    if pg["centered"]:
        grad_avg = state_var(name, "grad_avg", p)
        ops.var_updates.lerp_(grad_avg, grad, hp["c"])
        # torch's out-of-place addcmul (its CPU kernel fuses the multiply-add): on a copy
        avg = ops.var_updates.addcmul_(ops.identity(sq), grad_avg, grad_avg, -1.0)
    if tf_variant(pg):  # eps under the root, lr into the momentum buffer
        _tf_apply(state_var, name, p, grad, ops.sqrt(ops.add(avg, hp["eps"])), hp, pg)
        return
    denom = ops.add(ops.sqrt(avg), hp["eps"])
    if pg["momentum"] > 0:
        buf = state_var(name, "momentum_buffer", p)
        ops.var_updates.accumulator_scale_(buf, hp["momentum"])
        ops.var_updates.addcdiv_(buf, grad, denom, 1.0)
        ops.scaled_add_(p, buf, b=hp["neg_lr"])
    else:
        ops.var_updates.addcdiv_(p, grad, denom, hp["neg_lr"])


def _tf_apply(state_var, name: str, p, grad, denom, hp: Mapping, pg: Mapping) -> None:
    if pg["momentum"] > 0:
        buf = state_var(name, "momentum_buffer", p)
        ops.var_updates.accumulator_scale_(buf, hp["momentum"])
        ops.var_updates.addcdiv_(buf, grad, denom, hp["lr"])
        ops.scaled_add_(p, buf, b=-1.0)
    else:
        ops.var_updates.addcdiv_(p, grad, denom, hp["neg_lr"])


@torch.no_grad()
def tf_step(p: torch.Tensor, grad: torch.Tensor, state: dict, group: Mapping) -> None:
    """One TF-variant step of ``p`` in torch: the arithmetic `build_update` writes."""
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32)
        state["square_avg"] = torch.ones_like(p)
        if group["momentum"] > 0:
            state["momentum_buffer"] = torch.zeros_like(p)
        if group["centered"]:
            state["grad_avg"] = torch.zeros_like(p)
    hp = {k: torch.tensor(v, dtype=torch.float32) for k, v in hyper_values(group).items()}
    grad = -grad if group["maximize"] else grad
    state["step"] += 1
    if group["weight_decay"] != 0:
        grad = grad.add(p, alpha=hp["weight_decay"].item())
    sq = state["square_avg"]
    sq.mul_(hp["alpha"]).addcmul_(grad, grad, value=hp["c"].item())
    avg = sq
    if group["centered"]:
        state["grad_avg"].lerp_(grad, hp["c"])
        avg = sq.addcmul(state["grad_avg"], state["grad_avg"], value=-1)
    denom = torch.sqrt(avg + hp["eps"])
    if group["momentum"] > 0:
        buf = state["momentum_buffer"]
        buf.mul_(hp["momentum"]).addcdiv_(grad, denom, value=hp["lr"].item())
        p.add_(buf, alpha=-1.0)
    else:
        p.addcdiv_(grad, denom, value=hp["neg_lr"].item())
