"""The benchmark cases of issue 11: a simulator step and its eager PyTorch twins.

Each step case builds a `popxl_fx.training_model` trainer and one or more eager twins (a deep
copy of the same model with its own optimizer), all fed the same batch every step. A step
returns the loss as a torch scalar on both sides (the trainer copies it from the device; the
eager side detaches it), so neither waits on more than the other.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx

__all__ = ["StepCase", "STEP_CASES", "seed_mlp", "gpt", "resnet", "replicated"]

Step = Callable[[], torch.Tensor]


@dataclass
class StepCase:
    """A simulator step and named eager steps of the same model, optimizer and batch."""

    sim: Step
    eager: dict[str, Step]
    trainer: popxl_fx.Trainer
    inputs: tuple
    # twin name -> seconds its first step took (torch.compile's tracing and code generation)
    compile_s: dict[str, float] = field(default_factory=dict)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _eager_step(model: nn.Module, opt: torch.optim.Optimizer, loss_fn, inputs) -> Step:
    def step() -> torch.Tensor:
        opt.zero_grad()
        out = model(*inputs[:-1]) if loss_fn is not None else model(*inputs)
        loss = loss_fn(out, inputs[-1]) if loss_fn is not None else out[0]
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _compiled_step(model: nn.Module, opt, loss_fn, inputs) -> tuple[Step, float]:
    """The eager step with the model (and its loss) under ``torch.compile`` (inductor, default
    mode): forward and backward are inductor's, the optimizer step torch's own. Returns the
    step and the seconds its first call took (the compilation)."""
    if loss_fn is None:
        compiled = torch.compile(lambda *xs: model(*xs)[0])
    else:
        compiled = torch.compile(lambda *xs: loss_fn(model(*xs[:-1]), xs[-1]))

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = compiled(*inputs)
        loss.backward()
        opt.step()
        return loss.detach()

    torch._dynamo.reset()  # an earlier case's compiled code is not reused: time it all
    start = time.perf_counter()
    step()
    return step, time.perf_counter() - start


def _case(
    model, make_opt, eager_opts: dict, loss_fn, inputs, options=None, compiled: bool = False
) -> StepCase:
    """The trainer on ``make_opt(params)``; one eager twin per ``eager_opts`` entry, and with
    ``compiled`` a "torch.compile" twin (on the first optimizer of ``eager_opts``)."""
    eager, compile_s = {}, {}
    for name, make in eager_opts.items():
        twin = copy.deepcopy(model)
        eager[name] = _eager_step(twin, make(twin.parameters()), loss_fn, inputs)
    if compiled:
        twin = copy.deepcopy(model)
        make = next(iter(eager_opts.values()))
        step, seconds = _compiled_step(twin, make(twin.parameters()), loss_fn, inputs)
        eager["torch.compile"], compile_s["torch.compile"] = step, seconds
    trainer = popxl_fx.training_model(model, make_opt(model.parameters()), loss_fn, options)
    return StepCase(lambda: trainer(*inputs), eager, trainer, inputs, compile_s)


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.05)


def _adam(ps):
    return torch.optim.Adam(ps, lr=1e-3)


def _adam_fused(ps):
    return torch.optim.Adam(ps, lr=1e-3, fused=True)


class SeedMLP(nn.Module):
    """The addons seeds' network: 784-512-512-512-10 with tanh-approximated gelu."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.ModuleList(
            nn.Linear(a, b) for a, b in [(784, 512), (512, 512), (512, 512), (512, 10)]
        )

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        for layer in self.fc[:-1]:
            x = F.gelu(layer(x), approximate="tanh")
        return self.fc[-1](x)


def seed_mlp(batch: int, optimizer: str) -> StepCase:
    torch.manual_seed(0)
    x = torch.randn(batch, 1, 28, 28, generator=_gen(1))
    y = torch.randint(0, 10, (batch,), generator=_gen(2))
    if optimizer == "sgd":
        return _case(SeedMLP(), _sgd, {"eager": _sgd}, F.cross_entropy, (x, y), compiled=True)
    twins = {"eager Adam": _adam, "eager Adam fused": _adam_fused}
    # "adam": the simulator with the default Adam; "adam_fused": with Adam(fused=True)
    sim_opt = _adam_fused if optimizer == "adam_fused" else _adam
    return _case(SeedMLP(), sim_opt, twins, F.cross_entropy, (x, y))


def gpt(batch: int = 8, kernels: str = "table") -> StepCase:
    from tests.fx_zoo import GPT

    torch.manual_seed(0)
    idx = torch.randint(0, 64, (batch, 16), generator=_gen(1))
    targets = torch.randint(0, 64, (batch, 16), generator=_gen(2))
    opts = popxl_fx.Options(kernels=kernels)
    return _case(GPT(), _sgd, {"eager": _sgd}, None, (idx, targets), opts, compiled=True)


def resnet(
    name: str = "resnet18",
    batch: int = 16,
    size: int = 64,
    compiled: bool = False,
    kernels: str = "table",
) -> StepCase:
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10)
    x = torch.randn(batch, 3, size, size, generator=_gen(1))
    y = torch.randint(0, 10, (batch,), generator=_gen(2))
    # device "cpu": the plan, not a limit: time the arithmetic
    opts = popxl_fx.Options(device="cpu", kernels=kernels)
    return _case(model, _sgd, {"eager": _sgd}, F.cross_entropy, (x, y), opts, compiled)


def replicated(build: Callable[[popxl_fx.Options], StepCase], replicas: int) -> StepCase:
    """The simulator with ``replicas`` data-parallel replicas against the simulator with one,
    the same model, optimizer and global batch (each replica gets its share of dim 0)."""
    one = build(popxl_fx.Options())
    many = build(popxl_fx.Options(replication_factor=replicas))
    one.sim()  # built before timing, as the simulator side is
    return StepCase(many.sim, {"sim, 1 replica": one.sim}, many.trainer, many.inputs)


def _mlp_with(batch: int, options: popxl_fx.Options) -> StepCase:
    torch.manual_seed(0)
    x = torch.randn(batch, 1, 28, 28, generator=_gen(1))
    y = torch.randint(0, 10, (batch,), generator=_gen(2))
    return _case(SeedMLP(), _sgd, {}, F.cross_entropy, (x, y), options)


def _gpt_with(batch: int, options: popxl_fx.Options) -> StepCase:
    from tests.fx_zoo import GPT

    torch.manual_seed(0)
    idx = torch.randint(0, 64, (batch, 16), generator=_gen(1))
    targets = torch.randint(0, 64, (batch, 16), generator=_gen(2))
    return _case(GPT(), _sgd, {}, None, (idx, targets), options)


STEP_CASES: dict[str, Callable[[], StepCase]] = {
    "mlp_sgd_b8": lambda: seed_mlp(8, "sgd"),
    "mlp_sgd_b256": lambda: seed_mlp(256, "sgd"),
    "mlp_adam_b8": lambda: seed_mlp(8, "adam"),
    "mlp_adam_b256": lambda: seed_mlp(256, "adam"),
    "mlp_adam_fused_b8": lambda: seed_mlp(8, "adam_fused"),
    "mlp_adam_fused_b256": lambda: seed_mlp(256, "adam_fused"),
    "resnet18_b16": lambda: resnet("resnet18", 16, 64, compiled=True),
    "gpt_b8": lambda: gpt(8),
    # the opt-in fast mode, Options(kernels="inductor"): not bitwise
    "resnet18_b16_inductor": lambda: resnet("resnet18", 16, 64, True, "inductor"),
    "gpt_b8_inductor": lambda: gpt(8, "inductor"),
    # replication 4 against one replica, the same global batch
    "mlp_sgd_b32_r4": lambda: replicated(lambda o: _mlp_with(32, o), 4),
    "gpt_b8_r4": lambda: replicated(lambda o: _gpt_with(8, o), 4),
}
