"""`GraphWithNamedArgs.print_schedule()` against the seeds' printed schedules."""

import numpy as np
import pytest

import addons
import popxl_core as popxl

from .test_addons_models import Adam, Linear, Net, NetOutlined

LINEAR = """\
Graph : Linear_subgraph(0)
  (%1, weight=%2, bias=%3) -> (%5) {
    MatMul.100 (%1 [(2, 4) float32], %2 [(4, 32) float32]) -> (%4 [(2, 32) float32])
    Add.101 (%4 [(2, 32) float32], %3 [(32,) float32]) -> (%5 [(2, 32) float32])
  }"""

NET_INPUTS = (
    "  (%1, fc1.weight=%2, fc1.bias=%3, fc2.weight=%4, fc2.bias=%5, fc3.weight=%6, "
    "fc3.bias=%7, fc4.weight=%8, fc4.bias=%9)"
)

NET = f"""\
Graph : Net_subgraph(0)
{NET_INPUTS} -> (%21) {{
    Reshape.100 (%1 [(28, 28) float32]) -> (%10 [(1, 784) float32])
    MatMul.101 (%10 [(1, 784) float32], %2 [(784, 512) float32]) -> (%11 [(1, 512) float32])
    Add.102 (%11 [(1, 512) float32], %3 [(512,) float32]) -> (%12 [(1, 512) float32])
    Gelu.103 (%12 [(1, 512) float32]) -> (%13 [(1, 512) float32])
    MatMul.104 (%13 [(1, 512) float32], %4 [(512, 512) float32]) -> (%14 [(1, 512) float32])
    Add.105 (%14 [(1, 512) float32], %5 [(512,) float32]) -> (%15 [(1, 512) float32])
    Gelu.106 (%15 [(1, 512) float32]) -> (%16 [(1, 512) float32])
    MatMul.107 (%16 [(1, 512) float32], %6 [(512, 512) float32]) -> (%17 [(1, 512) float32])
    Add.108 (%17 [(1, 512) float32], %7 [(512,) float32]) -> (%18 [(1, 512) float32])
    Gelu.109 (%18 [(1, 512) float32]) -> (%19 [(1, 512) float32])
    MatMul.110 (%19 [(1, 512) float32], %8 [(512, 10) float32]) -> (%20 [(1, 10) float32])
    Add.111 (%20 [(1, 10) float32], %9 [(10,) float32]) -> (%21 [(1, 10) float32])
  }}"""

NET_OUTLINED = f"""\
Graph : NetOutlined_subgraph(0)
{NET_INPUTS} -> (%19) {{
    Reshape.100 (%1 [(28, 28) float32]) -> (%10 [(1, 784) float32])
    MatMul.101 (%10 [(1, 784) float32], %2 [(784, 512) float32]) -> (%11 [(1, 512) float32])
    Add.102 (%11 [(1, 512) float32], %3 [(512,) float32]) -> (%12 [(1, 512) float32])
    Gelu.103 (%12 [(1, 512) float32]) -> (%13 [(1, 512) float32])
    Call.106(Linear_subgraph(1)) (%13 [(1, 512) float32], %4 [(512, 512) float32], \
%5 [(512,) float32]) -> (%14 [(1, 512) float32])
    Gelu.107 (%14 [(1, 512) float32]) -> (%15 [(1, 512) float32])
    Call.108(Linear_subgraph(1)) (%15 [(1, 512) float32], %6 [(512, 512) float32], \
%7 [(512,) float32]) -> (%16 [(1, 512) float32])
    Gelu.109 (%16 [(1, 512) float32]) -> (%17 [(1, 512) float32])
    MatMul.110 (%17 [(1, 512) float32], %8 [(512, 10) float32]) -> (%18 [(1, 10) float32])
    Add.111 (%18 [(1, 10) float32], %9 [(10,) float32]) -> (%19 [(1, 10) float32])
  }}"""

ADAM_FLOAT_LR = """\
Graph : Adam_subgraph(0)
  (%1, %2, first_order=%3, second_order=%4, step=%5) -> () {
    Accumulate.100 (%3 [(2, 2) float16], %2 [(2, 2) float32]) -> (%6 [(2, 2) float16])
    Accumulate.101 (%4 [(2, 2) float32], %2 [(2, 2) float32]) -> (%7 [(2, 2) float32])
    AdamUpdater.102 (%3 [(2, 2) float16], %4 [(2, 2) float32], %5 [() float32]) -> \
(%8 [(2, 2) float16])
    ScaledAddLhsInplace.103 (%1 [(2, 2) float32], %8 [(2, 2) float16]) -> (%9 [(2, 2) float32])
  }"""

ADAM_TENSOR_LR = """\
Graph : Adam_subgraph(1)
  (%1, %2, %3, first_order=%4, second_order=%5, step=%6) -> () {
    Accumulate.104 (%4 [(2, 2) float16], %2 [(2, 2) float32]) -> (%7 [(2, 2) float16])
    Accumulate.105 (%5 [(2, 2) float32], %2 [(2, 2) float32]) -> (%8 [(2, 2) float32])
    AdamUpdater.106 (%4 [(2, 2) float16], %5 [(2, 2) float32], %6 [() float32]) -> \
(%9 [(2, 2) float16])
    Neg.107 (%3 [() float32]) -> (%10 [() float32])
    ScaledAddLhsInplace.108 (%1 [(2, 2) float32], %9 [(2, 2) float16], %10 [() float32]) -> \
(%11 [(2, 2) float32])
  }"""


def test_linear_schedule_matches_seed():
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        _, graph = Linear(32).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        text = graph.print_schedule()
    assert isinstance(text, str)
    assert text == LINEAR


def test_inlined_net_schedule_matches_seed():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Net().create_graph(popxl.TensorSpec((28, 28), popxl.float32))
    assert list(facts.to_dict().keys()) == [
        f"fc{i}.{p}" for i in range(1, 5) for p in ("weight", "bias")
    ]
    assert graph.print_schedule() == NET


def test_outlined_net_schedule_matches_seed():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = NetOutlined().create_graph(popxl.TensorSpec((28, 28), popxl.float32))
    # fc1/fc4 were registered in __init__, fc2/fc3 during build
    assert list(facts.to_dict().keys()) == [
        f"fc{i}.{p}" for i in (1, 4, 2, 3) for p in ("weight", "bias")
    ]
    assert graph.print_schedule() == NET_OUTLINED


def test_adam_schedules_match_seed():
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        var = popxl.variable(np.ones((2, 2)), popxl.float32)
        _, adam = Adam(cache=True).create_graph(var, var.spec, lr=1e-3)
        _, adam_lr = Adam().create_graph(var, var.spec, lr=popxl.TensorSpec((), popxl.float32))
    assert adam.print_schedule() == ADAM_FLOAT_LR
    assert adam_lr.print_schedule() == ADAM_TENSOR_LR


def test_schedule_of_graph_without_ops_has_blank_body():
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(lambda x: x, popxl.TensorSpec((3,), popxl.float32))
    text = addons.GraphWithNamedArgs(graph).print_schedule()
    assert text == f"Graph : {graph.name}\n  (%1) -> (%1) {{\n    \n  }}"


@pytest.mark.parametrize("names", [("b", "a"), ("a", "b")])
def test_schedule_labels_follow_args_not_input_order(names):
    ir = popxl.Ir()
    with ir.main_graph:

        def fn(x, y):
            return x + y

        spec = popxl.TensorSpec((2,), popxl.float32)
        graph = ir.create_graph(fn, spec, spec)
        args = addons.NamedTensors.pack(names, graph.inputs)
        text = addons.GraphWithNamedArgs(graph, args).print_schedule()
    assert f"({names[0]}=%1, {names[1]}=%2) -> (%3)" in text
