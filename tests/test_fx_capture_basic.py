"""A small MLP traced, lowered through addons (create_graph + Session) and run: same numbers as
eager torch, variables named by torch qualified names."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_core as popxl
import popxl_fx.lowerings  # noqa: F401  (registers the table)
from popxl_core import ops
from popxl_fx.module import Module


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        x = x.flatten(1)
        h = F.gelu(self.fc1(x)) + 1.0
        h = self.body(h) * 0.5 - x.shape[0]
        return self.fc2(h).view(x.size(0), -1)


def run_module(model: nn.Module, *xs: torch.Tensor):
    """Lower ``model`` with popxl_fx.Module + create_graph and run it once on ``xs``."""
    mod = Module(model)
    ir = popxl.Ir()
    with ir.main_graph:
        specs = [popxl.TensorSpec(tuple(x.shape), popxl.dtype.as_dtype(x.dtype)) for x in xs]
        facts, graph = mod.create_graph(*specs)
        variables = facts.init()
        inputs = [popxl.variable(x.numpy(), name=f"x{i}") for i, x in enumerate(xs)]
        outs = graph.bind(variables).call(*inputs)
        streams = []
        for i, y in enumerate(outs):
            streams.append(popxl.d2h_stream(y.shape, y.dtype, f"y{i}"))
            ops.host_store(streams[-1], y)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        result = session.run()
    return [torch.from_numpy(result[s]) for s in streams], variables


def test_mlp_matches_eager_exactly_and_names_variables_by_torch_names():
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 3, 4)
    (y,), variables = run_module(model, x)
    # Same kernels in the same order: bit-exact.
    torch.testing.assert_close(y, model(x).detach(), rtol=0, atol=0)
    assert sorted(variables.to_dict()) == sorted(n for n, _ in model.named_parameters())


def test_capture_leaves_the_model_unchanged_in_train_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    Module(model).capture(torch.randn(3, 4))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


if __name__ == "__main__":
    pytest.main([__file__])
