"""The simulator knows ops only through their `OpDef` rows (issue 23).

What a compile-time rewrite needs to know about an op (its multi-tensor form, its ``out=``
form, its direct torch call, ...) is a typed field of its `OpDef`, declared next to its kernel.
So no module of ``popxl_core/sim/`` spells an op type: a string literal equal to a registered
op type name is a special case keyed on a name, which these checks reject (tables of op types
are built from the rows, e.g. ``frozenset(d.name for d in (CALL, REPEAT))``).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from popxl_core.ops.registry import OpDef, all_opdefs

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


def test_opdef_has_no_untyped_fields():
    """``OpDef.extra`` (free-form keys) is gone: every fact is a declared field."""
    fields = {f.name: f.type for f in dataclasses.fields(OpDef)}
    assert "extra" not in fields
    assert all(t not in ("Any", "Dict[str, Any]") for t in fields.values()), fields


@pytest.mark.parametrize(
    "field, names",
    [
        ("out_kernel", {"Add", "Sub", "Mul", "Div", "Sqrt"}),
        ("direct", {"Add", "Sub", "Mul", "MatMul", "Reshape", "Transpose"}),
        ("transposed_kernel", {"MatMul"}),
        ("matrix_transpose", {"Transpose"}),
        ("joint_grad", {"ConvDataGrad", "ConvWeightsGrad"}),
    ],
)
def test_rewrite_fields_are_declared_on_the_ops_that_had_them(field, names):
    """The rewrites keep applying to the ops they applied to before the fields existed."""
    have = {name for name, d in all_opdefs().items() if getattr(d, field) is not None}
    assert have == names


def test_foreach_forms():
    have = {name for name, d in all_opdefs().items() if d.foreach is not None}
    assert {"Add", "Sub", "Mul", "Div", "Sqrt", "Neg", "ScaledAdd", "ScaledAddLhsInplace"} <= have
    assert {"Accumulate", "AccumulatorScale", "CopyVarUpdate", "LerpInplace"} <= have
    assert {"AddcmulInplace", "AddcdivInplace", "FusedSGD"} <= have
    # only ops that may write into a dead input choose a group mode other than "fresh"
    writes = {name for name in have if all_opdefs()[name].foreach.targets is not None}
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
