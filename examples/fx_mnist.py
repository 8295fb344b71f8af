"""Train a PyTorch model on (Fashion-)MNIST on the simulated IPU with popxl_fx.training_model.

The model is plain PyTorch (a small CNN, or an MLP with ``--model mlp``). `training_model`
traces it, lowers forward, cross-entropy loss, autodiff and the SGD-momentum update into one
PopXL program and runs one step per call. The same model is trained beside it in eager PyTorch
from the same initial weights on the same batches; both test accuracies are printed, then the
simulator's memory and time estimate for one training step. The trained weights are evaluated
on the simulator with `popxl_fx.inference_model`.

Usage::

    python examples/fx_mnist.py --max-steps 200
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Iterable

import torch
from torch import nn
from tqdm import tqdm

import popxl_fx
from popxl_fx.data import get_data_loaders


def make_model(kind: str, seed: int) -> nn.Module:
    """A small CNN or MLP for 1x28x28 images and 10 classes (same weights for a seed)."""
    torch.manual_seed(seed)
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
    )  # fmt: skip


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def eager_step(model: nn.Module, opt: torch.optim.Optimizer, loss_fn: Callable):
    """The same training step in eager PyTorch."""

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def train(steps: dict[str, Callable], data: Iterable, total: int) -> dict[str, list[float]]:
    """Run every step function on each batch in turn; returns the losses of each."""
    losses: dict[str, list[float]] = {name: [] for name in steps}
    bar = tqdm(data, total=total, mininterval=0.5)
    for x, y in bar:
        for name, step in steps.items():
            losses[name].append(float(step(x, y)))
        bar.set_description(" ".join(f"{n} loss {v[-1]:.4f}" for n, v in losses.items()))
    return losses


@torch.no_grad()
def accuracy(predict: Callable[[torch.Tensor], torch.Tensor], data: Iterable) -> float:
    """Test accuracy in percent of ``predict`` (logits of a batch)."""
    correct = seen = 0
    for x, y in data:
        correct += int((predict(x).argmax(-1) == y).sum())
        seen += len(y)
    return 100.0 * correct / seen


def capped(loader: Iterable, max_steps: int | None) -> Iterable:
    for i, batch in enumerate(loader):
        if max_steps is not None and i >= max_steps:
            return
        yield batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=500)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--max-steps", type=int, default=None, help="cap on training steps")
    parser.add_argument("--test-batches", type=int, default=None, help="cap on test batches")
    parser.add_argument("--data-dir", default=None, help="data root, or a folder of IDX files")
    parser.add_argument("--dataset", choices=["fashion-mnist", "mnist"], default="fashion-mnist")
    parser.add_argument("--device", choices=["ipu_hw", "ipu_model", "cpu"], default="ipu_hw")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and shuffling")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    torch.set_num_threads(1)  # like the simulator's kernels: one core, comparable timings
    args = parse_args(argv)
    train_loader, test_loader = get_data_loaders(
        args.batch_size, args.test_batch_size, args.data_dir, args.dataset, seed=args.seed
    )
    model = make_model(args.model, args.seed)
    eager = copy.deepcopy(model)  # same initial weights
    loss_fn = nn.CrossEntropyLoss()
    options = popxl_fx.Options(device=args.device)
    trainer = popxl_fx.training_model(model, make_optimizer(model, args.lr), loss_fn, options)
    steps = {
        "popxl_fx": trainer,
        "torch": eager_step(eager, make_optimizer(eager, args.lr), loss_fn),
    }
    total = len(train_loader) if args.max_steps is None else min(args.max_steps, len(train_loader))
    train(steps, capped(train_loader, args.max_steps), total)

    # trainer.model holds the simulated weights; evaluate them on the simulator
    simulated = popxl_fx.inference_model(trainer.model.eval(), options)
    test = list(capped(test_loader, args.test_batches))
    acc = {"popxl_fx": accuracy(simulated, test), "torch": accuracy(eager.eval(), test)}
    print(
        f"Test accuracy ({args.dataset}, {args.model}): popxl_fx simulator "
        f"{acc['popxl_fx']:.2f}%, eager PyTorch {acc['torch']:.2f}%"
    )
    print(trainer.report().summary())
    return acc


if __name__ == "__main__":
    main()
