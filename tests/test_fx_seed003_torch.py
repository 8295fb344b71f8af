"""Seed 003 (phased execution by hand in PopXL) against its MLP written as a PyTorch
``nn.Sequential`` and trained with ``Options(phased_execution="children", replication_factor=2,
replicated_tensor_sharding=True)``.

The seed runs unchanged (`benchmarks/seed003_unphased.run_seed`: its own code, its data, its
first `BATCHES` training steps); the recorder keeps its initial weights, every global batch of
64 it trains on and its losses. The torch side starts from those weights (the seed's
``x @ w`` weights transposed into ``nn.Linear``) and sees the same batches, one step per
global batch (the seed: 2 replicas x 4 accumulated micro-batches of 8; here 2 replicas x 32).

The seed's optimizer is its own Adam: no bias correction, eps 1e-5, the first moment kept in
float16. ``torch.optim.Adam`` corrects the bias; the test cancels that exactly by giving each
step ``lr * (1 - beta1**t) / sqrt(1 - beta2**t)`` and ``eps / sqrt(1 - beta2**t)`` (both read
before every step, like an lr scheduler's). What stays different: the seed keeps Adam's first
moment in float16 (torch: float32), its Session runs the IPU's numerics (popxl_fx: torch's
kernels, bit for bit with eager), and it sums the gradient as a mean of micro-batch means.
Measured over 20 steps (losses 2.30 -> 0.70, with a spike to 3.74 at step 5: uncorrected Adam
at lr 1e-3 is unstable here and amplifies small differences): the first 3 steps agree within
1.8e-5, the worst step by 5.1e-3 (asserted: below 1e-4 for the first 3 steps, below 1e-2 for
all). For scale, the seed's own MLP trained unphased (benchmarks/seed003_unphased.py) differs
from the seed by 1.5e-4 and from itself started 1 ulp away by 1.8e-4; the 30x larger gap
here is the float16 moment and the numerics, not phasing: the phased torch program equals
the plain one bit for bit (tests/test_fx_phased.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import seed003  # noqa: E402

BATCHES = 20
LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-5  # the seed's opts.train.lr and Adam defaults
SEED = seed003.find()
pytestmark = pytest.mark.skipif(
    SEED is None, reason="seed 003 is not in ../shared/seeds (set POPXL_FX_SEEDS_DIR to run it)"
)


@pytest.fixture(scope="module")
def seed_run():
    import seed_runner
    import torch.utils.data as tud
    from seed003_unphased import run_seed

    from popxl_core import compat

    # run_seed caps every DataLoader and installs the popxl import hook: both are undone
    # after, so later tests in this process see torch and the imports as they were
    saved = {k: tud.DataLoader.__dict__.get(k) for k in ("__iter__", "__len__")}
    torch.manual_seed(0)  # the seed's DataLoader shuffles from torch's global generator
    seed_runner.stage_data()
    try:
        return run_seed(SEED, BATCHES)
    finally:
        for k, v in saved.items():
            setattr(tud.DataLoader, k, v)
        if hasattr(tud.DataLoader, "_seed_runner_cap"):
            del tud.DataLoader._seed_runner_cap
        compat.uninstall()


def _sequential(initial: dict[str, np.ndarray]) -> nn.Sequential:
    gelu = lambda: nn.GELU(approximate="tanh")  # noqa: E731 - popxl's ops.gelu
    model = nn.Sequential(
        nn.Linear(784, 512), gelu(), nn.Linear(512, 512), gelu(), nn.Linear(512, 512), gelu(),
        nn.Linear(512, 10),
    )  # fmt: skip
    with torch.no_grad():
        for i, name in zip((0, 2, 4, 6), ("fc1", "fc2", "fc3", "fc4")):
            model[i].weight.copy_(torch.from_numpy(initial[f"{name}.weight"]).T)
            model[i].bias.copy_(torch.from_numpy(initial[f"{name}.bias"]))
    return model


def _seed_adam_hyper(opt: torch.optim.Adam, step: int) -> None:
    """lr and eps for torch's ``step``-th step (1-based) that make its bias-corrected update
    the seed's uncorrected one: lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps') with
    lr = LR*bc1/sqrt(bc2), eps' = EPS/sqrt(bc2) is LR * m / (sqrt(v) + EPS)."""
    bc1, bc2 = 1 - BETAS[0] ** step, (1 - BETAS[1] ** step) ** 0.5
    for g in opt.param_groups:
        g["lr"], g["eps"] = LR * bc1 / bc2, EPS / bc2


def test_seed003_mlp_as_nn_sequential_phased_with_rts_gives_the_seeds_loss_curve(seed_run):
    model = _sequential(seed_run.initial)
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)
    options = popxl_fx.Options(
        phased_execution="children", replication_factor=2, replicated_tensor_sharding=True
    )
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    losses = []
    for step, (x, y) in enumerate(seed_run.batches, start=1):
        _seed_adam_hyper(opt, step)
        losses.append(float(trainer(torch.from_numpy(x), torch.from_numpy(y).long())))
    seed = np.array([float(np.mean(v)) for v in seed_run.losses])
    ours = np.array(losses)
    assert len(ours) == len(seed) == BATCHES
    worst = np.abs(ours - seed).max()
    assert np.abs(ours - seed)[:3].max() < 1e-4, (ours, seed)
    assert worst < 1e-2, (worst, ours, seed)
    assert seed[-1] < seed[0] - 0.5  # it trains: the comparison is not of flat curves
    report = trainer.report()
    assert [r.label for r in report.rows if r.phase] == ["0", "1", "2", "3", "4", "5", "6"]
    assert report.totals()["variable_bytes"] == 0  # every weight and Adam state remote
