"""`IPUAdam`: Adam as the IPU's var-update ops compute it (PopXL's / PopTorch's Adam), for
`training_model`.

``torch.optim.Adam`` corrects the moments' bias and keeps them in the parameter's dtype;
hand-written PopXL programs (seed 003's ``Adam`` module) and PopTorch's
``poptorch.optim.Adam(bias_correction=..., first_order_momentum_accum_type=...)`` build the
update from ``ops.var_updates`` instead: ``accumulate_moving_average_`` (the first moment, in
its own dtype, float16 to save memory), ``accumulate_moving_average_square_``, the
``adam_updater`` term ``m / (sqrt(v) + eps)`` (bias-corrected on the device when asked, in
the first moment's dtype) and ``scaled_add_(w, updater, b=-lr)``. `IPUAdam` is a torch
optimizer whose eager ``step`` is that arithmetic written in torch (what each var-update
kernel computes, in the same order and dtypes), so a model trained with it eagerly and with
`training_model` agree bit for bit, and `OptimizerProgram` lowers it to those very ops
(`build_update`). Its state: ``exp_avg`` (``first_order_dtype``), ``exp_avg_sq`` (float32)
and ``step`` (float32 scalar), as ``torch.optim.Adam``'s keys.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

import popxl_core as popxl
from popxl_core import ops

__all__ = ["HYPER", "IPUAdam", "build_update", "hyper_values", "per_param_step", "structure"]

HYPER = ("neg_lr", "beta1", "beta2", "eps", "weight_decay")


class IPUAdam(torch.optim.Optimizer):
    """Adam with the IPU var-updates' arithmetic (PopXL / PopTorch Adam).

    Args:
        params: the parameters (or param groups) to optimise.
        lr, betas, eps, weight_decay: as ``torch.optim.Adam`` (L2 weight decay added to the
            update term, as PopXL's ``adam_updater``).
        bias_correction: divide the moments by ``1 - beta**step`` (``False``: seed 003's
            and PopTorch's ``bias_correction=False``).
        first_order_dtype: the first moment's dtype (``torch.float16`` halves its memory; the
            update term then has that dtype too, as on the IPU).
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        first_order_dtype: torch.dtype = torch.float32,
    ) -> None:
        if first_order_dtype not in (torch.float32, torch.float16):
            raise ValueError(
                f"IPUAdam(first_order_dtype={first_order_dtype}): give torch.float32 or "
                "torch.float16."
            )
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"IPUAdam(betas={betas}): each beta must be in [0, 1).")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            first_order_dtype=first_order_dtype,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        return per_param_step(self, closure, self._update)

    def _update(self, p: torch.Tensor, g: torch.Tensor, group: Mapping) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, dtype=group["first_order_dtype"])
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        m, v, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
        b1, b2 = (_f32(b) for b in group["betas"])
        eps, wd = _f32(group["eps"]), _f32(group["weight_decay"])
        # accumulate_moving_average_: the coefficients and the gradient in m's dtype
        m.copy_(b1.to(m.dtype) * m + (1 - b1).to(m.dtype) * g.to(m.dtype))
        v.copy_(b2 * v + (1 - b2) * (g * g))  # accumulate_moving_average_square_
        step.add_(1)
        mf, vf = m.float(), v.float()
        if group["bias_correction"]:  # adam_updater with a time step
            mf, vf = mf / (1 - b1**step), vf / (1 - b2**step)
        x = mf / (torch.sqrt(vf) + eps)
        if group["weight_decay"] != 0:
            x = x + wd * p.float()
        # the updater has m's dtype; scaled_add_ adds it in p's dtype times -lr
        p.add_(x.to(m.dtype).to(p.dtype), alpha=-_f32(group["lr"]).item())


def _f32(value) -> torch.Tensor:
    return torch.as_tensor(float(value), dtype=torch.float32)


# the program ---------------------------------------------------------------------------
def structure(pg: Mapping) -> tuple:
    """What a built program depends on besides the fed hyper-parameters."""
    return (pg["weight_decay"] != 0, bool(pg["bias_correction"]), pg["first_order_dtype"])


def hyper_values(pg: Mapping, step: int = 0) -> dict[str, float]:
    """The hyper-parameters fed each step (float32 scalars)."""
    beta1, beta2 = (float(b) for b in pg["betas"])
    return {
        "neg_lr": -float(pg["lr"]),
        "beta1": beta1,
        "beta2": beta2,
        "eps": float(pg["eps"]),
        "weight_decay": float(pg["weight_decay"]),
    }


def build_update(state_var, name: str, p, grad, hp: Mapping, pg: Mapping) -> None:
    """The update of ``p`` (a weight or its RTS shard) by ``grad``: the var-update ops
    `IPUAdam.step` computes. ``state_var(name, key, like, dtype)`` makes a state tensor."""
    first = popxl.dtype.as_dtype(pg["first_order_dtype"])
    step = state_var(name, "step", p, popxl.float32)
    m = state_var(name, "exp_avg", p, first)
    v = state_var(name, "exp_avg_sq", p, popxl.float32)
    ops.var_updates.accumulate_moving_average_(m, grad, f=hp["beta1"])
    ops.var_updates.accumulate_moving_average_square_(v, grad, f=hp["beta2"])
    wd = hp["weight_decay"] if pg["weight_decay"] != 0 else 0.0  # no weight input at 0
    if pg["bias_correction"]:  # the updater increments the step, then corrects with it
        upd = ops.var_updates.adam_updater(
            m, v, p, step, wd, hp["beta1"], hp["beta2"], epsilon=hp["eps"]
        )
    else:
        ops.var_updates.accumulate_(step, popxl.constant(1.0, popxl.float32))
        upd = ops.var_updates.adam_updater(m, v, p, weight_decay=wd, epsilon=hp["eps"])
    ops.scaled_add_(p, upd, b=hp["neg_lr"])


def per_param_step(optimizer: torch.optim.Optimizer, closure, update) -> torch.Tensor | None:
    """torch.optim's eager step: the closure's loss (with gradients on), then
    ``update(p, grad, group)`` for every parameter that has a gradient."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                update(p, p.grad, group)
    return loss
