"""`popxl_fx.compile`: an unchanged PyTorch training loop whose model runs on the simulated IPU.

`compile` installs a simulated forward on the model; the backward runs the program's gradient
graph through a `torch.autograd.Function`, so ``loss.backward()`` fills the model's own
``p.grad`` and any torch optimizer, gradient clipping and lr scheduler work as usual. An eager
copy trained beside it on the same batches shows the two stay together.

Usage::

    python examples/fx_compile.py --steps 20
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx


class Net(nn.Module):
    """A small CNN with batch norm for 1x28x28 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, stride=2, padding=1, bias=False)  # batch norm follows
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 14 * 14, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(x, 1))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x, y) -> float:
    """A plain torch training step: nothing here knows about the simulator."""
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
    return loss.item()


def max_difference(a: nn.Module, b: nn.Module) -> float:
    return max(
        (p - q).abs().max().item()
        for p, q in zip(a.state_dict().values(), b.state_dict().values())
        if p.is_floating_point()
    )


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", choices=["ipu_hw", "ipu_model", "cpu"], default="ipu_hw")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    eager = Net()
    model = popxl_fx.compile(copy.deepcopy(eager), popxl_fx.Options(device=args.device))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, args.steps) for o in opts]
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (args.batch_size,), generator=g)
        losses = [train_step(m, o, x, y) for m, o in zip((model, eager), opts)]
        for s in scheds:
            s.step()
        print(
            f"step {step:3d}: loss popxl_fx {losses[0]:.5f}  torch {losses[1]:.5f}  "
            f"max parameter difference {max_difference(model, eager):.2e}"
        )
    diff = max_difference(model, eager)
    print(f"after {args.steps} steps the parameters and buffers differ by at most {diff:.2e}")
    return diff


if __name__ == "__main__":
    main()
