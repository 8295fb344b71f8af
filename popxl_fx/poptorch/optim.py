"""``poptorch.optim``: SGD, Adam, AdamW, RMSprop and LAMB with PopTorch's extra arguments.

Each is a subclass of the torch optimizer of the same name (as in PopTorch), so its eager
``step`` is torch's and schedulers work. The IPU-only arguments (loss and velocity scaling,
accumulator dtypes, max_grad_norm, ...) are kept on the optimizer and in its param groups;
`popxl_fx.poptorch.optim_map` says how a training executor runs each of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import optim_lamb, optim_rmsprop
from ..optim_groups import adam_hyper
from ..optim_storage import DTYPE_KEYS
from .optim_half import ipu_step

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "Optimizer", "RMSprop", "VariableAttributes"]


class VariableAttributes:
    """Which hyper-parameters may change between runs without recompiling: PopTorch's
    variable vs constant attributes, variable when given to the constructor. Here every value
    is fed per step, so all can change; the marks are kept for the user's code."""

    def __init__(self, variable_attributes: list[str], allowed_attributes: list[str]) -> None:
        self._allowed_attributes = list(allowed_attributes)
        self._variable_attributes = set(variable_attributes)

    def _check(self, attr: str) -> None:
        if attr not in self._allowed_attributes:
            raise ValueError(
                f"unknown optimizer attribute {attr!r}; known: {self._allowed_attributes}."
            )

    def isConstant(self, attr: str) -> bool:
        self._check(attr)
        return attr not in self._variable_attributes

    def markAsConstant(self, attr: str) -> None:
        self._check(attr)
        self._variable_attributes.discard(attr)

    def markAsVariable(self, attr: str) -> None:
        self._check(attr)
        self._variable_attributes.add(attr)


class Optimizer:
    """What PopTorch's optimizers share: their IPU arguments and variable attributes."""

    _ipu_defaults: dict = {}
    _kind = ""  # `popxl_fx.optim_storage`'s optimizer kind (its state keys' dtypes)

    def _ipu_init(self, given: dict, variable: list[str]) -> None:
        """The IPU arguments ``given`` (None: PopTorch's default) into defaults and groups;
        ``variable``: the arguments given explicitly (PopTorch's variable attributes)."""
        ipu = {k: (v if given.get(k) is None else given[k]) for k, v in self._ipu_defaults.items()}
        _check_accum_types(ipu)
        for key, value in ipu.items():
            self.defaults[key] = value
            for group in self.param_groups:
                group.setdefault(key, value)
        names = list(self.defaults)
        self.variable_attrs = VariableAttributes([n for n in names if n in variable], names)
        self.host_state_is_dirty = False
        self.ipu_state_is_dirty = False
        # set by the executor once built (`optim_state.read`)
        self._ipu_reader: Callable[[], dict] | None = None
        # a loaded state_dict's IPU part, taken at the next call
        self._ipu_loaded: dict[str, Any] | None = None

    def state_dict(self) -> dict:
        """torch's state dict plus PopTorch's ``ipu_state`` and ``ipu_param`` (None until a
        training executor is compiled; `popxl_fx.poptorch.optim_state`)."""
        reader = self.__dict__.get("_ipu_reader")
        ipu = self.__dict__.get("_ipu_loaded") or (reader and reader())
        return {**torch.optim.Optimizer.state_dict(self), **(ipu or dict.fromkeys(_IPU_KEYS))}

    def __getstate__(self) -> dict:
        """torch's (defaults, state, param_groups) and PopTorch's attributes, so that copies
        keep them (not the executor's reader: a copy is read once an executor takes it)."""
        state = torch.optim.Optimizer.__getstate__(self)
        keep = ("variable_attrs", "host_state_is_dirty", "ipu_state_is_dirty", "_ipu_loaded")
        return {**state, **{k: self.__dict__[k] for k in keep if k in self.__dict__}}

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's state and the IPU state of a PopTorch optimizer's ``state_dict``."""
        if not all(k in state_dict for k in _IPU_KEYS):
            raise RuntimeError("Only IPU optimizer states can be loaded onto the IPU.")
        torch_part = {k: v for k, v in state_dict.items() if k not in _IPU_KEYS}
        torch.optim.Optimizer.load_state_dict(self, torch_part)
        self._ipu_loaded = {k: state_dict[k] for k in _IPU_KEYS}

    def _init_from(self, base: type[torch.optim.Optimizer], given: dict) -> None:
        """``base.__init__`` with the torch arguments of ``given`` (a constructor's
        ``locals()``; None: torch's default), then the IPU arguments (`_ipu_init`)."""
        given = {k: v for k, v in given.items() if k not in ("self", "__class__")}
        variable = [k for k, v in given.items() if v is not None]
        params = given.pop("params")
        ipu = {k: given.pop(k) for k in self._ipu_defaults}
        base.__init__(self, params, **_torch_kwargs(**given))
        self._ipu_init(ipu, variable)

    # PopTorch keeps its global arguments (loss_scaling, the accumulator dtypes, ...) as
    # attributes: ``opt.loss_scaling = 2.0`` is read by the next setOptimizer. Here they live
    # in defaults and every param group, where popxl_fx reads them; the attribute is a view.
    _group_vars: tuple = ("velocity_scaling", "max_weight_norm")
    _more_globals: tuple = ()  # a base class's defaults that PopTorch keeps as attributes

    def _is_global(self, name: str) -> bool:
        known = name in type(self)._ipu_defaults or name in self._more_globals
        return known and name not in self._group_vars

    def __getattr__(self, name: str):
        defaults = self.__dict__.get("defaults")
        if defaults is not None and name in defaults and self._is_global(name):
            return defaults[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if "param_groups" in self.__dict__ and self._is_global(name):
            self.defaults[name] = value
            for group in self.param_groups:
                group[name] = value
            return
        super().__setattr__(name, value)

    @torch.no_grad()
    def step(self, closure=None):
        """The torch step with PopTorch's accumulator dtypes: float16 weights updated in
        float32, the state in its ``*_accum_type`` (`optim_half`)."""
        return ipu_step(self, self._plain_step, closure)

    def _plain_step(self, closure=None):
        return super(Optimizer, self).step(closure)  # the torch optimizer's (next in the MRO)

    def ipu(self, key: str):
        """An IPU argument's value (the defaults'; per group in ``param_groups``)."""
        return self.defaults[key]


def _check_accum_types(ipu: dict) -> None:
    """PopTorch asserts that the accumulators are float32 or float16."""
    for key in ("accum_type", *DTYPE_KEYS):
        if key in ipu and ipu[key] not in (torch.float16, torch.float32):
            raise AssertionError(
                f"{key}={ipu[key]}: accumulation types must be torch.float32 or torch.float16."
            )


def _torch_kwargs(**kwargs) -> dict:
    return {k: v for k, v in kwargs.items() if v is not None}


_F32 = torch.float32
_IPU_KEYS = ("ipu_state", "ipu_param")


def _closure_loss(closure):
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _adamw_update(p: torch.Tensor, grad: torch.Tensor, state: dict, group: dict) -> None:
    """torch's single-tensor AdamW step of ``p``, with `adam_hyper`'s (un)corrected terms."""
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
    grad = -grad if group["maximize"] else grad
    state["step"] += 1
    hp = adam_hyper(group, int(state["step"]))
    if group["weight_decay"] != 0:
        p.mul_(hp["decay"])
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.lerp_(grad, hp["w1"])
    v.mul_(hp["beta2"]).addcmul_(grad, grad, value=hp["c2"])
    denom = (v.sqrt() / hp["bc2_sqrt"]).add_(hp["eps"])
    p.addcdiv_(m, denom, value=hp["neg_step_size"])


class SGD(Optimizer, torch.optim.SGD):
    """``poptorch.optim.SGD``: torch's SGD plus loss_scaling, velocity_scaling,
    use_combined_accum, accum_type, velocity_accum_type and max_grad_norm."""

    _kind = "sgd"
    _ipu_defaults = {
        "loss_scaling": 1.0,
        "velocity_scaling": 1.0,
        "use_combined_accum": None,
        "accum_type": _F32,
        "velocity_accum_type": _F32,
        "max_grad_norm": float("inf"),
    }

    def __init__(
        self,
        params,
        lr: float,
        momentum=None,
        dampening=None,
        weight_decay=None,
        nesterov=None,
        maximize=None,
        foreach=None,
        differentiable=None,
        loss_scaling=None,
        velocity_scaling=None,
        use_combined_accum=None,
        accum_type=None,
        velocity_accum_type=None,
        max_grad_norm=None,
    ) -> None:
        self._init_from(torch.optim.SGD, locals())


_ADAM_IPU = {
    "loss_scaling": 1.0,
    "accum_type": _F32,
    "first_order_momentum_accum_type": _F32,
    "second_order_momentum_accum_type": _F32,
    "max_grad_norm": float("inf"),
}


class Adam(Optimizer, torch.optim.Adam):
    """``poptorch.optim.Adam``: torch's Adam plus loss_scaling, the accumulators' dtypes and
    max_grad_norm."""

    _kind = "adam"
    _ipu_defaults = dict(_ADAM_IPU)

    def __init__(
        self,
        params,
        lr=None,
        betas=None,
        eps=None,
        weight_decay=None,
        amsgrad=None,
        foreach=None,
        maximize=None,
        capturable=None,
        differentiable=None,
        fused=None,
        loss_scaling=None,
        accum_type=None,
        first_order_momentum_accum_type=None,
        second_order_momentum_accum_type=None,
        max_grad_norm=None,
    ) -> None:
        self._init_from(torch.optim.Adam, locals())


class AdamW(Optimizer, torch.optim.AdamW):
    """``poptorch.optim.AdamW``: torch's AdamW plus bias_correction, loss_scaling, the
    accumulators' dtypes and max_grad_norm."""

    _kind = "adam"
    _ipu_defaults = {**_ADAM_IPU, "bias_correction": True}

    def __init__(
        self,
        params,
        lr=None,
        betas=None,
        eps=None,
        weight_decay=None,
        amsgrad=None,
        maximize=None,
        foreach=None,
        capturable=None,
        differentiable=None,
        fused=None,
        loss_scaling=None,
        bias_correction=None,
        accum_type=None,
        first_order_momentum_accum_type=None,
        second_order_momentum_accum_type=None,
        max_grad_norm=None,
    ) -> None:
        self._init_from(torch.optim.AdamW, locals())

    def _plain_step(self, closure=None):
        """torch's step; without bias correction, the same arithmetic with the moments
        uncorrected (what the training program computes)."""
        if all(g["bias_correction"] for g in self.param_groups):
            return torch.optim.AdamW.step(self, closure)
        loss = _closure_loss(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _adamw_update(p, p.grad, self.state[p], group)
        return loss


class RMSprop(Optimizer, torch.optim.RMSprop):
    """``poptorch.optim.RMSprop``: torch's RMSprop plus loss_scaling, the accumulators'
    dtypes and use_tf_variant. Its eager step is torch's; a training executor refuses it
    (`optim_map`)."""

    _kind = "rmsprop"
    _ipu_defaults = {**_ADAM_IPU, "use_tf_variant": False}
    del _ipu_defaults["max_grad_norm"]

    def __init__(
        self,
        params,
        lr=None,
        alpha=None,
        eps=None,
        weight_decay=None,
        momentum=None,
        centered=None,
        foreach=None,
        maximize=None,
        differentiable=None,
        loss_scaling=None,
        accum_type=None,
        first_order_momentum_accum_type=None,
        second_order_momentum_accum_type=None,
        use_tf_variant=None,
    ) -> None:
        self._init_from(torch.optim.RMSprop, locals())

    def _plain_step(self, closure=None):
        """torch's step; a group with ``use_tf_variant`` takes TensorFlow's
        (`popxl_fx.optim_rmsprop.tf_step`, what the training program computes)."""
        tf = [g for g in self.param_groups if g["use_tf_variant"]]
        if not tf:
            return torch.optim.RMSprop.step(self, closure)
        loss = _closure_loss(closure)
        groups = self.param_groups
        self.param_groups = [g for g in groups if not g["use_tf_variant"]]
        try:
            torch.optim.RMSprop.step(self)
        finally:
            self.param_groups = groups
        for group in tf:
            for p in group["params"]:
                if p.grad is not None:
                    optim_rmsprop.tf_step(p, p.grad, self.state[p], group)
        return loss


class LAMB(Optimizer, optim_lamb.LAMB):
    """``poptorch.optim.LAMB``: `popxl_fx.optim_lamb.LAMB` (its eager step and the simulated
    update agree bit for bit) plus loss_scaling and the accumulators' dtypes."""

    _kind = "lamb"
    _ipu_defaults = dict(_ADAM_IPU)
    del _ipu_defaults["max_grad_norm"]
    _more_globals = ("bias_correction",)

    def __init__(
        self,
        params,
        lr=None,
        betas=None,
        eps=None,
        weight_decay=None,
        bias_correction=None,
        loss_scaling=None,
        max_weight_norm=None,
        accum_type=None,
        first_order_momentum_accum_type=None,
        second_order_momentum_accum_type=None,
    ) -> None:
        self._init_from(optim_lamb.LAMB, locals())
