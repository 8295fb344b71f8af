"""Time one training step of examples/mnist_popxl.py: simulator `Session.run` vs eager PyTorch.

Both run in this process on the same pre-loaded batches, alternating step by step after a
warm-up, so machine load affects both alike. Prints ms/step for each and the ratio sim/eager.

Usage::

    python benchmarks/bench_mnist_step.py --rounds 200 --batch-size 80
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

import popxl_core as popxl
from popxl_fx.cli import add_data_args, data_kwargs, make_parser, non_negative_int, positive_int
from popxl_fx.data import get_data_loaders

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mnist_popxl.py"


def _load_example():
    # examples/ is a folder of scripts, not a package: import the script as a module
    if str(EXAMPLE.parent) not in sys.path:
        sys.path.insert(0, str(EXAMPLE.parent))
    return importlib.import_module(EXAMPLE.stem)


def _timed(fn, x, labels) -> float:
    start = time.perf_counter()
    fn(x, labels)
    return time.perf_counter() - start


def run(
    rounds: int, warmup: int, batch_size: int, lr: float, data: dict | None = None
) -> dict[str, list[float]]:
    """Seconds per step for "popxl" and "torch", ``rounds`` alternating samples each.

    ``data``: keyword arguments of `get_data_loaders` (data_dir, dataset, ...).
    """
    ex = _load_example()
    train_loader, _ = get_data_loaders(batch_size, batch_size, **(data or {}))
    data = list(
        ex.batches(
            train_loader,
            epochs=1 + (warmup + rounds) // len(train_loader),
            max_steps=warmup + rounds,
        )
    )
    weights = ex.init_weights(0)
    prog = ex.build_train_ir(weights, batch_size, lr)
    session = popxl.Session(prog.ir, "ipu_hw")
    eager = ex.eager_step(ex.eager_params(weights), lr)
    times: dict[str, list[float]] = {"popxl": [], "torch": []}
    with session:
        sim = ex.sim_step(prog, session)
        for i, (x, labels) in enumerate(data):
            # Alternate which side goes first so neither always runs on a warmer cache.
            order = [("popxl", sim), ("torch", eager)][:: 1 if i % 2 == 0 else -1]
            for name, fn in order:
                t = _timed(fn, x, labels)
                if i >= warmup:
                    times[name].append(t)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=200)
    parser.add_argument("--warmup", type=non_negative_int, default=20)
    parser.add_argument("--batch-size", type=positive_int, default=80)
    parser.add_argument("--lr", type=float, default=0.05)
    add_data_args(parser)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    times = run(args.rounds, args.warmup, args.batch_size, args.lr, data_kwargs(args))
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    mean = {k: 1e3 * statistics.fmean(v) for k, v in times.items()}
    print(
        f"MNIST training step, batch {args.batch_size}, {args.rounds} rounds after "
        f"{args.warmup} warm-up, {torch.get_num_threads()} torch threads (ms/step)"
    )
    for name, label in (("popxl", "popxl simulator Session.run"), ("torch", "eager PyTorch")):
        print(f"  {label:28s} median {med[name]:8.3f}   mean {mean[name]:8.3f}")
    print(
        f"  ratio sim/eager              median {med['popxl'] / med['torch']:8.2f}x  "
        f"mean {mean['popxl'] / mean['torch']:8.2f}x"
    )


if __name__ == "__main__":
    main()
