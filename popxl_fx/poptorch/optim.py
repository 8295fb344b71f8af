"""``poptorch.optim``: SGD, Adam, AdamW, RMSprop and LAMB with PopTorch's extra arguments.

Each is a subclass of the torch optimizer of the same name (as in PopTorch), so its eager
``step`` is torch's and schedulers work. The IPU-only arguments (loss and velocity scaling,
accumulator dtypes, max_grad_norm, ...) are kept on the optimizer and in its param groups;
`popxl_fx.poptorch.optim_map` says how a training executor runs each of them.
"""

from __future__ import annotations

import torch

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "Optimizer", "RMSprop", "VariableAttributes"]


class VariableAttributes:
    """Which hyper-parameters may change between runs without recompiling (PopTorch's
    variable vs constant attributes; here every value is fed per step, so all can)."""

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

    def _ipu_init(self, given: dict) -> None:
        ipu = {k: (v if given.get(k) is None else given[k]) for k, v in self._ipu_defaults.items()}
        for key, value in ipu.items():
            self.defaults[key] = value
            for group in self.param_groups:
                group.setdefault(key, value)
        names = list(self.defaults)
        self.variable_attrs = VariableAttributes(names, names)
        self.host_state_is_dirty = False
        self.ipu_state_is_dirty = False

    def _init_from(self, base: type, given: dict) -> None:
        """``base.__init__`` with the torch arguments of ``given`` (a constructor's
        ``locals()``; None: torch's default), then the IPU arguments (`_ipu_init`)."""
        given = {k: v for k, v in given.items() if k not in ("self", "__class__")}
        params = given.pop("params")
        ipu = {k: given.pop(k) for k in self._ipu_defaults}
        base.__init__(self, params, **_torch_kwargs(**given))
        self._ipu_init(ipu)

    def ipu(self, key: str):
        """An IPU argument's value (the defaults'; per group in ``param_groups``)."""
        return self.defaults[key]


def _torch_kwargs(**kwargs) -> dict:
    return {k: v for k, v in kwargs.items() if v is not None}


_F32 = torch.float32


class SGD(Optimizer, torch.optim.SGD):
    """``poptorch.optim.SGD``: torch's SGD plus loss_scaling, velocity_scaling,
    use_combined_accum, accum_type, velocity_accum_type and max_grad_norm."""

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


class RMSprop(Optimizer, torch.optim.RMSprop):
    """``poptorch.optim.RMSprop``: torch's RMSprop plus loss_scaling, the accumulators'
    dtypes and use_tf_variant. Its eager step is torch's; a training executor refuses it
    (`optim_map`)."""

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


class LAMB(Optimizer, torch.optim.Optimizer):
    """``poptorch.optim.LAMB`` (Adam's moments, each layer's update scaled by the trust
    ratio ``|w| / |update|``, ``|w|`` clipped at max_weight_norm). Its eager ``step`` is
    written here in torch; a training executor refuses it (`optim_map`)."""

    _ipu_defaults = {**_ADAM_IPU, "bias_correction": True, "max_weight_norm": None}
    del _ipu_defaults["max_grad_norm"]

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=1e-2,
        bias_correction=None,
        loss_scaling=None,
        max_weight_norm=None,
        accum_type=None,
        first_order_momentum_accum_type=None,
        second_order_momentum_accum_type=None,
    ) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        torch.optim.Optimizer.__init__(self, params, defaults)
        self._ipu_init(
            dict(
                bias_correction=bias_correction,
                loss_scaling=loss_scaling,
                max_weight_norm=max_weight_norm,
                accum_type=accum_type,
                first_order_momentum_accum_type=first_order_momentum_accum_type,
                second_order_momentum_accum_type=second_order_momentum_accum_type,
            )
        )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict) -> None:
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        step = float(state["step"])
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        if group["bias_correction"]:
            m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
        else:
            m_hat, v_hat = m, v
        update = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
        w_norm = p.norm()
        if group["max_weight_norm"] is not None:
            w_norm = w_norm.clamp(max=group["max_weight_norm"])
        u_norm = update.norm()
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones(()))
        p.add_(update * trust, alpha=-group["lr"])
