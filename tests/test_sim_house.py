"""The simulator knows ops only through their `OpDef` rows (issue 23, issue 39).

What a compile-time rewrite needs to know about an op (its multi-tensor form, its ``out=``
form, its direct torch call, replica folding, ...) is a rule in one of the sim's speed tables
(`popxl_core.sim.speed`), keyed by the op's `OpDef` and registered next to its kernel; the
`OpDef` itself says only what the op means. So no module of ``popxl_core/sim/`` spells an op
type: a string literal equal to a registered op type name is a special case keyed on a name,
which these checks reject (tables of op types are built from the rows, e.g.
``frozenset(d.name for d in (CALL, REPEAT))``).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from popxl_core.ops.registry import OpDef, all_opdefs, no_cost
from popxl_core.sim import speed

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "popxl_core" / "sim"


def _string_literals(source: str) -> list[tuple[str, int]]:
    """Every plain string constant of ``source`` (f-string parts included), with its line."""
    return [
        (node.value, node.lineno)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _op_names_in(source: str, names: set[str]) -> list[tuple[str, int]]:
    return [(s, line) for s, line in _string_literals(source) if s in names]


def test_no_op_type_literal_in_sim():
    names = set(all_opdefs())
    found = [
        f"{path.relative_to(ROOT)}:{line} spells op type {name!r}"
        for path in sorted(SIM.rglob("*.py"))
        for name, line in _op_names_in(path.read_text(), names)
    ]
    assert not found, "\n".join(found)


def test_the_check_sees_an_op_type_literal():
    source = 'def f(op):\n    return op.type in ("Add", "Mul") or op.type == f"{op}"\n'
    assert _op_names_in(source, {"Add", "Mul", "Sub"}) == [("Add", 2), ("Mul", 2)]


def _type_matches_in(source: str) -> list[int]:
    """Lines that compare an op's type name (``op.type == ...``, ``op.type in ...``,
    ``op.type.startswith(...)``) instead of looking its row up."""

    def is_type(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "type"

    def on_name(node) -> bool:
        return is_type(node) and isinstance(node.value, ast.Name)

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(map(on_name, [node.left, *node.comparators])):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "endswith") and on_name(node.func.value):
                lines.append(node.lineno)
    return lines


def test_no_op_type_name_matched_in_sim():
    """sim/ matches ops by their rows (``op.opdef in (HOST_LOAD, ...)``, the tables of
    `speed` and `ring`), never by their type names or a prefix of them."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(SIM.rglob("*.py"))
        for line in _type_matches_in(path.read_text())
    ]
    assert not found, "\n".join(found)


def test_the_check_sees_an_op_type_match():
    source = "def f(op, t):\n    return op.type in S or t.device.type == 'cpu'\n"
    source += "def g(op):\n    return op.type.startswith(('Remote', 'Replicated'))\n"
    assert sorted(_type_matches_in(source)) == [2, 4]


def test_ring_factors_are_the_collectives():
    """The cost model's ring collectives (`ring.RING_FACTOR`) are the rows that exchange data
    between replicas, addons' tensor-parallel all-reduce among them."""
    import addons.ops.replicated_all_reduce_TP  # noqa: F401 (registers its row)
    from popxl_core.sim.ring import RING_FACTOR

    collectives = {name for name, d in all_opdefs().items() if d.collective}
    assert _names(RING_FACTOR) == collectives
    assert "ReplicatedAllReduceTP" in collectives
    tp_factor = RING_FACTOR.get(all_opdefs()["ReplicatedAllReduceTP"])
    assert [tp_factor({"identical_inputs": same}) for same in (False, True)] == [2.0, 0.0]


def test_opdef_has_no_untyped_fields():
    """``OpDef.extra`` (free-form keys) is gone: every fact is a declared field."""
    fields = {f.name: f.type for f in dataclasses.fields(OpDef)}
    assert "extra" not in fields
    assert all(t not in ("Any", "Dict[str, Any]") for t in fields.values()), fields


def _names(table: speed.OpTable) -> set[str]:
    return {name for name, d in all_opdefs().items() if d in table}


@pytest.mark.parametrize(
    "table, names",
    [
        (speed.OUT_KERNEL, {"Add", "Sub", "Mul", "Div", "Sqrt", "Relu", "ReluGrad"}),
        (speed.DIRECT, {"Add", "Sub", "Mul", "MatMul", "Reshape", "Transpose"}),
        (speed.TRANSPOSED_KERNEL, {"MatMul"}),
        (speed.MATRIX_TRANSPOSE, {"Transpose"}),
        (speed.JOINT_GRAD, {"ConvDataGrad", "ConvWeightsGrad", "ConvBiasGrad"}),
        (
            speed.DEAD_OUTPUT_KERNELS,
            {"LinearGrad", "MaxPoolWithIndices", "ScaledDotProductFlashAttention"},
        ),
        (speed.BUFFERED_KERNEL, {"LinearGrad"}),
    ],
)
def test_speed_rules_are_declared_on_the_ops_that_had_them(table, names):
    """The rewrites keep applying to the ops they applied to when the rules were fields."""
    assert _names(table) == names


def test_replica_stack_rules():
    have = {n for n, d in all_opdefs().items() if d in speed.REPLICA_BATCHING}
    assert {n for n in have if speed.REPLICA_BATCHING[all_opdefs()[n]].stack} == {
        "Linear",
        "LinearGrad",
    }


def test_replica_fold_rules():
    fold = speed.REPLICA_BATCHING.rows
    have = {n for n, d in all_opdefs().items() if d in fold and fold[d].fold is not None}
    assert {"Add", "Sub", "Mul", "Reshape", "Transpose", "Linear", "LinearGrad"} <= have
    assert {"LayerNorm", "LayerNormGrad", "Nll", "NllGrad", "Gelu", "GeluGrad"} <= have
    assert {"Softmax", "Concat", "ReduceSum", "Gather", "ScatterReduce"} <= have


def test_speed_tables_are_keyed_by_registered_rows():
    """Every rule belongs to a row of the op table (the object, not a type name)."""
    rows = list(all_opdefs().values())
    for table in speed.TABLES:
        assert all(any(d is r for r in rows) for d in table), table


def test_opdef_has_no_speed_field():
    """What an op means stays on `OpDef`; a speed variant given to it is a TypeError, so an
    old row does not silently lose its rule (register it with `speed.declare`)."""
    fields = {f.name for f in dataclasses.fields(OpDef)}
    assert not fields & {t.name for t in speed.TABLES}
    with pytest.raises(TypeError, match=r"speed.declare\(ROW, replica_fold=...\)"):
        OpDef("X", lambda ins: ins, torch.neg, replica_fold=object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_field'"):
        OpDef("X", lambda ins: ins, no_such_field=1)


def test_declare_checks_table_names_and_duplicates():
    row = OpDef("NotRegistered", lambda ins: ins, torch.neg, cost=no_cost)
    with pytest.raises(TypeError, match="no speed table"):
        speed.declare(row, replica_folds=object())
    table = speed.OpTable("test")
    table.register(row, 1)
    with pytest.raises(ValueError, match="already has a test rule"):
        table.register(row, 2)
    twin = dataclasses.replace(row)  # equal fields, another row
    assert table.get(row) == 1 and twin not in table
    assert copy.deepcopy([row])[0] is row and copy.copy(row) is row  # copies keep the key


def test_foreach_forms():
    have = _names(speed.FOREACH)
    assert {"Add", "Sub", "Mul", "Div", "Sqrt", "Neg", "ScaledAdd", "ScaledAddLhsInplace"} <= have
    assert {"Accumulate", "AccumulatorScale", "CopyVarUpdate", "LerpInplace"} <= have
    assert {"AddcmulInplace", "AddcdivInplace", "FusedSGD"} <= have
    # only ops that may write into a dead input choose a group mode other than "fresh"
    writes = {name for name in have if speed.FOREACH.get(all_opdefs()[name]).targets is not None}
    assert writes == {"Add", "Sub", "Mul", "Div", "Sqrt"}


def test_each_pass_has_a_docstring_and_a_compile_options_switch():
    from popxl_core.sim.options import CompileOptions
    from popxl_core.sim.passes import PASSES, STATS

    switches = {f.name for f in dataclasses.fields(CompileOptions)}
    for p in PASSES:
        assert p.run.__doc__, p.run.__name__
        assert p.switch == "" or p.switch in switches, p.switch
        assert set(p.stats) <= set(STATS)


def test_compile_options_are_checked():
    from popxl_core.sim.options import CompileOptions

    with pytest.raises(TypeError, match=r"CompileOptions\(foreach=1\): give True or False"):
        CompileOptions(foreach=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CompileOptions().foreach = False


# A function's length: its lines from ``def`` to its last line, its docstring left out (that
# is documentation, not logic; the signature counts). Test-sample tables (lists of `Sample`
# literals, one per case) are data, not logic.
MAX_LINES = 40


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            return first.end_lineno - first.lineno + 1
    return 0


def _long_functions(path: Path) -> list[tuple[str, int, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            if n > MAX_LINES and "samples" not in node.name:
                found.append((node.name, node.lineno, n))
    return found


def test_no_function_in_the_product_over_40_lines():
    found = [
        f"{path.relative_to(ROOT)}:{line} {name} has {n} lines (docstring aside)"
        for package in ("popxl_core", "addons", "popxl_fx")
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line, n in _long_functions(path)
    ]
    assert not found, "\n".join(found)
