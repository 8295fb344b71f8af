"""``Options(phased_execution=...)`` with ``gradient_accumulation`` and ``batch_serialisation``
against the plain (unphased) program with the same options (`popxl_fx.phased_slices`).

Phased, each phase loads its weights once and runs every slice of the replica's batch (k
micro-batches of s slices, in order), the values later phases and its own backward read wait
in Streaming Memory per slice, and the backward mean-accumulates the parameter gradients over
the slices before one optimizer update, as seed 003 does by hand. The reference is the plain
program's micro-batch loop / batch serialisation (`step_loops.LoopShape`): the same
slices, kernels and accumulation order, the loss combined the same way, so losses,
parameters, optimizer state and BatchNorm statistics are asserted bit for bit (measured worst
difference: 0), with and without replication + RTS (the reference replicated the same way).

`memory="auto"` tries phased execution with gradient accumulation when no plan without it
fits (`auto.sliced_candidates`): the MLP of tests/test_fx_memory_auto.py with 4 of its 8
blocks at batch 512 on "ipu_model" (2.44 MiB) needs 6.93 MiB as given and 4.82 MiB phased (its
activations: every block's stay on chip); phased with gradient_accumulation=2 plans 1.86 MiB
(measured) and trains like the plain accumulating program on "cpu", bit for bit. (8 blocks at
batch 256: 8.54, 4.23 and 1.42 MiB, the same candidates planned and the same choice, with
twice the ops to build per candidate.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from tests.fx_zoo import small_cnn
from tests.test_fx_phased import PHASES, _assert_same, _data, _states, _train

RTS = {"replication_factor": 2, "replicated_tensor_sharding": True}
CASES = [
    ("seed_mlp", "adam", {"gradient_accumulation": 2}),
    ("seed_mlp", "adam", {"gradient_accumulation": 2, "batch_serialisation": 2}),
    ("seed_mlp", "adam", {"gradient_accumulation": 2, **RTS}),
    ("gpt", "sgd", {"batch_serialisation": 2}),
    ("gpt", "adam", {"gradient_accumulation": 2, **RTS}),
]


@pytest.mark.parametrize("name, opt, extra", CASES)
def test_phased_with_micro_batches_is_bitwise_the_plain_program(name, opt, extra):
    losses, params, state, _ = _train(name, opt, PHASES[name], **extra)
    losses0, params0, state0, _ = _train(name, opt, False, **extra)
    assert torch.equal(losses, losses0)
    _assert_same(params, params0)
    _assert_same(_states(state), _states(state0))
    assert losses[-1] != losses[0]  # it trains: the steps differ


def test_batchnorm_cnn_phased_with_accumulation_and_rts_is_bitwise():
    """BatchNorm normalises per micro-batch and updates its running statistics once per
    micro-batch in order, per replica, on both sides."""

    def run(phased):
        torch.manual_seed(0)
        model = small_cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        options = popxl_fx.Options(
            device="cpu", phased_execution=phased, gradient_accumulation=2, **RTS
        )
        trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
        return torch.stack([trainer(x, y) for x, y in _data("seed_mlp")]), model.state_dict()

    (losses, state), (losses0, state0) = run("children"), run(False)
    assert torch.equal(losses, losses0)
    _assert_same(state, state0)


def test_phased_micro_batches_report_their_streaming_memory_and_refuse_device_iterations():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = popxl_fx.Options(device="cpu", phased_execution="children", gradient_accumulation=4)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    trainer(torch.randn(8, 16), torch.randint(0, 4, (8,)))
    assert "4 micro-batches x 1 slices per phase" in str(popxl_fx.explain(trainer))
    with pytest.raises(ValueError, match="divide"):
        trainer(torch.randn(6, 16), torch.randint(0, 4, (6,)))
    bad = popxl_fx.Options(device="cpu", phased_execution="children", device_iterations=2)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, bad)
    with pytest.raises(ValueError, match="does not combine with device_iterations"):
        trainer(torch.randn(2, 8, 16), torch.randint(0, 4, (2, 8)))


def _blocks(width=192, blocks=4) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)]
    return nn.Sequential(nn.Linear(64, width), *layers, nn.Linear(width, 10))


def _train_blocks(options: popxl_fx.Options):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(512, 64, generator=g), torch.randint(0, 10, (512,), generator=g))] * 2
    model = _blocks()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    return trainer, torch.stack([trainer(x, y) for x, y in data]), model.state_dict()


def test_auto_phases_with_accumulation_when_the_activations_do_not_fit_phased_alone():
    trainer, losses, params = _train_blocks(popxl_fx.Options(device="ipu_model", memory="auto"))
    chosen = trainer.options
    assert chosen.phased_execution in ("blocks", "children")
    assert chosen.gradient_accumulation in (2, 4)
    plan = trainer.memory_plan
    assert "Options(phased_execution='blocks'): peak" in plan  # tried first, did not fit
    memory = trainer.session.plan.memory[0]
    assert memory.total <= memory.capacity
    reference = popxl_fx.Options(device="cpu", gradient_accumulation=chosen.gradient_accumulation)
    _, losses0, params0 = _train_blocks(reference)
    assert torch.equal(losses, losses0)
    _assert_same(params, params0)
