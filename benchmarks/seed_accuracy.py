"""Seed tutorials 001 (SGD), 000 and 003 (Adam) on the simulator vs the same MLP in eager torch.

For each seed this runs the tutorial's own code, unchanged (tools/seed_runner.py: ``popxl`` and
``popxl_addons`` are this project, device "ipu_hw" is the simulator), then an eager-PyTorch
twin written here: the same 784-512-512-512-10 MLP (tanh-approximated gelu, weights
N(0, 0.02^2), zero biases), softmax cross entropy, the seed's optimiser and hyper-parameters
(SGD lr 0.05 for 001; for 000 and 003 Adam lr 1e-3, beta 0.9/0.999, eps 1e-5, no bias
correction, no weight decay), batch 8 (003: global batch 64 = micro-batch 8 x gradient
accumulation 4 x 2 replicas, phased and sharded on the simulator, one plain batch in the
twin), one epoch, the same torchvision pipeline and data. It prints the test accuracy and
the training (and test) iterations per second of both, and how many of the seed's documented
output lines were missing.

Data: with no network, torchvision cannot download MNIST; Fashion-MNIST's IDX files (Debian's
``dataset-fashion-mnist``) are staged under MNIST's file names in ``~/.torch/datasets``, so the
accuracies are Fashion-MNIST accuracies (normalised with MNIST's mean/std, as the seeds do).

Pairing (the default): the twin starts from the seed's own initial weights (read from a fresh
Session of the seed's training Ir, before any step) and sees the same batches in the same
order (torch's global generator is seeded just before each side's training loop creates its
shuffled iterator), so the two runs differ only in arithmetic. ``--unpaired`` gives the twin
its own weights (``--twin-seed``) and an unseeded shuffle instead, like two independent
trainings; the accuracy of one epoch at batch 8 then varies by about a point from run to run.
``--repeats N`` runs everything N times and prints the mean. Adam's first moment is float32
in the twin where seed 000 keeps it in float16; ``--fp16-first-order`` mimics the seed (the
moment stored and updated in float16, as the IPU's var-update ops do).

Both sides run with ``torch.set_num_threads(1)`` (``--threads``) so a loaded machine affects
them alike. Usage::

    python benchmarks/seed_accuracy.py                  # both seeds, full epoch (7500 steps)
    python benchmarks/seed_accuracy.py --max-batches 500 --seeds 000
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import tqdm as tqdm_module
from torch.utils.data import DataLoader
from torchvision import transforms

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import seed_runner  # noqa: E402

from popxl_fx.cli import (  # noqa: E402
    SEEDS_ENV,
    default_seeds_dir,
    make_parser,
    non_negative_int,
    positive_int,
)

# What each seed trains with (read from the tutorials' hyper-parameter cells).
SEEDS = {
    "001": {"optimiser": "sgd", "lr": 0.05},
    "000": {"optimiser": "adam", "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-5},
    # 003 (phased execution): micro-batch 8 x gradient accumulation 4 x 2 replicas
    "003": {"optimiser": "adam", "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-5, "batch": 64},
}
BATCH, TEST_BATCH, WIDTHS = 8, 80, (784, 512, 512, 512, 10)
MNIST_MEAN_STD = ((0.1307,), (0.3081,))  # what the seeds normalise with


@dataclass
class Result:
    accuracy: float
    train_steps: int
    train_it_s: float
    test_it_s: float
    missing: int = 0
    skipped: int = 0


# The simulator side: the seed's own code -------------------------------------------------------
class _TimedTqdm(tqdm_module.std.tqdm):
    """tqdm that records (iterations, seconds) of every loop it wraps; the bar is hidden."""

    loops: list[tuple[int, float]] = []
    show = False
    shuffle_seed: int | None = None
    before_first_loop = None  # called once, just before the first loop starts

    def __init__(self, *args, **kwargs) -> None:
        kwargs["disable"] = not _TimedTqdm.show
        super().__init__(*args, **kwargs)

    def __iter__(self):
        if not _TimedTqdm.loops and _TimedTqdm.before_first_loop is not None:
            _TimedTqdm.before_first_loop()
        if _TimedTqdm.shuffle_seed is not None:
            torch.manual_seed(_TimedTqdm.shuffle_seed)  # the loader draws its order from it
        n, start = 0, time.perf_counter()
        for item in super().__iter__():
            n += 1
            yield item
        _TimedTqdm.loops.append((n, time.perf_counter() - start))


def run_seed(
    path: Path, shuffle_seed: int | None, namespace: dict | None = None
) -> tuple[Result, list[torch.Tensor]]:
    """Run the seed's code (its globals into ``namespace`` where given: its sessions and
    streams); returns its result and its initial weights (fc1..fc4)."""
    namespace = {} if namespace is None else namespace
    initial: list[torch.Tensor] = []
    _TimedTqdm.loops, _TimedTqdm.shuffle_seed = [], shuffle_seed
    _TimedTqdm.before_first_loop = lambda: initial.extend(initial_weights(namespace))
    tqdm_module.tqdm = _TimedTqdm  # the seeds do `from tqdm import tqdm` when they run
    res = seed_runner.execute(path, echo=False, namespace=namespace)
    missing = seed_runner.missing_lines(seed_runner.expected_lines(path), res.stdout)
    (train_n, train_s), (test_n, test_s) = _TimedTqdm.loops[:2]
    return Result(
        res.accuracy, train_n, train_n / train_s, test_n / test_s, len(missing), len(res.skipped)
    ), initial


def initial_weights(namespace: dict) -> list[torch.Tensor]:
    """The seed's training variables before the first step, fc1..fc4: read from its training
    session when its training loop is about to start (the session is attached by then)."""
    variables = namespace["train_variables"]
    data = namespace["train_session"].get_tensors_data(variables.tensors)
    named = {k: data[t] for k, t in variables.named_tensors.items()}
    order = [f"fc{i}.{kind}" for i in range(1, len(WIDTHS)) for kind in ("weight", "bias")]
    return [torch.tensor(named[k].copy()).requires_grad_() for k in order]


# The eager PyTorch twin ----------------------------------------------------------------------
def twin_loaders(batch: int = BATCH) -> tuple:
    """The seeds' pipeline: torchvision MNIST (staged), ToTensor + Normalize per image."""
    from popxl_fx.data import mnist

    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(*MNIST_MEAN_STD)])
    root = Path(seed_runner.SEED_DATA_ROOT).expanduser()
    kw = {
        "data_dir": root,
        "dataset": "mnist",
        "download": False,
        "allow_fashion_as_mnist": True,
        "transform": tf,
    }
    train = DataLoader(mnist(True, **kw), batch_size=batch, shuffle=True, drop_last=True)
    test = DataLoader(mnist(False, **kw), batch_size=TEST_BATCH, shuffle=True, drop_last=True)
    return train, test


def init_params(seed: int) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(WIDTHS[:-1], WIDTHS[1:]):
        params.append(torch.tensor(rng.normal(0.0, 0.02, (n_in, n_out)), dtype=torch.float32))
        params.append(torch.zeros(n_out))
    return [p.requires_grad_() for p in params]


def forward(params: list[torch.Tensor], images: torch.Tensor) -> torch.Tensor:
    x = images.reshape(-1, WIDTHS[0])
    for i in range(0, len(params), 2):
        x = x @ params[i] + params[i + 1]
        if i + 2 < len(params):
            x = F.gelu(x, approximate="tanh")
    return x


class Sgd:
    def __init__(self, params, lr: float) -> None:
        self.params, self.lr = params, lr

    def step(self, grads) -> None:
        for p, g in zip(self.params, grads):
            p.add_(g, alpha=-self.lr)  # p + b * g, as scaled_add_ computes it


class AdamNoBiasCorrection:
    """p -= lr * m / (sqrt(v) + eps): Adam without bias correction nor weight decay.

    ``fp16_m`` stores m in float16 and updates it in float16 (the factors formed in float32 and
    rounded, like the IPU's Accumulate op); the update direction is rounded to float16 too.
    """

    def __init__(self, params, lr: float, betas, eps: float, fp16_m: bool) -> None:
        self.params, self.lr, (self.b1, self.b2), self.eps = params, lr, betas, eps
        self.fp16_m = fp16_m
        m_dtype = torch.float16 if fp16_m else torch.float32
        self.m = [torch.zeros(p.shape, dtype=m_dtype) for p in params]
        self.v = [torch.zeros(p.shape) for p in params]

    def step(self, grads) -> None:
        b1, b2 = torch.tensor(self.b1, dtype=torch.float32), torch.tensor(self.b2)
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m.mul_(b1.to(m.dtype)).add_((1 - b1).to(m.dtype) * g.to(m.dtype))
            v.mul_(b2).add_((1 - b2) * (g * g))
            direction = m.float() / (v.sqrt() + self.eps)
            if self.fp16_m:
                direction = direction.half().float()
            p.add_(direction, alpha=-self.lr)


def twin_step(params: list[torch.Tensor], opt, images: torch.Tensor, labels: torch.Tensor) -> None:
    """One training step of the twin: cross entropy, autograd, the twin's optimizer."""
    loss = F.cross_entropy(forward(params, images), labels)
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        opt.step(grads)


def run_twin(
    seed_id: str, loaders, params: list[torch.Tensor], fp16_m: bool, shuffle_seed: int | None
) -> Result:
    cfg = SEEDS[seed_id]
    if cfg["optimiser"] == "sgd":
        opt = Sgd(params, cfg["lr"])
    else:
        opt = AdamNoBiasCorrection(params, cfg["lr"], cfg["betas"], cfg["eps"], fp16_m)
    train, test = loaders
    if shuffle_seed is not None:
        torch.manual_seed(shuffle_seed)
    n, start = 0, time.perf_counter()
    for images, labels in train:
        twin_step(params, opt, images, labels)
        n += 1
    train_it_s = n / (time.perf_counter() - start)
    if shuffle_seed is not None:
        # The seed's test loader shuffles too, and _TimedTqdm reseeds before every loop: at a
        # batch cap the twin must evaluate the same test batches, not another random subset.
        torch.manual_seed(shuffle_seed)
    accs, start = [], time.perf_counter()
    with torch.no_grad():
        for images, labels in test:
            pred = forward(params, images).argmax(-1)
            accs.append(float((pred == labels).float().mean()) * 100.0)
    test_it_s = len(accs) / (time.perf_counter() - start)
    return Result(float(np.mean(accs)), n, train_it_s, test_it_s)


# Report ---------------------------------------------------------------------------------------
def _line(name: str, r: Result) -> str:
    return (
        f"  {name:<26} accuracy {r.accuracy:6.2f}%  train {r.train_steps:5d} steps "
        f"{r.train_it_s:8.1f} it/s  test {r.test_it_s:7.1f} it/s"
    )


def report(seed_id: str, runs: list[tuple[Result, Result]], args) -> None:
    cfg = SEEDS[seed_id]
    length = "DataLoaders capped (--max-batches)" if args.max_batches else "1 epoch"
    pairing = "unpaired" if args.unpaired else "paired: same initial weights and batch order"
    m_note = ""
    if cfg["optimiser"] == "adam":
        m_note = (
            "; first order float16 in the seed, "
            + ("float16" if args.fp16_first_order else "float32")
            + " in the twin"
        )
    print(
        f"\nseed {seed_id}: {cfg['optimiser'].upper()} lr {cfg['lr']}, "
        f"batch {cfg.get('batch', BATCH)}, "
        f"{length}, Fashion-MNIST staged as MNIST ({pairing}{m_note})"
    )
    sim0 = runs[0][0]
    print(
        f"  documented output lines missing: {sim0.missing}; illustrative blocks skipped: "
        f"{sim0.skipped}"
    )
    for i, (sim, eager) in enumerate(runs):
        tag = f"[{i + 1}] " if len(runs) > 1 else ""
        print(_line(f"{tag}simulator (seed code)", sim))
        print(_line(f"{tag}eager PyTorch twin", eager))
    diffs = [s.accuracy - e.accuracy + 0.0 for s, e in runs]  # + 0.0: no "-0.00"
    speed = [s.train_it_s / e.train_it_s for s, e in runs]
    print(
        f"  accuracy sim - eager: mean {np.mean(diffs):+.2f} points (runs: "
        f"{', '.join(f'{d:+.2f}' for d in diffs)}); training speed sim/eager: "
        f"{np.mean(speed):.2f}x"
    )


def main() -> None:
    ap = make_parser(__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", default=["001", "000"], choices=sorted(SEEDS))
    ap.add_argument(
        "--seeds-dir",
        type=Path,
        default=default_seeds_dir(),
        help=f"where the seed tutorials are (env {SEEDS_ENV})",
    )
    ap.add_argument(
        "--max-batches",
        type=non_negative_int,
        default=0,
        help="cap every DataLoader (both sides) at N batches; 0: full epoch",
    )
    ap.add_argument("--repeats", type=positive_int, default=1)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument(
        "--unpaired",
        action="store_true",
        help="independent twin: its own initial weights and batch order",
    )
    ap.add_argument(
        "--fp16-first-order",
        action="store_true",
        help="the Adam twin keeps its first moment in float16, like seed 000",
    )
    ap.add_argument(
        "--twin-seed",
        type=int,
        default=0,
        help="the twin's weights (--unpaired); else the shared shuffle seed",
    )
    ap.add_argument("--progress", action="store_true", help="show the seeds' progress bars")
    args = ap.parse_args()
    paths = {s: seed_runner.resolve_seed(ap, s, args.seeds_dir) for s in args.seeds}

    torch.set_num_threads(args.threads)
    _TimedTqdm.show = args.progress
    seed_runner.stage_data()
    from popxl_core import compat

    compat.install()
    if args.max_batches:
        seed_runner.cap_data_loaders(args.max_batches)
    for seed_id in args.seeds:
        loaders = twin_loaders(SEEDS[seed_id].get("batch", BATCH))
        path = paths[seed_id]
        runs = []
        for rep in range(args.repeats):
            shuffle = None if args.unpaired else args.twin_seed + rep
            sim, seed_weights = run_seed(path, shuffle)
            params = init_params(args.twin_seed + rep) if args.unpaired else seed_weights
            eager = run_twin(seed_id, loaders, params, args.fp16_first_order, shuffle)
            runs.append((sim, eager))
        report(seed_id, runs, args)


if __name__ == "__main__":
    main()
