"""One training step of the mixed_precision tutorial's model (graphcore/examples
``tutorials/tutorials/pytorch/mixed_precision``): eager PyTorch float32, eager float16 on the
CPU, and ``poptorch.trainingModel`` (popxl_fx.poptorch, as ``python -m popxl_fx.compat`` runs
it) for each of the tutorial tests' four flag sets; and the data loading per step.

The model is our own with the tutorial's layer shapes (conv 1->5 3x3, max-pool 2, conv 5->12
5x5, GroupNorm(3, 12), linear 41772->100, linear 100->10, LogSoftmax(dim=0), NLLLoss) on
batches of 12 images of 128x128, trained with AdamW(lr=0.001) as the tutorial does: float16
accumulators and loss scaling 1024 with ``--optimizer-half``. Runs alternate step by step after
a warm-up, so machine load affects them alike. Prints ms/step (median) and each step's ratio to
eager float32's. Run with ``OMP_NUM_THREADS=1`` on a shared machine.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/poptorch_mixed_precision.py --rounds 30 [--loader]
    OMP_NUM_THREADS=1 python benchmarks/poptorch_mixed_precision.py --learn 1500 --flags accum_fp16

``--learn STEPS`` trains the hook's half model on Fashion-MNIST (torchvision's files under
``--data-root``; nothing is downloaded) and prints its accuracy on 2,000 test images.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

import popxl_fx.poptorch as poptorch

__all__ = ["CLOCKS", "FLAG_SETS", "TutorialCNN", "learn", "loader_seconds", "main", "run"]

# the tutorial tests' flag sets: (execution_half, optimizer_half, stochastic_rounding,
# partials_half)
FLAG_SETS = {
    "fp16": (True, False, False, False),
    "accum_fp16": (True, True, False, False),
    "stochastic": (True, True, True, False),
    "all_fp16": (True, True, True, True),
}


class TutorialCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 5, 3)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(5, 12, 5)
        self.norm = nn.GroupNorm(3, 12)
        self.fc1 = nn.Linear(41772, 100)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(100, 10)
        self.log_softmax = nn.LogSoftmax(dim=0)
        self.loss = nn.NLLLoss()

    def forward(self, x, labels=None):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.norm(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(torch.flatten(x, start_dim=1)))
        x = self.log_softmax(self.fc2(x))
        return (x, self.loss(x, labels)) if self.training else x


def _eager_step(model: nn.Module, optimizer: torch.optim.Optimizer):
    def step(x, labels):
        optimizer.zero_grad()
        _, loss = model(x, labels)
        loss.backward()
        optimizer.step()
        return loss

    return step


def _hook_step(model: nn.Module, flags: tuple[bool, bool, bool, bool]):
    _, optimizer_half, stochastic, partials_half = flags
    accum, scaling = (torch.float16, 1024) if optimizer_half else (torch.float32, None)
    optimizer = poptorch.optim.AdamW(
        model.parameters(), lr=0.001, accum_type=accum, loss_scaling=scaling
    )
    opts = poptorch.Options()
    if stochastic:
        opts.Precision.enableStochasticRounding(True)
    opts.Precision.setPartialsType(torch.half if partials_half else torch.float)
    return poptorch.trainingModel(model.half(), options=opts, optimizer=optimizer)


def _steps(names: list[str]) -> dict:
    torch.manual_seed(0)
    base = TutorialCNN()
    f32, f16 = copy.deepcopy(base), copy.deepcopy(base).half()
    steps = {
        "eager_fp32": _eager_step(f32, torch.optim.AdamW(f32.parameters(), lr=0.001)),
        "eager_fp16": _eager_step(f16, torch.optim.AdamW(f16.parameters(), lr=0.001)),
    }
    for name in names:
        steps[f"hook_{name}"] = _hook_step(copy.deepcopy(base), FLAG_SETS[name])
    return steps


# wall: what the user waits; thread: this thread's CPU time, which on a loaded shared machine
# leaves out the time the scheduler gives other processes in the middle of a step
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def run(rounds: int, warmup: int, names: list[str], clock: str = "wall") -> dict[str, list[float]]:
    """Seconds per step of each run, ``rounds`` alternating samples each."""
    now = CLOCKS[clock]
    steps = _steps(names)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(12, 1, 128, 128, generator=g), torch.randint(0, 10, (12,)))]
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + rounds):
        x, labels = data[0]
        for name, step in steps.items():
            xi = x if name == "eager_fp32" else x.half()
            start = now()
            step(xi, labels)
            if i >= warmup:
                times[name].append(now() - start)
    return times


def loader_seconds(batches: int, workers: int) -> float:
    """Seconds per batch of 12 of the tutorial's Fashion-MNIST pipeline (Resize(128),
    ToTensor, Normalize, ConvertImageDtype(half)) through ``poptorch.DataLoader``."""
    data = _fashion_mnist("~/.torch/datasets", True)
    loader = poptorch.DataLoader(
        poptorch.Options(), data, batch_size=12, shuffle=True, num_workers=workers
    )
    it = iter(loader)
    next(it)  # workers started
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - start) / batches


def _fashion_mnist(root: str, train: bool):
    import torchvision
    import torchvision.transforms as T

    transform = T.Compose(
        [T.Resize(128), T.ToTensor(), T.Normalize((0.5,), (0.5,)), T.ConvertImageDtype(torch.half)]
    )
    return torchvision.datasets.FashionMNIST(root, transform=transform, train=train)


def learn(name: str, steps: int, root: str, test_images: int = 2000) -> float:
    """Train the hook's half model ``steps`` steps of the tutorial's shuffled Fashion-MNIST
    batches (flag set ``name``) and return its accuracy (%) on the first ``test_images`` test
    images: does the half model learn?"""
    torch.manual_seed(0)
    model = TutorialCNN()
    ipu = _hook_step(model, FLAG_SETS[name])
    loader = torch.utils.data.DataLoader(
        _fashion_mnist(root, True), batch_size=12, shuffle=True, num_workers=2, drop_last=True
    )
    for _, (x, labels) in zip(range(steps), loader):
        ipu(x, labels)
    ipu.detachFromDevice()
    model.eval()
    infer = poptorch.inferenceModel(model)
    correct = seen = 0
    for x, labels in torch.utils.data.DataLoader(_fashion_mnist(root, False), batch_size=32):
        correct += int((infer(x).float().argmax(1) == labels).sum())
        seen += len(labels)
        if seen >= test_images:
            break
    return 100 * correct / seen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--flags", default=",".join(FLAG_SETS), help="comma-separated FLAG_SETS")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--loader", action="store_true", help="also time the data loading")
    parser.add_argument("--workers", type=int, default=40)
    parser.add_argument("--learn", type=int, default=0, help="train STEPS on Fashion-MNIST")
    parser.add_argument("--data-root", default="~/.torch/datasets")
    args = parser.parse_args(argv)
    if args.learn:
        for name in args.flags.split(","):
            accuracy = learn(name, args.learn, args.data_root)
            print(f"{name}: {args.learn} steps, test accuracy {accuracy:.2f}%")
        return
    times = run(args.rounds, args.warmup, args.flags.split(","), args.clock)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for name, ms in med.items():
        print(f"{name:18s} {ms:8.2f} ms/step  ratio to eager_fp32 {ms / med['eager_fp32']:.2f}")
    if args.loader:
        ms = loader_seconds(200, args.workers) * 1e3
        print(f"data loading       {ms:8.2f} ms/step ({args.workers} workers)")


if __name__ == "__main__":
    main()
