"""The packages import in one direction: popxl_fx -> addons -> popxl_core (DESIGN.md).

Checked on the source (every ``import`` and ``from ... import`` statement, including those inside
functions), so a late import cannot hide a reversed dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"popxl_core": {"addons", "popxl_fx"}, "addons": {"popxl_fx"}}


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    """Top-level package names that ``path`` imports, each with the line of its import."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(a.name.split(".")[0], node.lineno) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_the_layers_above_it(package):
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line in sorted(_imported_packages(path))
        if name in FORBIDDEN[package]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import popxl_fx.api\n")
    assert ("popxl_fx", 2) in _imported_packages(source)
