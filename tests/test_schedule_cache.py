"""`schedule` keeps a graph's last order: every change the order depends on must miss the cache
(checked against the uncached `_schedule` after each kind of edit the product makes)."""

import popxl_core as popxl
from popxl_core import ops
from popxl_core.graph_edit import remove_ops
from popxl_core.schedule import _schedule, schedule


def _chain():
    ir = popxl.Ir()
    g = ir.main_graph
    with g:
        x = popxl.variable([1.0, 2.0])
        a = ops.add(x, x)
        b = ops.mul(x, x)
        c = ops.sub(a, b)
    return g, x, a, b, c


def _same(g):
    got = schedule(g)
    assert got == _schedule(g)
    return [op.type for op in got]


def test_repeated_schedule_is_the_uncached_order_and_a_fresh_list():
    g, *_ = _chain()
    first = schedule(g)
    first.reverse()  # the caller's list is its own
    assert schedule(g) == _schedule(g)
    assert schedule(g) is not schedule(g)


def test_new_op_misses_the_cache():
    g, x, _, _, c = _chain()
    assert _same(g) == ["Add", "Mul", "Sub"]
    with g:
        ops.relu(c)
    assert _same(g) == ["Add", "Mul", "Sub", "Relu"]


def test_new_topological_constraint_misses_the_cache():
    g, *_ = _chain()
    add, mul = g._ops[0], g._ops[1]
    assert _same(g) == ["Add", "Mul", "Sub"]
    g._topocons.append((mul, add))  # in place
    assert _same(g) == ["Mul", "Add", "Sub"]
    g._topocons = []  # reassigned
    assert _same(g) == ["Add", "Mul", "Sub"]


def test_changed_op_inputs_miss_the_cache():
    g, x, a, b, c = _chain()
    add = g._ops[0]
    assert _same(g) == ["Add", "Mul", "Sub"]
    add.inputs[0] = b  # in place: Add now reads Mul's output
    assert _same(g) == ["Mul", "Add", "Sub"]
    add.inputs = [x, x]  # reassigned
    assert _same(g) == ["Add", "Mul", "Sub"]
    add.inputs.append(b)  # appended
    assert _same(g) == ["Mul", "Add", "Sub"]


def test_reordered_and_removed_ops_miss_the_cache():
    g, *_ = _chain()
    assert _same(g) == ["Add", "Mul", "Sub"]
    g._ops[:] = [g._ops[1], g._ops[0], g._ops[2]]  # in place
    assert _same(g) == ["Mul", "Add", "Sub"]
    sub = g._ops[2]
    remove_ops(g, [sub])  # reassigns graph._ops
    assert _same(g) == ["Mul", "Add"]
