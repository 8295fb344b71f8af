"""``Options(rng=...)`` in every shape of training step: plain, loops (device_iterations,
gradient_accumulation), phased, phased with replication.

With ``rng="ipu"`` a step draws from one seeded stream (`popxl_fx.Module.seed`): every random
op splits the next seed off one seed variable, in program order, and the variable advances
once per forward. Phasing only cuts the program into graphs, so a phased step draws what the
same step unphased draws, bit for bit. What the reference is, per shape:

- plain and device_iterations: the plain rng="ipu" program, called once per batch;
- gradient_accumulation, batch_serialisation: the unphased looping program. Each slice's
  forward draws masks of the slice's shape (PopXL draws per call), not the plain step's;
- replication: the unphased replicated program. Every replica holds the same seed (a
  variable is one value broadcast to the replicas), and each draws for its share of the batch.

``rng="ipu"`` differs from ``rng="torch"`` in each shape, and ``rng="torch"`` stays eager's
numbers bit for bit (phased too: its pieces draw from torch's generator in eager's order).
Two models: dropout in repeated blocks and in the glue; ``torch.rand`` in forward.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import popxl_fx

BATCH, STEPS = 8, 3


class Block(nn.Module):
    def __init__(self, rand: bool) -> None:
        super().__init__()
        self.lin, self.rand = nn.Linear(16, 16), rand
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        noise = torch.rand(h.shape) if self.rand else torch.ones_like(h)
        return x + self.drop(h) * noise


class Net(nn.Module):
    """Dropout in each repeated block and in the glue before them (``rand``: torch.rand too)."""

    def __init__(self, rand: bool) -> None:
        super().__init__()
        self.inp, self.drop = nn.Linear(8, 16), nn.Dropout(0.25)
        self.blocks = nn.ModuleList([Block(rand) for _ in range(3)])
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        x = self.drop(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _model(rand: bool) -> nn.Module:
    torch.manual_seed(0)
    return Net(rand).train()


def _data() -> list:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g))
        for _ in range(STEPS)
    ]


def _run(trainer, its: int) -> torch.Tensor:
    torch.manual_seed(5)  # rng="torch" draws from here; rng="ipu" must not care
    data = _data()
    if its == 1:
        return torch.stack([trainer(x, y) for x, y in data])
    xs, ys = (torch.stack(t) for t in zip(*data))
    return trainer(xs, ys)


@functools.lru_cache(maxsize=None)
def _train(rand: bool, rng: str, phased=False, **extra) -> tuple:
    model = _model(rand)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = popxl_fx.Options(device="cpu", rng=rng, phased_execution=phased, **extra)
    trainer = popxl_fx.training_model(model, opt, nn.MSELoss(), options)
    losses = _run(trainer, extra.get("device_iterations", 1))
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def _eager(rand: bool) -> torch.Tensor:
    model = _model(rand)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(5)
    losses = []
    for x, y in _data():
        opt.zero_grad()
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _same(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


REPLICAS = {"replication_factor": 2}
ACCUM = {"gradient_accumulation": 2}
SERIAL_RTS = {"batch_serialisation": 2, **REPLICAS, "replicated_tensor_sharding": True}
# (the shape's options, the options of the unphased reference)
SHAPES = {
    "plain": ({}, {}),
    "device_iterations": ({"device_iterations": STEPS}, {}),
    "gradient_accumulation": (ACCUM, ACCUM),
    "phased": ({"phased": "blocks"}, {}),
    "phased_children": ({"phased": "children"}, {}),
    "phased_accumulation": ({"phased": "blocks", **ACCUM}, ACCUM),
    "phased_replication": ({"phased": "blocks", **REPLICAS}, REPLICAS),
    "phased_serialised_rts": ({"phased": "blocks", **SERIAL_RTS}, SERIAL_RTS),
}


@pytest.mark.parametrize("rand", [False, True], ids=["dropout", "rand"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_ipu_stream_draws_what_the_unphased_program_draws(shape, rand):
    options, reference = SHAPES[shape]
    got = _train(rand, "ipu", **options)
    assert _same(got, _train(rand, "ipu", **reference))
    assert not torch.equal(got[0], _train(rand, "torch", **options)[0])


@pytest.mark.parametrize("rand", [False, True], ids=["dropout", "rand"])
@pytest.mark.parametrize("phased", [False, "blocks"])
def test_torch_stream_stays_eagers_bit_for_bit(rand, phased):
    assert torch.equal(_train(rand, "torch", phased)[0], _eager(rand))


def _auto_model() -> nn.Module:
    """tests/test_fx_memory_auto.py's model (too big for "ipu_model" as given) with dropout."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(192, 192), nn.GELU(), nn.Dropout(0.1)) for _ in range(8)]
    return nn.Sequential(nn.Linear(64, 192), *blocks, nn.Linear(192, 10)).train()


def _auto_losses(**options) -> tuple:
    model = _auto_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = popxl_fx.training_model(
        model, opt, nn.CrossEntropyLoss(), popxl_fx.Options(rng="ipu", **options)
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)
    losses = torch.stack([trainer(x, y) for _ in range(2)])
    return trainer.options.phased_execution, losses  # (memory="auto" chooses at the first call)


def test_memory_auto_choosing_phases_keeps_the_ipu_stream():
    phased, losses = _auto_losses(device="ipu_model", memory="auto")
    assert phased == "blocks"
    assert torch.equal(losses, _auto_losses(device="cpu")[1])


def _twice(rand: bool, replicas: int, phased) -> tuple:
    """Trained on each batch's first half, repeated once per replica (each replica's share
    is that half)."""
    model = _model(rand)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = popxl_fx.Options(
        device="cpu", rng="ipu", phased_execution=phased, replication_factor=replicas
    )
    trainer = popxl_fx.training_model(model, opt, nn.MSELoss(), options)
    half = [
        (x[: BATCH // 2].repeat(replicas, 1), y[: BATCH // 2].repeat(replicas, 1))
        for x, y in _data()
    ]
    losses = torch.stack([trainer(x, y) for x, y in half])
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("phased", [False, "blocks"])
def test_replicas_share_one_seed(phased):
    """PopXL's rule, not eager's: the seed variable is one value broadcast to the replicas,
    so replicas fed the same rows draw the same masks, and the replicated step equals one
    replica's step on those rows."""
    assert _same(_twice(True, 2, phased), _twice(True, 1, False))
