"""What the PopTorch layer costs: one MLP training step through ``poptorch.trainingModel``
(popxl_fx.poptorch, as `python -m popxl_fx.compat` runs it) vs the same model through
``popxl_fx.training_model``.

Both train twins of one model on the same pre-made batches in this process, alternating step
by step after a warm-up, so machine load affects both alike. The PopTorch model returns
``(output, loss)`` as PopTorch models do (so its step also fetches the output); the popxl_fx
trainer takes the loss as ``loss_fn``. A third twin, "popxl_fx_outputs", is the same model
returning ``(loss, output)`` (popxl_fx takes the loss first) through ``popxl_fx.Trainer``
with ``outputs=True``, so its step fetches the output too, as the PopTorch step does. Prints
ms/step for each and the ratios of poptorch to both (the issue's bar: 1.1 or less).

Usage::

    python benchmarks/poptorch_overhead.py --rounds 200 [--clock thread]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

import popxl_fx
import popxl_fx.poptorch as poptorch

__all__ = ["CLOCKS", "main", "run"]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, labels):
        out = self.net(x)
        return out, self.loss(out, labels)


class LossFirst(nn.Module):
    """``mlp`` returning ``(loss, output)``: popxl_fx's order for a model that returns both."""

    def __init__(self, mlp: MLP) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, x, labels):
        out, loss = self.mlp(x, labels)
        return loss, out


# wall: what the user waits; thread: this thread's CPU time, which on a loaded shared machine
# leaves out the time the scheduler gives other processes in the middle of a step
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _timed(clock, fn, *args) -> float:
    start = clock()
    fn(*args)
    return clock() - start


def run(rounds: int, warmup: int, batch_size: int, clock: str = "wall") -> dict[str, list[float]]:
    """Seconds per step for "poptorch" and "popxl_fx", ``rounds`` alternating samples each."""
    torch.manual_seed(0)
    model = MLP()
    twin, both = copy.deepcopy(model), LossFirst(copy.deepcopy(model))
    ipu = poptorch.trainingModel(
        model, poptorch.Options(), poptorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    )
    fx = popxl_fx.training_model(
        twin.net,
        torch.optim.SGD(twin.net.parameters(), lr=0.01, momentum=0.9),
        nn.CrossEntropyLoss(),
    )
    # popxl_fx's trainer of a model returning more than its loss, fetching the rest each step
    fx_out = popxl_fx.Trainer(
        both, torch.optim.SGD(both.parameters(), lr=0.01, momentum=0.9), None, None, outputs=True
    )
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(batch_size, 1, 28, 28, generator=g), torch.randint(0, 10, (batch_size,)))
        for _ in range(8)
    ]
    runs = {"poptorch": ipu, "popxl_fx": fx, "popxl_fx_outputs": fx_out}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(warmup + rounds):
        x, labels = data[step % len(data)]
        for name, step_fn in runs.items():
            seconds = _timed(CLOCKS[clock], step_fn, x, labels)
            if step >= warmup:
                times[name].append(seconds)
    for other in (twin, both.mlp):  # the same training
        assert torch.equal(model.net[1].weight, other.net[1].weight)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args(argv)
    times = run(args.rounds, args.warmup, args.batch_size, args.clock)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"poptorch.trainingModel  {med['poptorch']:.3f} ms/step (median of {args.rounds})")
    print(f"popxl_fx.training_model {med['popxl_fx']:.3f} ms/step")
    print(f"popxl_fx.Trainer(outputs=True)  {med['popxl_fx_outputs']:.3f} ms/step")
    print(f"ratio poptorch/popxl_fx {med['poptorch'] / med['popxl_fx']:.3f}")
    print(f"ratio poptorch/popxl_fx_outputs {med['poptorch'] / med['popxl_fx_outputs']:.3f}")


if __name__ == "__main__":
    main()
