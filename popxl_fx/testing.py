"""`assert_matches_eager`: a simulated model against an eager deep copy, step by step.

For users' own test suites: the same model, inputs and optimizer run eagerly (on a deep copy
taken first) and on the simulator, and forward outputs, losses, gradients, ``steps`` optimizer
steps and the final parameters, buffers and optimizer state are compared. The first mismatch
raises an `AssertionError` naming the step, the tensor and its max abs/rel error.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import torch
import torch.utils._pytree as pytree
from torch import nn

from .options import Options
from .trainer import Trainer

__all__ = ["assert_matches_eager", "compare"]

OptimizerLike: TypeAlias = torch.optim.Optimizer | Callable[[Any], torch.optim.Optimizer] | None


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compare(
    name: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    rtol: float,
    atol: float,
    normwise: bool = False,
) -> float:
    """Raise an AssertionError with the max abs/rel error if ``actual`` is not close;
    returns the max abs error. ``normwise`` scales ``rtol`` by the tensor's largest value
    instead of each element's (for sums with cancellation, e.g. gradients through batch
    norm, whose small elements carry the rounding of the large ones)."""
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if expected.is_sparse:  # eager's gradient of a sparse=True embedding: the program's is dense
        expected = expected.to_dense()
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{name}: shape {tuple(actual.shape)}, eager has {tuple(expected.shape)}"
        )
    if not expected.is_floating_point():
        if not torch.equal(actual.to(expected.dtype), expected):
            diff = (actual.to(expected.dtype) != expected).sum().item()
            raise AssertionError(f"{name}: {diff} of {expected.numel()} values differ")
        return 0.0
    if actual.dtype == expected.dtype and torch.equal(actual, expected):
        # bit for bit, as most of the suite's comparisons are: no float64 pass (a NaN is never
        # equal, so NaNs still take the pass below and its NaN check)
        return 0.0
    worst, rel, n_bad = _errors(actual.reshape(-1), expected.reshape(-1), rtol, atol, normwise)
    if n_bad:
        raise AssertionError(
            f"{name}: max abs error {worst:.3e}, max rel error {rel:.3e} "
            f"({n_bad} of {expected.numel()} values beyond rtol={rtol}, atol={atol})"
        )
    return worst


_CHUNK = 1 << 22


def _errors(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float, normwise: bool) -> tuple:
    """(max abs error, max rel error, values beyond the tolerance or NaN in one only) of the
    flat tensors ``a`` against ``e``."""
    scale = e.abs().max().double() if normwise and e.numel() else None
    worst, rel, n_bad = 0.0, 0.0, 0
    # in float64, a chunk at a time: a few float64 copies of a 100M-element weight would not
    # fit beside the model, its eager twin and their optimizer state
    for start in range(0, e.numel(), _CHUNK):
        ac, ec = a[start : start + _CHUNK].double(), e[start : start + _CHUNK].double()
        err = (ac - ec).abs()
        bad = err > atol + rtol * (ec.abs() if scale is None else scale)
        n_bad += int(bad.sum()) + int(torch.isnan(ac).ne(torch.isnan(ec)).sum())
        worst = max(worst, err.max().item())
        rel = max(rel, (err / ec.abs().clamp_min(1e-30)).max().item())
    return worst, rel, n_bad


def _check_argmax(name: str, actual: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    """Logits: equal argmax wherever eager's top two are further apart than the tolerance."""
    if expected.dim() < 2 or not expected.is_floating_point() or expected.shape[-1] < 2:
        return
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * atol
    if not torch.equal(actual.argmax(-1)[clear], expected.argmax(-1)[clear]):
        raise AssertionError(f"{name}: argmax differs from eager")


def _make_optimizer(optimizer: OptimizerLike, model: nn.Module, twin: nn.Module):
    """(simulated model's optimizer, the eager twin's), with the same groups and options."""
    if optimizer is None:
        optimizer = lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer(model.parameters()), optimizer(twin.parameters())
    index = {id(p): i for i, p in enumerate(model.parameters())}
    twin_params = list(twin.parameters())
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "params": [twin_params[index[id(p)]] for p in g["params"]],
        }
        for g in optimizer.param_groups
    ]
    return optimizer, type(optimizer)(groups)


def _eager_step(model, opt, loss_fn, inputs, targets, kwargs):
    out = model(*inputs, **kwargs)
    loss = loss_fn(out, targets) if loss_fn is not None else pytree.tree_leaves(out)[0]
    opt.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    return loss.detach(), out, grads


class _TrainingModelRunner:
    """One step through `training_model` with its outputs and gradients recorded."""

    via = "training_model"

    def __init__(self, model, opt, loss_fn, options):
        self.trainer = Trainer(model, opt, loss_fn, options, record=True)
        self.loss_fn = loss_fn

    def step(self, inputs, targets, kwargs):
        args = (*inputs, targets) if self.loss_fn is not None else inputs
        loss = self.trainer(*args, **kwargs)
        last = self.trainer.last
        keys = sorted((k for k in last if k.startswith("output.")), key=lambda k: int(k[7:]))
        outs = [last[k] for k in keys]
        grads = {k[len("grad.") :]: v for k, v in last.items() if k.startswith("grad.")}
        return loss, outs, grads

    def finish(self):
        pass  # the trainer's weights and optimizer state are the torch model's and optimizer's


class _CompileRunner:
    """One step through `compile` with an unchanged torch loop."""

    via = "compile"

    def __init__(self, model, opt, loss_fn, options):
        from .compiled import compile as compile_

        self.model, self.opt, self.loss_fn = compile_(model, options), opt, loss_fn

    def step(self, inputs, targets, kwargs):
        return _eager_step(self.model, self.opt, self.loss_fn, inputs, targets, kwargs)

    def finish(self):
        pass


def _outputs(out: Any, loss_fn, loss_first: bool) -> list[torch.Tensor]:
    """Flattened forward outputs as the recording trainer orders them (loss excluded; with a
    loss_fn the trainer's wrapper returns ``(loss, output)``)."""
    leaves = pytree.tree_leaves(out)
    return leaves if loss_fn is not None else leaves[1:] if loss_first else leaves


def assert_matches_eager(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    targets: torch.Tensor | None = None,
    loss_fn: Callable | None = None,
    optimizer: OptimizerLike = None,
    steps: int = 3,
    options: Options | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    via: str = "training_model",
    normwise: bool = False,
    kwargs: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Train ``model`` for ``steps`` steps on the simulator and eagerly; assert they agree.

    Args:
        model: trained in place on the simulator; an eager deep copy is taken first.
        inputs: the model's inputs (a tensor or a tuple), used at every step.
        targets, loss_fn: the loss is ``loss_fn(model(*inputs), targets)``; without
            ``loss_fn`` the model's forward returns the loss (first output).
        optimizer: a torch optimizer over ``model``'s parameters, or a function from
            parameters to one (default SGD lr=0.01 momentum=0.9); the eager copy gets its twin.
        via: ``"training_model"`` or ``"compile"`` (unchanged torch loop, torch's optimizer).
        rtol, atol: tolerances of every comparison (default 1e-4 and 1e-5, float32).
        normwise: compare each tensor relative to its largest value (see `compare`).
        kwargs: keyword arguments of the model's forward at every step (``labels=``,
            ``use_cache=False``; `popxl_fx.calls.bind`: tensors are inputs, plain values
            constants).

    Returns:
        the largest absolute difference seen in each kind of tensor: ``loss``, ``outputs``,
        ``gradients``, ``parameters`` (and buffers), ``optimizer state``.

    Example:
        >>> assert_matches_eager(nn.Linear(4, 2), torch.randn(3, 4), targets=torch.randn(3, 2),
        ...                      loss_fn=nn.MSELoss(), options=Options(device="cpu"))
        {'loss': 0.0, 'outputs': 0.0, 'gradients': 0.0, 'parameters': 0.0, 'optimizer state': 0.0}
    """
    worst = _Worst(1e-4 if rtol is None else rtol, 1e-5 if atol is None else atol, normwise)
    twin = copy.deepcopy(model)
    sim_opt, eager_opt = _make_optimizer(optimizer, model, twin)
    runner = _runner(via, model, sim_opt, loss_fn, options)
    twin_loss_fn = copy.deepcopy(loss_fn) if isinstance(loss_fn, nn.Module) else loss_fn
    eager = functools.partial(_eager_step, twin, eager_opt, twin_loss_fn)
    inputs, kwargs = _as_tuple(inputs), dict(kwargs or {})
    for step in range(steps):
        _train_both(runner, eager, inputs, targets, kwargs, f"step {step}", worst)
    runner.finish()
    _compare_state(model, twin, sim_opt, eager_opt, worst)
    return worst.errors


def _runner(via: str, model, opt, loss_fn, options):
    """The simulated side: `training_model` or `compile` (``via``)."""
    runners = {"training_model": _TrainingModelRunner, "compile": _CompileRunner}
    if via not in runners:
        raise ValueError(f"via must be one of {sorted(runners)}, got {via!r}")
    return runners[via](model, opt, loss_fn, options)


def _train_both(runner, eager_step, inputs, targets, kwargs, where: str, worst) -> None:
    """One step eagerly and one on the simulator, compared."""
    # both start from one torch generator state: with Options(rng="torch") (the default)
    # the simulated dropout masks are eager's
    state = torch.get_rng_state()
    eager = eager_step(inputs, targets, kwargs)
    torch.set_rng_state(state)
    simulated = runner.step(inputs, targets, kwargs)
    _compare_step(where, simulated, eager, runner.loss_fn, runner.via, worst)


class _Worst:
    """`compare` with fixed tolerances, keeping the largest error of each kind."""

    def __init__(self, rtol: float, atol: float, normwise: bool) -> None:
        self.rtol, self.atol, self.normwise = rtol, atol, normwise
        self.errors: dict[str, float] = {}

    def __call__(self, kind: str, name: str, actual, expected) -> None:
        err = compare(name, actual, expected, self.rtol, self.atol, self.normwise)
        self.errors[kind] = max(self.errors.get(kind, 0.0), err)


def _compare_step(where: str, simulated, eager, loss_fn, via: str, worst: _Worst) -> None:
    (s_loss, s_out, s_grads), (e_loss, e_out, e_grads) = simulated, eager
    worst("loss", f"{where}: loss", s_loss, e_loss)
    e_leaves = _outputs(e_out, loss_fn, via == "training_model")
    s_leaves = pytree.tree_leaves(s_out) if via == "compile" else s_out
    for i, (s, e) in enumerate(zip(s_leaves, e_leaves)):
        worst("outputs", f"{where}: forward output {i}", s, e)
        _check_argmax(f"{where}: forward output {i}", s, e, worst.atol)
    if set(s_grads) != set(e_grads):
        raise AssertionError(
            f"{where}: gradients for {sorted(s_grads)}, eager has {sorted(e_grads)}"
        )
    for name in e_grads:
        worst("gradients", f"{where}: gradient of {name!r}", s_grads[name], e_grads[name])


def _compare_state(model, twin, sim_opt, eager_opt, worst: _Worst) -> None:
    sim_sd, eager_sd = model.state_dict(), twin.state_dict()
    for name, expected in eager_sd.items():
        worst("parameters", f"final {name!r}", sim_sd[name], expected)
    sim_state, eager_state = sim_opt.state_dict()["state"], eager_opt.state_dict()["state"]
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = [by_id[id(p)] for g in sim_opt.param_groups for p in g["params"]]
    for i, expected in eager_state.items():
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                worst(
                    "optimizer state",
                    f"final optimizer {key} of {names[i]!r}",
                    sim_state[i][key],
                    value,
                )
