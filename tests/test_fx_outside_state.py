"""popxl_fx.outside_state: which models can read Python state from outside themselves (so
`check` traces them twice), and that `check` skips the second trace for the others."""

import functools
import importlib
import itertools
import math
import random
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx.capture import capture
from popxl_fx.check import check
from popxl_fx.outside_state import reads_outside_state

check_module = importlib.import_module("popxl_fx.check")  # the package exports `check` itself

_COUNT = itertools.count(1)
_SIZES = [2, 3]
_WIDTH = 3  # a constant: fine
_STEPS = 0


def _pure_helper(x):
    return F.relu(x) * math.pi


def _impure_helper(x):
    return x[:, : _SIZES[0]]


class Plain(nn.Module):
    """Reads only its own modules, constants, torch and pure helpers."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.k = 2
        self.sizes = [1, 2]  # its own list: the trace records writes to it
        self.act = functools.partial(F.leaky_relu, negative_slope=0.1)

    def forward(self, x):
        y = _pure_helper(self.fc(x)) * self.k
        return self.act(y[:, :_WIDTH]) + sum(self.sizes)


class Forward(nn.Module):
    """A model whose forward is the given function."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _global_count(x):
    return x[:, : next(_COUNT)]


def _global_write(x):
    global _STEPS
    _STEPS += 1
    return x


def _closure():
    seen = []
    return lambda x: x[:, : len(seen) + 1]


def _random_width(x):
    return x[:, : random.randint(1, 3)]


def _time_width(x):
    return x[:, : int(time.time()) % 3 + 1]


class HeldIterator(nn.Module):
    def __init__(self):
        super().__init__()
        self.widths = iter(range(1, 4))

    def forward(self, x):
        return x[:, : next(self.widths)]


class ClassList(nn.Module):
    shared = [1]  # one list for every instance: nobody records its writes

    def forward(self, x):
        self.shared.append(1)
        return x[:, : len(self.shared)]


class Other:
    n = 1


class OtherWrite(nn.Module):
    def forward(self, x):
        Other.n += 1
        return x[:, : Other.n]


def test_a_model_of_its_own_state_and_constants_reads_nothing_outside():
    assert not reads_outside_state(Plain(), (torch.randn(2, 4),))
    assert not reads_outside_state(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    assert not reads_outside_state(nn.LSTM(4, 4, num_layers=2))


@pytest.mark.parametrize(
    "model",
    [
        Forward(_global_count),
        Forward(_global_write),
        Forward(_impure_helper),
        Forward(_closure()),
        Forward(_random_width),
        Forward(_time_width),
        HeldIterator(),
        ClassList(),
        OtherWrite(),
    ],
    ids=lambda m: getattr(getattr(m, "fn", None), "__name__", type(m).__name__),
)
def test_state_outside_the_model_keeps_the_second_trace(model):
    assert reads_outside_state(model, (torch.randn(2, 4),))


def test_an_example_input_that_is_an_iterator_keeps_the_second_trace():
    assert reads_outside_state(Plain(), (torch.randn(2, 4), iter([1])))


def _count_retraces(monkeypatch):
    calls = []
    real = check_module._retrace

    def counted(captured, model):
        calls.append(type(model).__name__)
        return real(captured, model)

    monkeypatch.setattr(check_module, "_retrace", counted)
    return calls


def test_check_traces_once_a_model_that_reads_nothing_outside(monkeypatch):
    calls = _count_retraces(monkeypatch)
    assert check(Plain(), torch.randn(2, 4)).ok
    assert calls == []


def test_check_traces_twice_and_reports_a_model_that_reads_a_global_counter(monkeypatch):
    calls = _count_retraces(monkeypatch)
    report = check(Forward(_global_count), torch.randn(2, 4))
    assert calls == ["Forward"]
    assert [i.kind for i in report.issues] == ["shape changes between calls"]


class GlobalScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * _SIZES[0]


def _module_states(captured):
    return [n.name for n in captured.gm.graph.nodes if "module_state" in n.meta]


def test_a_capture_keeps_what_a_second_trace_compares_only_for_a_model_traced_again():
    closed = capture(Plain(), (torch.randn(2, 4),))
    assert not closed.outside_state and _module_states(closed) == []
    outside = capture(GlobalScaled(), (torch.randn(2, 4),))
    assert outside.outside_state and _module_states(outside) == ["fc"]
