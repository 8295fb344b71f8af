"""popxl_fx.example_values: forgetting a capture's examples turns its tensors into meta tensors
and leaves the entries that hold none (source lines, module paths and states) as they were."""

import torch
from torch import nn

from popxl_fx.capture import capture
from popxl_fx.example_values import forget_examples


def test_forgetting_makes_tensors_meta_and_keeps_the_other_entries_as_they_are():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    captured = capture(model, (torch.randn(2, 4),))
    nodes = [n for n in captured.gm.graph.nodes if n.op != "output"]
    kept = {(n, k): v for n in nodes for k, v in n.meta.items() if k != "example_value"}
    assert {"source", "module_path", "nn_module_stack"} <= {k for _, k in kept}
    forget_examples(captured)
    assert all(n.meta["example_value"].device.type == "meta" for n in nodes)
    assert all(n.meta[k] is v for (n, k), v in kept.items())
