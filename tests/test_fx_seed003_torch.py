"""Seed 003 (phased execution by hand in PopXL) against its MLP written as a PyTorch
``nn.Sequential`` and trained with ``Options(phased_execution="children", replication_factor=2,
replicated_tensor_sharding=True, gradient_accumulation=4, numerics="ipu")`` and
``popxl_fx.IPUAdam(bias_correction=False, first_order_dtype=torch.float16)``.

The seed runs unchanged (`benchmarks/seed003_unphased.run_seed`: its own code, its data, its
first `BATCHES` training steps); the recorder keeps its initial weights, every global batch of
64 it trains on and its losses. The torch side starts from those weights (the seed's
``x @ w`` weights transposed into ``nn.Linear``) and sees the same batches, set up as a user
would: 2 replicas x 4 accumulated micro-batches of 8 (the seed's ``opts.train``), the rows of
each batch in the order popxl_fx splits them (replica-major; the seed's host arrays are
micro-batch-major: `_replica_major`), so each replica's micro-batch holds the seed's rows. The
optimizer does what the seed's ``Adam`` module does: no bias correction, eps 1e-5, the first
moment in float16, the update from the same var-update ops (`popxl_fx.optim_ipu`); the
gradients are mean-accumulated over the micro-batches and mean-reduced over the replicas as
the seed's are; the Session runs the IPU numerics the seed's hand-written Ir defaults to.

Measured over 20 steps (losses 2.30 -> 0.70): the first 2 steps are equal bit for bit, the
worst step differs by 1.2e-4 (asserted: below 2e-4; before this setup, with torch's Adam
and no accumulation: 5.1e-3). numerics="ipu" changes nothing here (the same losses, bit for
bit, as numerics="torch": at these shapes torch's kernels give the IPU numerics' bits). One
difference is known and measured: the seed's output layer takes the loss's gradient from the
fused ``cross_entropy_with_grad`` (``(softmax + (-1 at the label)) / n`` in one op), the torch
program from autodiff of ``F.cross_entropy`` (log-softmax backward: ``g - exp(log_softmax) *
sum(g)``); on the first micro-batch's logits at the initial weights 50 of the 80 logit
gradients differ, by up to 2.2e-7 relative (1-2 ulp). It is not the only one: lowering the
loss to the fused gradient instead (tried, not kept) gave a worst step of 6.8e-5 but a first
difference already at step 2 (2.4e-7), so another last-bit difference in the step-1 update
remains, not isolated yet. This training (uncorrected Adam at lr 1e-3, a loss spike at step
5) carries such differences: for scale, the seed's MLP trained unphased from weights 1 ulp
away differs from itself by 1.8e-4 (benchmarks/seed003_unphased.py), more than the gap here.
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


def _replica_major(a: np.ndarray) -> np.ndarray:
    """The seed feeds (micro-batch, replica, row); popxl_fx splits a batch by replica, then
    into micro-batches: the same rows, reordered so each lands where the seed puts it."""
    return np.ascontiguousarray(a.reshape(4, 2, 8, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape))


def test_seed003_mlp_as_nn_sequential_phased_with_rts_gives_the_seeds_loss_curve(seed_run):
    model = _sequential(seed_run.initial)
    opt = popxl_fx.IPUAdam(
        model.parameters(), lr=LR, betas=BETAS, eps=EPS, bias_correction=False,
        first_order_dtype=torch.float16,
    )  # fmt: skip
    options = popxl_fx.Options(
        phased_execution="children", replication_factor=2, replicated_tensor_sharding=True,
        gradient_accumulation=4, numerics="ipu",
    )  # fmt: skip
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    losses = []
    for x, y in seed_run.batches:
        x, y = torch.from_numpy(_replica_major(x)), torch.from_numpy(_replica_major(y)).long()
        losses.append(float(trainer(x, y)))
    seed = np.array([float(np.mean(v)) for v in seed_run.losses])
    ours = np.array(losses)
    assert len(ours) == len(seed) == BATCHES
    diff = np.abs(ours - seed)
    assert not diff[:2].any(), (ours, seed)  # bit for bit until the loss gradients part
    assert diff.max() < 2e-4, (diff.max(), ours, seed)
    assert seed[-1] < seed[0] - 0.5  # it trains: the comparison is not of flat curves
    report = trainer.report()
    assert [r.label for r in report.rows if r.phase] == ["0", "1", "2", "3", "4", "5", "6"]
    assert report.totals()["variable_bytes"] == 0  # every weight and Adam state remote
    state = opt.state_dict()["state"]
    assert all(s["exp_avg"].dtype == torch.float16 for s in state.values())
