"""While tracing, forward's own ``isinstance`` sees a traced value's example type (as in
eager), while torch.fx's and pytree's calls answer as the builtin, without the wrapper."""

from __future__ import annotations

import builtins

import torch
import torch.fx.proxy
import torch.utils._pytree as pytree
from torch import nn

from popxl_fx.capture import capture

_BUILTIN = builtins.isinstance
_SEEN: list = []  # what forward saw, outside the model (the trace puts the model's state back)


class Seen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        _SEEN.append(
            (
                isinstance(y, torch.Tensor),  # forward's own code: the example's type
                builtins.isinstance is not _BUILTIN,  # the trace's wrapper is in place
                vars(pytree).get("isinstance") is _BUILTIN,  # torch's modules: the builtin
                vars(torch.fx.proxy).get("isinstance") is _BUILTIN,
            )
        )
        return y if isinstance(y, torch.Tensor) else y * 0


def test_forward_sees_example_types_and_torch_modules_the_builtin():
    _SEEN.clear()
    captured = capture(Seen(), (torch.randn(2, 3),))
    assert [n.op for n in captured.gm.graph.nodes] == ["placeholder", "call_module", "output"]
    assert "isinstance" not in vars(pytree) and "isinstance" not in vars(torch.fx.proxy)
    assert builtins.isinstance is _BUILTIN
    assert _SEEN == [(True, True, True, True)]


def test_the_trace_records_the_same_values_with_the_builtin_in_torch_modules():
    model, x = Seen(), torch.randn(2, 3)
    captured = capture(model, (x,))
    value = captured.gm.graph.find_nodes(op="call_module")[0].meta["example_value"]
    assert torch.equal(value, model.fc(x))
