"""Build time of popxl_fx training programs (trace + lower + autodiff + Session) and step time.

For each model: the time `training_model` takes to build its program on the first call (trace,
lowering, autodiff, optimizer ops, Session planning and compilation), then the time of a
training step on the simulator beside the same step in eager PyTorch (one thread each).

Each row also gives the program's op count and the build time per 1,000 ops: flat across
models of very different sizes (resnet50, vit_b_16, a 24-block GPT) means the build is linear.

Usage::

    python benchmarks/fx_build_time.py --models resnet18 vit_b_16 --steps 3
    python benchmarks/fx_build_time.py --models resnet50 vit_b_16 gpt24 --steps 0
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F

import popxl_fx


def _gpt(blocks: int) -> torch.nn.Module:
    """A GPT of ``blocks`` pre-norm decoder blocks (width 64, 4 heads, vocabulary 128)."""
    from torch import nn

    layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True, norm_first=True)
    blocks_ = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
    return nn.Sequential(nn.Embedding(128, 64), blocks_, nn.LayerNorm(64), nn.Linear(64, 10))


def _inputs(name: str, batch: int):
    if name.startswith("gpt"):
        x = torch.randint(0, 128, (batch, 32), generator=torch.Generator().manual_seed(1))
        return x, torch.randint(0, 10, (batch, 32), generator=torch.Generator().manual_seed(2))
    x = torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return x, torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2))


def _loss(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _n_ops(prog) -> int:
    return sum(len(g._ops) for g in prog.session.ir._graphs.values())


def _model(name: str) -> torch.nn.Module:
    import torchvision

    if name.startswith("gpt"):
        torch.manual_seed(0)
        return _gpt(int(name[3:] or 24))

    kwargs = {"image_size": 64} if name.startswith("vit") else {}
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(num_classes=10, **kwargs)


def measure(name: str, batch: int, steps: int, device: str) -> dict[str, float]:
    model = _model(name)
    eager = copy.deepcopy(model)
    x, y = _inputs(name, batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = popxl_fx.training_model(model, opt, _loss, popxl_fx.Options(device))
    start = time.perf_counter()
    prog = trainer.build(x, y)  # build only: trace, lower, autodiff, Session
    build = time.perf_counter() - start
    n_ops = _n_ops(prog)
    if steps == 0:
        return {"build_s": build, "ops": n_ops}
    start = time.perf_counter()
    for _ in range(steps):
        trainer(x, y)
    sim = (time.perf_counter() - start) / steps
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.01, momentum=0.9)
    start = time.perf_counter()
    for _ in range(steps):
        loss = _loss(eager(x), y)
        eager_opt.zero_grad()
        loss.backward()
        eager_opt.step()
    ref = (time.perf_counter() - start) / steps
    return {"build_s": build, "ops": n_ops, "sim_step_s": sim, "eager_step_s": ref}


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
        per_k = r["build_s"] / r["ops"] * 1000
        line = f"{name:16s} build {r['build_s']:6.1f} s, {r['ops']} ops, {per_k:.2f} s/1000 ops"
        if "sim_step_s" in r:
            ratio = r["sim_step_s"] / r["eager_step_s"]
            line += f"   step: simulator {r['sim_step_s']:.3f} s, eager {r['eager_step_s']:.3f} s"
            line += f" (x{ratio:.2f})"
        print(line)


if __name__ == "__main__":
    main()
