"""popxl_fx.replay: a second trace reuses the first trace's example values only where the
call is provably the same; it equals a plain second trace value for value, and it still sees
every way a model's shapes can change between calls."""

import torch
from torch import nn

from popxl_fx.capture import capture
from popxl_fx.check import CheckReport, _compare, _trace, check
from popxl_fx.replay import Replay

_OFFSET = [0.5]  # a global list forward reads: `check` traces Net a second time


class Net(nn.Module):
    """Leaf modules with state (batch norm, dropout), functions, methods, a made constant."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = nn.functional.max_pool2d(y, 2).flatten(1)
        y = self.drop(y) + torch.tensor(_OFFSET)
        return self.fc(y).softmax(-1)


def _traces(model, *inputs):
    captured = capture(model, inputs)
    replay = Replay(captured.gm.graph)
    replayed = _trace(model, captured.example_inputs, CheckReport(""), replay)
    plain = _trace(model, captured.example_inputs, CheckReport(""))
    return captured, replay, replayed, plain


def test_replayed_trace_equals_a_plain_second_trace_bit_for_bit():
    torch.manual_seed(0)
    model = Net().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    captured, replay, replayed, plain = _traces(model, torch.randn(2, 3, 8, 8))
    calls = [n for n in captured.gm.graph.nodes if n.op.startswith("call")]
    assert replay.reused == len(calls)  # every call reused, nothing run again
    pairs = list(zip(replayed.gm.graph.nodes, plain.gm.graph.nodes))
    assert len(pairs) == len(plain.gm.graph.nodes) == len(captured.gm.graph.nodes)
    for a, b in pairs:
        assert a.op == b.op and a.target == b.target
        va, vb = a.meta.get("example_value"), b.meta.get("example_value")
        if isinstance(vb, torch.Tensor):
            assert torch.equal(va, vb), a.name  # same RNG state and buffers: same values
    assert _compare(captured.gm.graph, replayed.gm.graph, "between calls") is None
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


class Growing(nn.Module):
    """A leaf module's configuration changes on every call (same graph, same arguments)."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool1d(1)

    def forward(self, x):
        self.pool.kernel_size += 1
        return self.pool(x) * 2


class NewTable(nn.Module):
    """A plain tensor attribute is made again, one row longer, on every call."""

    def __init__(self):
        super().__init__()
        self.rows = 1

    def forward(self, x):
        self.rows += 1
        self.table = torch.ones(self.rows, 4)
        return x @ self.table.T


class Swapped(nn.Module):
    """A parameter is replaced by one of another shape on every call."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        out = self.fc(x)
        n = self.fc.out_features + 1
        self.fc.weight = nn.Parameter(torch.zeros(n, 4))
        self.fc.bias = nn.Parameter(torch.zeros(n))
        self.fc.out_features = n
        return out


def test_changes_between_calls_are_still_found():
    for model in (Growing(), NewTable(), Swapped()):
        report = check(
            model, torch.randn(3, 4, 6) if isinstance(model, Growing) else torch.randn(3, 4)
        )
        kinds = [i.kind for i in report.issues]
        # a change made through the module's Python state is named at its line (issue 17)
        found = {"shape changes between calls", "Python state in forward"} & set(kinds)
        assert found, (type(model).__name__, str(report))


def test_a_changed_module_is_evaluated_and_what_follows_it_too():
    model = Growing()
    captured, replay, replayed, _ = _traces(model, torch.randn(3, 4, 6))
    assert replay.reused == 0  # the pool's state differs, and the mul reads its output

    def shapes(gm):
        return [
            tuple(n.meta["example_value"].shape) for n in gm.graph.nodes if n.op.startswith("call")
        ]

    # kernel 2, then 3 (stride stays 1) over length 6
    assert shapes(captured.gm) == [(3, 4, 5)] * 2
    assert shapes(replayed.gm) == [(3, 4, 4)] * 2
