"""``fused=True`` param groups of torch.optim SGD, Adam and AdamW as fused var-update ops.

torch updates such a group with one call of ``torch._fused_sgd_`` / ``_fused_adam_`` /
``_fused_adamw_`` over the lists of its parameters, gradients and state. Here each parameter
gets one `popxl_core.ops.var_updates.fused_sgd_` / ``fused_adam_`` op, which calls the same
kernel; the compiler runs the ops of a group as one call again (`speed.FOREACH`), so a
step is bitwise torch's fused step.

The kernels take their hyper-parameters as doubles and compute Adam's bias corrections and
AdamW's decay in double from them (a float32-rounded ``lr`` changes bits), so each group gets
one float64 stream holding its five hyper-parameters (one transfer per step, not five), fed
from ``param_groups`` before every step (``torch.optim.lr_scheduler`` works unchanged).
Adam's ``step`` lives in a float32 variable per parameter and is read by the kernel, as in
torch. SGD's ``is_first_step`` (the momentum buffers do not exist yet) is fed as
``first_step``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import popxl_core as popxl
from popxl_core import ops

__all__ = ["FusedBuilder", "fused_feeds", "fused_hyper", "fused_structure", "hyper_names"]

# the hyper-parameters of ops.var_updates.fused_sgd_ / fused_adam_, in their packed order
SGD_HYPER = ("lr", "weight_decay", "momentum", "dampening", "first_step")
ADAM_HYPER = ("lr", "beta1", "beta2", "weight_decay", "eps")


def hyper_names(kind: str) -> tuple[str, ...]:
    return SGD_HYPER if kind == "sgd" else ADAM_HYPER


def fused_structure(kind: str, pg: Mapping) -> tuple:
    """What a fused group's program depends on (the kernels branch on the values of
    weight decay and momentum themselves; the momentum buffers exist or not)."""
    if kind == "sgd":
        return ("fused", pg["momentum"] != 0, bool(pg["nesterov"]), bool(pg["maximize"]))
    decoupled = bool(pg.get("decoupled_weight_decay", False))
    return ("fused", decoupled, bool(pg["maximize"]), bool(pg["amsgrad"]))


def fused_hyper(kind: str, pg: Mapping, step: int) -> dict[str, float]:
    """The values torch passes to its fused kernel for the group's ``step``-th step."""
    if kind == "sgd":
        return {
            "lr": float(pg["lr"]),
            "weight_decay": float(pg["weight_decay"]),
            "momentum": float(pg["momentum"]),
            "dampening": float(pg["dampening"]),
            "first_step": 1.0 if step == 1 else 0.0,  # torch: no momentum buffer yet
        }
    beta1, beta2 = (float(b) for b in pg["betas"])
    return {
        "lr": float(pg["lr"]),
        "beta1": beta1,
        "beta2": beta2,
        "weight_decay": float(pg["weight_decay"]),
        "eps": float(pg["eps"]),
    }


def fused_feeds(kind: str, streams: Mapping, pg: Mapping, step: int) -> dict:
    """The group's packed hyper-parameter stream -> its values for the ``step``-th step."""
    values = fused_hyper(kind, pg, step)
    return {streams["hyper"]: np.array([values[h] for h in hyper_names(kind)], np.float64)}


class FusedBuilder:
    """Adds a fused group's updates; ``state_var(name, key, like)`` makes a state variable."""

    def __init__(self, kind: str, state_var) -> None:
        self.kind = kind
        self.state_var = state_var

    def streams(self, index: int) -> dict[str, popxl.HostToDeviceStream]:
        """The group's hyper-parameters: one float64 stream of five values."""
        n = len(hyper_names(self.kind))
        return {"hyper": popxl.h2d_stream((n,), popxl.float64, f"optimizer.group{index}.hyper")}

    def build(self, streams: Mapping, names, params, grads, pg: Mapping) -> None:
        hp = ops.host_load(streams["hyper"], "hyper")
        for n in names:
            if self.kind == "sgd":
                self._sgd(n, params[n], grads[n], hp, pg)
            else:
                self._adam(n, params[n], grads[n], hp, pg)

    def _sgd(self, name: str, p, grad, hp, pg) -> None:
        buf = self.state_var(name, "momentum_buffer", p) if pg["momentum"] != 0 else None
        ops.var_updates.fused_sgd_(
            p,
            grad,
            buf,
            hyper=hp,
            nesterov=bool(pg["nesterov"]),
            maximize=bool(pg["maximize"]),
        )

    def _adam(self, name: str, p, grad, hp, pg) -> None:
        # state in torch's order: step, exp_avg, exp_avg_sq (, max_exp_avg_sq)
        step = self.state_var(name, "step", p)
        m = self.state_var(name, "exp_avg", p)
        v = self.state_var(name, "exp_avg_sq", p)
        vmax = self.state_var(name, "max_exp_avg_sq", p) if pg["amsgrad"] else None
        ops.var_updates.fused_adam_(
            p,
            grad,
            m,
            v,
            step,
            hyper=hp,
            max_exp_avg_sq=vmax,
            maximize=bool(pg["maximize"]),
            decoupled_weight_decay=bool(pg.get("decoupled_weight_decay", False)),
        )
