"""The one build pipeline (popxl_fx.pipeline): stage order, the loss wrapper for any number
of inputs, explain() for the three entry points, options an entry point refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx.options import Options
from popxl_fx.pipeline import STAGES, Build


class FourInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, a, b, c, d):
        return self.fc(a * b + c - d)


def test_loss_wrapper_takes_any_number_of_inputs_bit_for_bit():
    torch.manual_seed(0)
    model = FourInputs()
    eager = FourInputs()
    eager.load_state_dict(model.state_dict())
    xs = [torch.randn(5, 4, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    y = torch.randn(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = popxl_fx.training_model(model, opt, F.mse_loss, Options(device="cpu"))
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        loss = trainer(*xs, y)
        eager_opt.zero_grad()
        ref = F.mse_loss(eager(*xs), y)
        ref.backward()
        eager_opt.step()
        assert torch.equal(loss, ref.detach())
    assert torch.equal(trainer.model.fc.weight, eager.fc.weight)


def test_stages_are_recorded_in_the_stated_order_only():
    build = Build("training_model", nn.Linear(2, 2), Options(device="cpu"))
    build.record("capture", "x")
    build.record("backward", "y")
    with pytest.raises(RuntimeError, match="'lower' recorded after 'backward'"):
        build.record("lower", "z")
    with pytest.raises(ValueError, match="unknown pipeline stage 'phases'"):
        build.record("phases", "z")
    assert STAGES.index("lower") < STAGES.index("backward") < STAGES.index("recompute")
    assert STAGES.index("recompute") < STAGES.index("accumulation")
    assert STAGES.index("accumulation") < STAGES.index("replication") < STAGES.index("precision")


def _mlp_trainer(**options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, Options(device="cpu", **options))
    return trainer


def test_explain_a_trainer_lists_stages_graphs_runs_and_memory():
    trainer = _mlp_trainer()
    with pytest.raises(RuntimeError, match="run one step first"):
        trainer.explain()
    trainer(torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))
    ex = popxl_fx.explain(trainer)
    assert ex.stage_names() == ["capture", "lower", "backward", "optimizer", "session"]
    stages = ex.programs["step"]
    assert stages[-1].memory and stages[-1].memory == {
        i: m.total for i, m in trainer.session.plan.memory.items()
    }
    runs = {g.name: g.runs for g in stages[-1].graphs}
    assert runs[trainer._active.forward.graph.name] == 1
    text = str(ex)
    assert "training_model(Sequential)" in text and "memory per IPU after it" in text


def test_explain_shows_the_accumulation_loop_and_how_often_graphs_run():
    trainer = _mlp_trainer(gradient_accumulation=2, device_iterations=3)
    trainer(torch.randn(3, 4, 6), torch.zeros(3, 4, dtype=torch.long))
    ex = trainer.explain()
    assert ex.stage_names() == [
        "capture", "lower", "backward", "accumulation", "optimizer", "device_iterations",
        "session",
    ]  # fmt: skip
    runs = {g.name: g.runs for g in ex.programs["step"][-1].graphs}
    fwd = trainer._active.forward.graph.name
    assert runs[fwd] == 6 and runs[trainer._active.backward.graph.name] == 6
    assert any(name.startswith("step") and n == 3 for name, n in runs.items())
    assert any(name.startswith("micro_batch") and n == 6 for name, n in runs.items())
    assert "gradient_accumulation=2" in str(ex)


def test_explain_inference_and_compile():
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    sim = popxl_fx.inference_model(net.eval(), Options(device="cpu"))
    sim(torch.randn(3, 4))
    assert popxl_fx.explain(sim).stage_names() == ["capture", "lower", "session"]
    compiled = popxl_fx.compile(nn.Linear(4, 2), Options(device="cpu"))
    compiled(torch.randn(3, 4)).sum().backward()
    ex = popxl_fx.explain(compiled)
    assert set(ex.programs) == {"forward", "backward"}
    assert ex.stage_names("forward") == ["capture", "lower", "backward", "session"]
    with pytest.raises(TypeError, match="explain takes"):
        popxl_fx.explain(nn.Linear(2, 2))


@pytest.mark.parametrize("field", ["gradient_accumulation", "device_iterations"])
def test_compile_refuses_training_loop_options(field):
    opts = Options(device="cpu", **{field: 2})
    with pytest.raises(ValueError, match=f"Options\\({field}=2\\).*compile refuses"):
        popxl_fx.compile(nn.Linear(2, 2), opts)


def test_inference_refuses_gradient_accumulation():
    opts = Options(device="cpu", gradient_accumulation=2)
    with pytest.raises(ValueError, match="gradient_accumulation=2.*inference_model refuses"):
        popxl_fx.inference_model(nn.Linear(2, 2), opts)


@pytest.mark.parametrize("train", [False, True])
def test_inference_device_iterations_are_n_calls_bit_for_bit(train):
    """n forwards per call; in train mode batch norm's running statistics advance n times,
    as after n plain calls."""
    from tests.fx_zoo import ZOO

    n = 3
    results = []
    for iterations in (1, n):
        model = ZOO["small_cnn"]().model.train(train)
        sim = popxl_fx.inference_model(model, Options(device="cpu", device_iterations=iterations))
        xs = [
            torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(i)) for i in range(n)
        ]
        out = torch.stack([sim(x) for x in xs]) if iterations == 1 else sim(torch.stack(xs))
        results.append((out, {k: v.clone() for k, v in model.state_dict().items()}))
    (plain, plain_state), (looped, looped_state) = results
    assert looped.shape == (n, 4, 10) and torch.equal(looped, plain)
    assert all(torch.equal(plain_state[k], looped_state[k]) for k in plain_state)
    with pytest.raises(ValueError, match="device_iterations=3.*leading dimension of 3"):
        sim(torch.randn(4, 1, 28, 28))
