"""A PopTorch optimizer's IPU state in its ``state_dict``: ``ipu_state`` (the optimizer's state
tensors) and ``ipu_param`` (its hyper-parameters per weight), keyed by PopART's tensor names.

PopTorch reads them from the device once the executor is compiled; here they are read from
the built program: the state is the torch optimizer's (popxl_fx shares it), or the program's
initial value before the first step; the hyper-parameters are computed from the param groups,
as PopART computes its optimizer scalars (SGD: ``scaledLearningRate0 = lr (1 - dampening) /
loss_scaling``, ``weightDecayScaleFactor0 = 1 - lr (1 - dampening) weight_decay``).
A loaded ``ipu_state`` becomes the optimizer's state at the next call. A loaded ``ipu_param``
must agree with the param groups (popxl_fx feeds the hyper-parameters per group, not per
weight), else that call raises.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .errors import Error

__all__ = ["apply_loaded", "read"]

# PopART's names of the state tensors, per popxl_fx optimizer kind and torch state key
_ACCL = {
    "sgd": {"momentum_buffer": "Accl1"},
    "rmsprop": {"square_avg": "Accl1", "grad_avg": "Accl2", "momentum_buffer": "Accl3"},
}
_ADAM_ACCL = {"exp_avg": "Accl1", "exp_avg_sq": "Accl2"}
_HYPER = {  # PopART's name: the param group's key
    "learningRate": "lr",
    "weightDecay": "weight_decay",
    "eps": "eps",
    "alpha": "alpha",
    "momentum": "momentum",
    "maxWeightNorm": "max_weight_norm",
}


def read(prog, names: Mapping[int, str]) -> dict:
    """``{"ipu_state": ..., "ipu_param": ...}`` of the built training program ``prog``;
    ``names``: id of each parameter -> its name in the user's model."""
    optim = prog.optim
    state, param = {}, {}
    for name, vars_ in optim.state.items():
        p = optim.params[name]
        for key in vars_:
            held = optim.optimizer.state.get(p, {}).get(key)
            value = torch.as_tensor(optim.initial(name, key)) if held is None else held
            state[f"{_state_name(optim.kind, key)}___{names[id(p)]}"] = value.detach().clone()
    for pg in optim.optimizer.param_groups:
        for p in pg["params"]:
            param.update(_hyper(optim.kind, pg, names[id(p)]))
    scale = optim.optimizer.param_groups[0].get("loss_scaling", 1.0)
    param["lossScaling_FLOAT"] = torch.tensor(float(scale))
    return {"ipu_state": state, "ipu_param": param}


def _state_name(kind: str, key: str) -> str:
    if key == "step":
        return "Step"
    return _ACCL.get(kind, _ADAM_ACCL)[key]


def _hyper(kind: str, pg: Mapping, name: str) -> dict[str, torch.Tensor]:
    if kind == "sgd":
        lr, damp = float(pg["lr"]), 1.0 - float(pg["dampening"])
        values = {
            "scaledLearningRate0": lr * damp / float(pg.get("loss_scaling", 1.0)),
            "weightDecayScaleFactor0": 1.0 - lr * damp * float(pg["weight_decay"]),
        }
    else:
        values = {n: float(pg[k]) for n, k in _HYPER.items() if k in pg}
        if "betas" in pg:
            values.update(beta1=float(pg["betas"][0]), beta2=float(pg["betas"][1]))
    return {f"{n}___specific___{name}": torch.tensor(v) for n, v in values.items()}


def apply_loaded(loaded: Mapping, prog, names: Mapping[int, str]) -> None:
    """A loaded ``ipu_state`` into the torch optimizer's state (which the next step takes);
    a loaded ``ipu_param`` checked against the param groups."""
    optim = prog.optim
    by_name = {}
    for name, vars_ in optim.state.items():
        p = optim.params[name]
        for key in vars_:
            by_name[f"{_state_name(optim.kind, key)}___{names[id(p)]}"] = (p, key)
    for tensor_name, value in (loaded.get("ipu_state") or {}).items():
        if tensor_name in by_name:
            p, key = by_name[tensor_name]
            optim.optimizer.state[p][key] = value.detach().clone().reshape(_shape(p, key))
    _check_params(loaded.get("ipu_param") or {}, read(prog, names)["ipu_param"])


def _shape(p: torch.Tensor, key: str) -> tuple:
    return () if key == "step" else tuple(p.shape)


def _check_params(loaded: Mapping, current: Mapping) -> None:
    differ = [k for k, v in loaded.items() if k in current and not torch.equal(v, current[k])]
    if differ:
        raise Error(
            f"the loaded optimizer state sets {differ[:3]} to values its param groups do not "
            "have; popxl_fx's PopTorch layer feeds hyper-parameters per param group: set them "
            "in optimizer.param_groups (or load the state_dict the optimizer wrote)."
        )
