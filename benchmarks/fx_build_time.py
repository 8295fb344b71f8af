"""Build time of popxl_fx training programs (trace + lower + autodiff + Session) and step time.

For each model: the time `training_model` takes to build its program on the first call (trace,
lowering, autodiff, optimizer ops, Session planning and compilation), then the time of a
training step on the simulator beside the same step in eager PyTorch (one thread each).

Usage::

    python benchmarks/fx_build_time.py --models resnet18 vit_b_16 --steps 3
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F

import popxl_fx


def _model(name: str) -> torch.nn.Module:
    import torchvision

    kwargs = {"image_size": 64} if name.startswith("vit") else {}
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(num_classes=10, **kwargs)


def measure(name: str, batch: int, steps: int, device: str) -> dict[str, float]:
    model = _model(name)
    eager = copy.deepcopy(model)
    x = torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, popxl_fx.Options(device))
    start = time.perf_counter()
    trainer.build(x, y)  # build only: trace, lower, autodiff, Session
    build = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps):
        trainer(x, y)
    sim = (time.perf_counter() - start) / steps
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.01, momentum=0.9)
    start = time.perf_counter()
    for _ in range(steps):
        loss = F.cross_entropy(eager(x), y)
        eager_opt.zero_grad()
        loss.backward()
        eager_opt.step()
    ref = (time.perf_counter() - start) / steps
    return {"build_s": build, "sim_step_s": sim, "eager_step_s": ref}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "vit_b_16"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["ipu_hw", "ipu_model", "cpu"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.models:
        r = measure(name, args.batch, args.steps, args.device)
        print(
            f"{name:16s} build {r['build_s']:6.1f} s   step: simulator {r['sim_step_s']:.3f} s, "
            f"eager {r['eager_step_s']:.3f} s (x{r['sim_step_s'] / r['eager_step_s']:.2f})"
        )


if __name__ == "__main__":
    main()
