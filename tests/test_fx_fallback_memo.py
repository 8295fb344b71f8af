"""One ATen decomposition per distinct call (`popxl_fx.fallback_memo`): the same call by two
nodes is traced once, each node still gets a graph of its own, and the key tells apart what
the trace can see (argument values, layouts, torch's state); a user's function is never
shared. The programs built so are checked against eager by the fallback tests."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from torch import nn

from popxl_fx import fallback
from popxl_fx.fallback_memo import call_key


@pytest.fixture
def traces(monkeypatch):
    """The decompositions traced (the real trace, counted)."""
    made = []
    real = fallback._traced

    def counted(*args):
        made.append(args)
        return real(*args)

    monkeypatch.setattr(fallback, "_traced", counted)
    return made


def _calls(target, *arg_lists, examples=None):
    """One fx node per argument list, each calling ``target``; placeholders take
    ``examples`` (name -> tensor) as their example values."""
    graph = fx.Graph()
    inputs = {}
    for name, value in (examples or {}).items():
        inputs[name] = graph.placeholder(name)
        inputs[name].meta["example_value"] = value
    nodes = []
    for args in arg_lists:
        filled = tuple(inputs.get(a, a) if isinstance(a, str) else a for a in args)
        nodes.append(graph.call_function(target, filled))
    return nodes


def _key(node):
    args = fx.node.map_arg(node.args, lambda n: n.meta["example_value"])
    leaves, spec = torch.utils._pytree.tree_flatten((args, {}))
    return call_key(node, leaves, spec, 0)


def test_the_same_call_twice_is_traced_once_into_two_graphs(traces):
    # the first trace in a process registers ops with torch, which changes the table
    fallback.decompose(_calls(torch.zeros, ((1,),))[0], nn.Module())
    first, second = _calls(torch.rand, ((3, 5),), ((3, 5),))
    a = fallback.decompose(first, nn.Module())
    traced = len(traces)
    b = fallback.decompose(second, nn.Module())
    assert len(traces) == traced
    assert a.gm is not b.gm and a.aten_targets() == b.aten_targets()
    for n in a.gm.graph.nodes:
        n.meta["source"] = "first.py:1"  # what lowering marks on its own copy
    assert all("source" not in n.meta for n in b.gm.graph.nodes)


def test_a_user_function_is_traced_per_node(traces):
    def scale(x):
        return x * 2

    x = torch.ones(2, 3)
    first, second = _calls(scale, ("x",), ("x",), examples={"x": x})
    assert _key(first) is None
    fallback.decompose(first, nn.Module())
    fallback.decompose(second, nn.Module())
    assert len(traces) == 2


def test_tensor_arguments_are_keyed_by_values_layout_and_flags():
    base = torch.arange(12.0)
    views = {
        "x": base[:6].view(2, 3),
        "other_values": (base + 1)[:6].view(2, 3),
        "offset": base[1:7].view(2, 3),
        "strides": base[:6].view(3, 2).t(),
        "requires_grad": base[:6].view(2, 3).detach().requires_grad_(),
        "double": base.double()[:6].view(2, 3),
        "same": torch.arange(12.0)[:6].view(2, 3),
    }
    nodes = _calls(torch.neg, *[(name,) for name in views], examples=views)
    keys = [_key(n) for n in nodes]
    assert None not in keys
    assert keys[-1] == keys[0]  # equal values, layout and storage: one trace serves both
    assert len(set(keys)) == len(keys) - 1


def test_python_arguments_are_keyed_by_type_and_value():
    nodes = _calls(torch.full, ((2,), 1), ((2,), 1.0), ((2,), True), ((2,), 1))
    keys = [_key(n) for n in nodes]
    assert keys[0] == keys[3] and len(set(keys)) == 3


def test_torch_state_is_part_of_the_key():
    (node,) = _calls(torch.rand, ((2, 2),))
    plain = _key(node)
    with torch.no_grad():
        assert _key(node) != plain
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert _key(node) != plain
    finally:
        torch.set_default_dtype(before)
    assert _key(node) == plain
