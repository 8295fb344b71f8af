"""Build cost against graph size: a 20,000-op program beside a 2,000-op one (10x the ops), for

* (a) the core IR and its Session (verify, plan, compile),
* (b) autodiff of a chain,
* (c) a popxl_fx model with N layers: trace, check, lowering, autodiff, optimizer, Session.

Linear growth prints a ratio near 10; quadratic growth would show about 100. Times are
compared only as a ratio (tests never assert on time); the small build is timed twice (after a
warm-up that pays the one-time imports) and the faster kept.

    python -m benchmarks.build_scaling
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import popxl_core as popxl
import popxl_fx
from popxl_core import ops, transforms

__all__ = ["main"]


def _chain(x: popxl.Tensor, n_ops: int) -> popxl.Tensor:
    for i in range(n_ops // 2):
        x = ops.gelu(x) if i % 2 else x * popxl.constant(np.float32(1.0001))
        x = x + popxl.constant(np.float32(0.5))
    return x


def _core(n_ops: int) -> tuple[float, int]:
    start = time.perf_counter()
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((4,), popxl.float32, "x")
        x = _chain(ops.host_load(s, "x"), n_ops)
        ops.host_store(popxl.d2h_stream((4,), popxl.float32, "y"), x)
    session = popxl.Session(ir, "cpu")
    return time.perf_counter() - start, len(session.ir.main_graph._ops)


def _autodiff(n_ops: int) -> tuple[float, int]:
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(lambda x: _chain(x, n_ops), popxl.TensorSpec((4,), popxl.float32))
    start = time.perf_counter()
    info = transforms.autodiff(graph)
    return time.perf_counter() - start, len(graph._ops) + len(info.graph._ops)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class _Deep(torch.nn.Module):
    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(n_layers))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _fx(n_ops: int) -> tuple[float, int]:
    torch.manual_seed(0)
    # ~8 ops per layer (Linear, Tanh, their gradients, SGD's updates of weight and bias)
    model = _Deep(n_ops // 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = popxl_fx.training_model(model, opt, F.mse_loss, popxl_fx.Options("cpu"))
    inputs = (torch.randn(2, 4), torch.randn(2, 4))
    start = time.perf_counter()
    program = trainer.build(*inputs)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(g._ops) for g in program.ir._graphs.values())


def _ratio(name: str, build) -> None:
    build(200)  # one-time imports and caches
    small = min(build(2_000)[0] for _ in range(2))
    large, n_ops = build(20_000)
    print(
        f"{name:<28} 2,000 ops {small:7.2f} s   {n_ops:,} ops {large:7.2f} s   "
        f"ratio {large / small:5.1f} (linear: ~10)"
    )


def main() -> None:
    """Print the build-time ratio of each kind of build."""
    _ratio("IR + Session", _core)
    _ratio("autodiff", _autodiff)
    _ratio("popxl_fx training program", _fx)


if __name__ == "__main__":
    main()
