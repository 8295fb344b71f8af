"""`LAMB`: layer-wise adaptive moments (https://arxiv.org/abs/1904.00962), as PopTorch's
``poptorch.optim.LAMB`` defines it, for eager steps and for `training_model`.

Per parameter: Adam's moments (``m = beta1 * m + (1 - beta1) * g``,
``v = beta2 * v + (1 - beta2) * g * g``), bias-corrected when ``bias_correction`` is set; the
update ``u = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + weight_decay * w``; the trust ratio
``min(|w|, max_weight_norm) / |u|`` (1 when either norm is zero); ``w -= lr * trust * u``.
The eager `LAMB.step` computes it with the very kernels `build_update` writes as ops (the
same order and float32 rounding), so eager and simulated training agree bit for bit. The bias
corrections are computed in double on the host and fed as float32, as torch's Adam does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

import popxl_core as popxl
from popxl_core import ops

from .optim_ipu import per_param_step

__all__ = ["HYPER", "LAMB", "WHOLE_TENSORS", "build_update", "hyper_values", "structure"]

HYPER = ("neg_lr", "beta1", "c1", "beta2", "c2", "bc1", "bc2_sqrt", "eps", "weight_decay")
FP16_MAX = 65500.0  # PopTorch's max_weight_norm when none is given
WHOLE_TENSORS = True  # the trust ratio needs whole weights (not RTS shards)


class LAMB(torch.optim.Optimizer):
    """LAMB with PopTorch's arguments (``max_weight_norm=None``: float16's largest value).

    Example::

        opt = LAMB(model.parameters(), lr=1e-3, max_weight_norm=10.0)
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        bias_correction: bool = True,
        max_weight_norm: float | None = None,
    ) -> None:
        mwn = FP16_MAX if max_weight_norm is None else float(max_weight_norm)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            max_weight_norm=mwn,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        return per_param_step(self, closure, self._update)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: Mapping) -> None:
        _eager_update(p, grad, self.state[p], group)


def _eager_update(p: torch.Tensor, grad: torch.Tensor, state: dict, group: Mapping) -> None:
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
    state["step"] += 1
    hp = {
        k: torch.tensor(v, dtype=torch.float32)
        for k, v in hyper_values(group, int(state["step"])).items()
    }
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.mul_(hp["beta1"]).add_(grad, alpha=hp["c1"].item())
    v.mul_(hp["beta2"]).addcmul_(grad, grad, value=hp["c2"].item())
    upd = (m / hp["bc1"]) / (torch.sqrt(v) / hp["bc2_sqrt"] + hp["eps"]) + hp["weight_decay"] * p
    w_norm = torch.sqrt(torch.sum(p * p)).clamp(max=float(group["max_weight_norm"]))
    u_norm = torch.sqrt(torch.sum(upd * upd))
    trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones(()))
    p.add_(upd, alpha=(hp["neg_lr"] * trust).item())


def structure(pg: Mapping) -> tuple:
    """What a built program depends on besides the fed hyper-parameters."""
    return (bool(pg["bias_correction"]), float(pg["max_weight_norm"]))


def hyper_values(pg: Mapping, step: int) -> dict[str, float]:
    """The hyper-parameters of step ``step`` (from 1), computed in double on the host."""
    beta1, beta2 = (float(b) for b in pg["betas"])
    corrected = bool(pg["bias_correction"])
    return {
        "neg_lr": -float(pg["lr"]),
        "beta1": beta1,
        "c1": 1 - beta1,
        "beta2": beta2,
        "c2": 1 - beta2,
        "bc1": 1 - beta1**step if corrected else 1.0,
        "bc2_sqrt": math.sqrt(1 - beta2**step) if corrected else 1.0,
        "eps": float(pg["eps"]),
        "weight_decay": float(pg["weight_decay"]),
    }


def build_update(state_var, name: str, p, grad, hp: Mapping, pg: Mapping) -> None:
    """The update of ``p`` by ``grad`` (the ops `_eager_update` runs)."""
    ops.var_updates.accumulate_(state_var(name, "step", p), popxl.constant(1.0, popxl.float32))
    m, v = state_var(name, "exp_avg", p), state_var(name, "exp_avg_sq", p)
    ops.var_updates.accumulator_scale_(m, hp["beta1"])
    ops.scaled_add_(m, grad, b=hp["c1"])
    ops.var_updates.accumulator_scale_(v, hp["beta2"])
    ops.var_updates.addcmul_(v, grad, grad, hp["c2"])
    denom = ops.add(ops.div(ops.sqrt(v), hp["bc2_sqrt"]), hp["eps"])
    upd = ops.add(ops.div(ops.div(m, hp["bc1"]), denom), ops.mul(hp["weight_decay"], p))
    w_norm = ops.clip(ops.sqrt(ops.reduce_sum(ops.mul(p, p))), max=float(pg["max_weight_norm"]))
    u_norm = ops.sqrt(ops.reduce_sum(ops.mul(upd, upd)))
    zero = popxl.constant(0.0, popxl.float32)
    both = ops.logical_and(ops.greater(w_norm, zero), ops.greater(u_norm, zero))
    trust = ops.where(both, ops.div(w_norm, u_norm), popxl.constant(1.0, popxl.float32))
    ops.scaled_add_(p, upd, b=ops.mul(hp["neg_lr"], trust))
