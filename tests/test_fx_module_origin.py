"""Every op lowered from a torch module carries that module's path (popxl_core.context
.module_origin), so the simulator's op table and out-of-memory errors can name it."""

import torch
from torch import nn

from popxl_core.context import module_origin
from popxl_fx.inference import inference_model


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.head(self.body(x).flatten(1)) * 2.0


def _ops_by_type(ir):
    found = {}
    for g in ir._graphs.values():
        for op in g.ops:
            found.setdefault(op.type, set()).add(op.module_path)
    return found


def test_lowered_ops_name_their_torch_module_and_plan_rows_carry_it():
    torch.manual_seed(0)
    sim = inference_model(Net().eval())
    sim(torch.randn(2, 3, 6, 6))
    by_type = _ops_by_type(sim.ir)
    assert by_type["Conv"] == {"body.0"}
    assert by_type["Relu"] == {"body.1"}
    assert "head" in by_type["Linear"]
    assert "<root>" in by_type["Mul"]  # `* 2.0` is the root module's own code
    rows = {row.module_path for row in sim.session.plan.ops}
    assert {"body.0", "body.1", "head"} <= rows


def test_ops_outside_a_frontend_have_no_module_path_and_the_context_nests():
    import numpy as np

    import popxl_core as popxl
    from popxl_core import ops

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")
        plain = ops.relu(x)
        with module_origin("outer"):
            a = ops.relu(x)
            with module_origin("outer.inner"):
                b = ops.relu(x)
            c = ops.relu(x)
    del plain, a, b, c
    assert [op.module_path for op in ir.main_graph.ops] == [None, "outer", "outer.inner", "outer"]


def test_backward_ops_name_the_module_of_the_forward_op_they_differentiate():
    """A 3-block model trained: every op of the gradient graph carries a module path, that of
    the forward op it differentiates (the loss's gradient ops: the loss wrapper's root)."""
    import torch.nn.functional as F

    import popxl_fx

    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    trainer = popxl_fx.training_model(
        blocks, torch.optim.SGD(blocks.parameters(), lr=0.1), F.mse_loss,
        popxl_fx.Options(device="cpu"),
    )  # fmt: skip
    trainer(torch.randn(4, 8), torch.randn(4, 8))
    prog = trainer._active
    fwd_paths = {op.module_path for op in prog.forward.graph.ops}
    bwd_ops = prog.backward.graph.ops
    assert bwd_ops and all(op.module_path is not None for op in bwd_ops)
    bwd_paths = {op.module_path for op in bwd_ops}
    assert {f"model.{i}.0" for i in range(3)} <= bwd_paths  # each Linear's gradient
    assert {f"model.{i}.1" for i in range(3)} <= bwd_paths  # each Tanh's gradient
    assert bwd_paths <= fwd_paths
    tanh_grads = [op.type for op in bwd_ops if op.module_path == "model.1.1"]
    assert tanh_grads and "Linear" not in tanh_grads
