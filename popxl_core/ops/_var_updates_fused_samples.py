"""Op-table samples of FusedSGD / FusedAdam / FusedAdamW (ops/_var_updates_fused.py).

The reference of each sample is torch.optim's own ``fused=True`` step on the same values
(state loaded into the optimizer), compared bit for bit (rtol=atol=0): the parameter and every
state tensor after one step, through float attributes, fed scalar tensors and a packed vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._utils import rand
from .registry import Sample

__all__ = ["adam_samples", "sgd_samples"]


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


def sgd_samples() -> list[Sample]:
    from ._var_updates_fused import fused_sgd_  # the op's module registers these samples

    p, g, buf = rand(3, 7, seed=800), rand(3, 7, seed=801), rand(3, 7, seed=802)
    hyper: dict[str, Any] = dict(lr=0.0123, weight_decay=1e-2, momentum=0.9, dampening=0.25)
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
                # ``h``: the four hyper-parameters before first_step (the checker cannot count)
                fused_sgd_(a, b, c, *h, first_step=1.0, nesterov=True, maximize=True),  # type: ignore[misc]
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
        Sample(
            [p, g, buf, np.array([*hyper.values(), 0.0], np.float64)],
            lambda a, b, c, h: (fused_sgd_(a, b, c, hyper=h), c),
            lambda a, b, c, h: _eager(sgd(**hyper), a, b, {"momentum_buffer": c}, buf_key),
            grad=False,
            rtol=0,
            atol=0,
            name="packed",
        ),
    ]


def adam_samples(decoupled: bool):
    def samples() -> list[Sample]:
        from ._var_updates_fused import fused_adam_

        p, g, m = rand(3, 7, seed=810), rand(3, 7, seed=811), rand(3, 7, seed=812)
        v, vmax = rand(3, 7, seed=813, low=0.0), rand(3, 7, seed=814, low=0.5)
        step = np.array(2.0, np.float32)
        hyper: dict[str, Any] = dict(lr=0.0123, beta1=0.8, beta2=0.99, weight_decay=1e-2, eps=1e-6)
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
                    # ``h``: the hyper-parameters before max_exp_avg_sq (uncounted by the checker)
                    fused_adam_(  # type: ignore[misc]
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
            Sample(
                [p, g, m, v, step, np.array(list(hyper.values()), np.float64)],
                lambda a, b, c, d, s, h: (
                    fused_adam_(a, b, c, d, s, hyper=h, decoupled_weight_decay=decoupled),
                    s,
                    c,
                    d,
                ),
                lambda a, b, c, d, s, h: _eager(adam(), a, b, dict(zip(keys, (s, c, d))), keys),
                grad=False,
                rtol=0,
                atol=0,
                name="packed",
            ),
        ]

    return samples
