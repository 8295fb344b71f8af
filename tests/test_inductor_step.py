"""Options(kernels="inductor")'s whole step (popxl_core/sim/inductor_step.py): forward, backward
and the optimizer update as one torch.compile'd function, against the table kernels.

Not bitwise (inductor fuses and reassociates): the tolerances are test_inductor_kernels.py's.
Here: the step is one traced graph (no break at the optimizer's scalars, no dynamo), the host
transfers keep their order and the value a store saw, a learning rate fed per step is not
compiled in.
A program with a random draw keeps the per-graph path (test_inductor_kernels.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import popxl_core as popxl
import popxl_fx
from popxl_core import ops
from popxl_core.ops import var_updates
from popxl_core.ops.adaptive_pool import _grad_kernel
from popxl_core.sim.inductor_step import step_source
from popxl_core.sim.options import CompileOptions
from tests.test_inductor_kernels import ATOL, INDUCTOR, RTOL

F32 = np.float32


def _dynamo_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.01),
}


def _mlp_trainer(optimizer: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    return model, OPTIMIZERS[optimizer](model.parameters())


def test_step_source_hoists_transfers():
    src = (
        "def main(V):\n    v0 = V[0]\n    v1 = RT.load(s1)\n    RT.skip(s2)\n"
        "    v2 = RT.load(s3)\n    v3 = k4(v0, v1, v2)\n"
        "    RT.store(s5, v3)\n    return ()\n"
    )
    made = step_source(src)
    assert made is not None
    text, transfers, stores = made
    assert transfers == [("s1", True), ("s2", False), ("s3", True)]
    assert stores == ["s5"]
    assert "v1 = L[0]" in text and "v2 = L[1]" in text and "RT" not in text
    assert text.rstrip().endswith("return (O0, )")


def test_step_source_refuses_other_runtime_calls():
    src = "def main(V):\n    v0 = V[0]\n    v1 = RT.collective(v0, k1)\n    return ()\n"
    assert step_source(src) is None


def test_step_source_keeps_loops_refuses_transfers_in_them():
    loop = "def main(V):\n    v0 = V[0]\n    for _ in range(2):\n        v0 = k1(v0)\n"
    made = step_source(loop + "    RT.store(s2, v0)\n    return ()\n")
    assert made is not None and "\n        v0 = k1(v0)\n" in made[0]
    assert step_source(loop + "        RT.store(s2, v0)\n    return ()\n") is None


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_whole_step_one_graph_and_lr_fed(optimizer):
    """One trace and compilation for the whole training step, the update included (its scalars read
    as tensors, not `.item()`); a learning rate changed between steps is read by the compiled
    step (no recompilation) as eager reads it."""
    model, opt = _mlp_trainer(optimizer)
    eager_model, eager_opt = _mlp_trainer(optimizer)
    before = _dynamo_graphs()
    trainer = popxl_fx.training_model(model, opt, nn.CrossEntropyLoss(), INDUCTOR)
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 1])
    for lr in (0.1, 0.1, 0.02):
        for group in (*opt.param_groups, *eager_opt.param_groups):
            group["lr"] = lr
        loss = trainer(x, y)
        eager_opt.zero_grad()
        want = nn.functional.cross_entropy(eager_model(x), y)
        want.backward()
        eager_opt.step()
        torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
    program = trainer.session._program
    assert program.stats["inductor_step"] == 1 and program.stats["inductor_graphs"] == 0
    # traced once by make_fx (inductor_trace.py): no dynamo graph, no recompilation
    assert program.stats["inductor_traces"] == 1 and "inductor_dynamo" not in program.stats
    assert _dynamo_graphs() - before == 0
    trainer.copy_weights_to_host()
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL)


def _store_then_update(options):
    """Stores a variable, then updates it in place, then stores it again."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():  # the store, then the update (PopXL's order)
        w = popxl.variable(np.array([1.0, 2.0, 3.0], F32), name="w")
        x_in = popxl.h2d_stream((3,), popxl.float32, "x")
        before, after = (popxl.d2h_stream((3,), popxl.float32, n) for n in ("before", "after"))
        x = ops.host_load(x_in, "x")
        ops.host_store(before, w)
        var_updates.accumulate_(w, x)
        ops.host_store(after, ops.mul(w, x))
    session = popxl.Session(ir, "ipu_hw", compile_options=options)
    data = np.array([0.5, -1.0, 4.0], F32)
    with session:
        outs = [session.run({x_in: data}) for _ in range(2)]
    return session, [o[s] for o in outs for s in (before, after)]


def test_store_keeps_the_value_it_saw():
    """A stored variable is the value at the store, not after the later in-place update."""
    session, got = _store_then_update(CompileOptions(inductor=True))
    _, want = _store_then_update(CompileOptions())
    assert session._program.stats["inductor_step"] == 1
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "shape,out", [((2, 3, 9, 7), (4, 3)), ((2, 3, 10), (4,)), ((1, 2, 5, 4, 3), (2, 3, 2))]
)
def test_adaptive_pool_grad_traces_whole(shape, out):
    """resnet's adaptive pooling gradient in one dynamo graph (``fullgraph``): the backward
    kernel itself, equal to the bit to the eager kernel's ``autograd.grad``."""
    dy = torch.randn(*shape[:2], *out)
    want = _grad_kernel(dy, out, shape)
    traced = torch.compile(
        lambda d: _grad_kernel(d, out, shape), fullgraph=True, backend="aot_eager"
    )
    assert torch.equal(traced(dy), want)


def _accumulating(kernels: str):
    model, opt = _mlp_trainer("sgd_momentum")
    options = popxl_fx.Options(kernels=kernels, device="cpu", gradient_accumulation=2)
    trainer = popxl_fx.training_model(model, opt, nn.CrossEntropyLoss(), options)
    x, y = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 3
    losses = [trainer(x, y) for _ in range(2)]
    trainer.copy_weights_to_host()
    return trainer, losses, list(model.parameters())


def test_accumulation_loop_compiled_whole():
    """Gradient accumulation's loop over micro-batches stays a loop inside the compiled step
    (its indentation kept); the numbers are the table kernels' within the tolerance."""
    trainer, losses, params = _accumulating("inductor")
    _, want_losses, want_params = _accumulating("table")
    assert trainer.session._program.stats["inductor_step"] == 1
    for got, want in zip([*losses, *params], [*want_losses, *want_params]):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
