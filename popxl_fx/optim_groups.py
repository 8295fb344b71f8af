"""What a torch param group means to the simulated optimizer: its kind, the options refused,
its structure (a change needs another program) and the hyper-parameters fed each step,
computed as torch computes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from . import optim_ipu, optim_lamb, optim_rmsprop
from .optim_fused import fused_structure
from .optim_storage import DTYPE_KEYS

__all__ = [
    "ADAM_HYPER",
    "LOWERINGS",
    "SGD_HYPER",
    "UnsupportedOptimizerError",
    "adam_hyper",
    "check_group",
    "decoupled",
    "group_structure",
    "hyper_source",
    "optimizer_kind",
    "sgd_hyper",
    "state_slots",
]

SGD_HYPER = ("neg_lr", "weight_decay", "buf_scale", "damp_alpha", "momentum")
ADAM_HYPER = ("w1", "beta2", "c2", "bc2_sqrt", "eps", "neg_step_size", "weight_decay", "decay")
# options that change torch's arithmetic in ways the program does not reproduce
_REJECT = {"amsgrad": True, "capturable": True, "differentiable": True}
# torch's fused path does amsgrad, and ignores capturable (the same kernels on CPU)
_REJECT_FUSED = {"differentiable": True}


class UnsupportedOptimizerError(ValueError):
    """The torch optimizer (or one of its options) has no exact equivalent in the program."""


_KINDS = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adam",
    optim_ipu.IPUAdam: "ipu_adam",
    torch.optim.RMSprop: "rmsprop",
    optim_lamb.LAMB: "lamb",
}
# the kinds whose update is a module of their own: its HYPER names, structure(pg),
# hyper_values(pg, step), build_update(state_var, name, p, grad, hp, pg) and, optionally,
# initial_fill(pg, key) (a state tensor's value before the first step)
LOWERINGS = {"ipu_adam": optim_ipu, "rmsprop": optim_rmsprop, "lamb": optim_lamb}


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    """'sgd', 'adam' (Adam and AdamW) or 'ipu_adam'; any other optimizer is refused (its exact
    type: a subclass may change the arithmetic)."""
    kind = _KINDS.get(type(optimizer))
    if kind is None:
        raise UnsupportedOptimizerError(
            f"optimizer {type(optimizer).__name__} is not supported by training_model; use "
            "torch.optim.SGD, Adam, AdamW or RMSprop, popxl_fx.IPUAdam, popxl_fx.optim_lamb.LAMB, "
            "or popxl_fx.compile, which runs any torch optimizer."
        )
    return kind


def check_group(optimizer, kind: str, i: int, group: Mapping) -> None:
    fused = bool(group.get("fused"))
    for opt, bad in (_REJECT_FUSED if fused else _REJECT).items():
        if group.get(opt) == bad:
            also = " with fused=True" if fused else ""
            hint = " (or fused=True)" if opt == "amsgrad" else ""
            raise UnsupportedOptimizerError(
                f"param group {i}: {opt}={bad!r}{also} is not reproduced by the simulated "
                f"optimizer; use {opt}={not bad!r}{hint}, or popxl_fx.compile to keep the "
                "torch optimizer."
            )
    if fused and getattr(optimizer, "grad_scale", None) is not None:
        raise UnsupportedOptimizerError(
            f"param group {i}: fused=True with a grad_scale (torch.amp.GradScaler unscales "
            "inside the fused kernel) is not reproduced by the simulated optimizer; train "
            "without the GradScaler, or use popxl_fx.compile to keep the torch optimizer."
        )
    if fused and not _fused_can(group):
        raise UnsupportedOptimizerError(
            f"param group {i}: fused=True runs torch's fused kernels, which have no "
            "bias_correction=False and no float16 state; use fused=False."
        )
    if kind == "adam" and float(group["betas"][0]) >= 1.0:
        raise UnsupportedOptimizerError(f"param group {i}: betas[0] must be below 1.")


def _fused_can(group: Mapping) -> bool:
    """The group asks nothing of PopTorch's that torch's fused kernels do not compute."""
    half = any(group.get(k) not in (None, torch.float32) for k in DTYPE_KEYS)
    return group.get("bias_correction", True) and not half


def group_structure(optimizer_type: type, pg: Mapping) -> tuple:
    """The options of a param group that the program is built with (not fed as streams):
    a change needs another program."""
    kind = _KINDS.get(optimizer_type)
    rejected = tuple(pg.get(opt) for opt in _REJECT)  # a program is refused when set
    if kind is None:
        return rejected
    max_norm = float(pg.get("max_grad_norm", math.inf))  # `optim_clip`
    clip = (max_norm, tuple(str(pg.get(k)) for k in DTYPE_KEYS))  # and `optim_storage`
    if kind in LOWERINGS:
        return (LOWERINGS[kind].structure(pg), clip)
    if pg.get("fused"):
        return ("fused", fused_structure(kind, pg), rejected)
    if kind == "sgd":
        return (
            pg["momentum"] != 0,
            bool(pg["nesterov"]),
            pg["weight_decay"] != 0,
            bool(pg["maximize"]),
            rejected,
            clip,
        )
    corrected = pg.get("bias_correction", True)
    return (pg["weight_decay"] != 0, decoupled(pg), bool(pg["maximize"]), rejected, clip, corrected)


def decoupled(pg: Mapping) -> bool:
    return bool(pg.get("decoupled_weight_decay", False))


def hyper_source(kind: str, pg: Mapping, step: int) -> tuple:
    """Everything `sgd_hyper` / `adam_hyper` read (the values as given, not converted)."""
    if kind == "sgd":
        keys = ("lr", "weight_decay", "momentum", "dampening")
        return (step == 1, *(_frozen(pg[k]) for k in keys))
    if kind in LOWERINGS:
        return (step, *(_frozen(v) for k, v in sorted(pg.items()) if k != "params"))
    return (step, *(_frozen(pg[k]) for k in ("lr", "weight_decay", "betas", "eps")))


def _frozen(value: object) -> object:
    """A hyper-parameter as a cache key: a tensor lr (allowed by torch) by its current value."""
    if isinstance(value, torch.Tensor):
        return ("tensor", float(value))
    if isinstance(value, (tuple, list)):
        return tuple(_frozen(v) for v in value)
    return value


def sgd_hyper(pg: Mapping, step: int) -> dict[str, float]:
    first = step == 1  # torch's buffer is a copy of the gradient on its first step
    return {
        "neg_lr": -float(pg["lr"]),
        "weight_decay": float(pg["weight_decay"]),
        "buf_scale": 0.0 if first else float(pg["momentum"]),
        "damp_alpha": 1.0 if first else 1.0 - float(pg["dampening"]),
        "momentum": float(pg["momentum"]),
    }


def adam_hyper(pg: Mapping, step: int) -> dict[str, float]:
    lr, wd = float(pg["lr"]), float(pg["weight_decay"])
    beta1, beta2 = (float(b) for b in pg["betas"])
    # PopTorch's AdamW(bias_correction=False): the moments as they are
    bc1, bc2 = (1 - beta1**step, 1 - beta2**step) if pg.get("bias_correction", True) else (1, 1)
    return {
        "w1": 1 - beta1,
        "beta2": beta2,
        "c2": 1 - beta2,
        "bc2_sqrt": bc2**0.5,
        "eps": float(pg["eps"]),
        "neg_step_size": -(lr / bc1),
        "weight_decay": wd,
        "decay": 1 - lr * wd,
    }


def state_slots(kind: str, groups) -> int:
    """How many weight-sized state tensors the optimizer keeps per weight (at most)."""
    momentum = int(any(g.get("momentum", 0) for g in groups))
    if kind == "rmsprop":
        return 1 + int(any(g.get("centered") for g in groups)) + momentum
    return 2 if kind in ("adam", "ipu_adam", "lamb") else momentum
