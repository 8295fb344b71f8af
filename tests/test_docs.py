"""The README and the user guide in docs/ stay true: their examples run, their links resolve.

Every ```python block of a page runs, in order, in one namespace per page (a later block may use
an earlier one's names), in a temporary working folder (an example may save a file). The blocks
assert what they claim (bit for bit with eager, the same bits for one row as for twelve), so a
change that makes a page wrong fails here. Relative links and the repository files a page names
(`popxl_fx/oom.py`, `examples/fx_mnist.py`, ...) must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a path in backticks under one of the repository's own folders, e.g. `popxl_core/sim/fuse.py`
_PATH = re.compile(
    r"`((?:popxl_core|addons|popxl_fx|examples|tests|benchmarks|tools|docs)/[\w./-]+)`"
)


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def python_blocks(page: Path) -> list[str]:
    """The page's ```python blocks, in order."""
    return _BLOCK.findall(page.read_text())


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    if not blocks:
        pytest.skip(f"{_page_id(page)} has no python block")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for i, block in enumerate(blocks):
        code = compile(block, f"{_page_id(page)} python block {i + 1}", "exec")
        exec(code, namespace)  # - the page's own example


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_links_and_named_files_exist(page):
    text = page.read_text()
    missing = []
    for target in _LINK.findall(text):
        if "://" not in target and not (page.parent / target).exists():
            missing.append(f"link {target}")
    for path in _PATH.findall(text):
        path = path.rstrip(".")
        if "*" not in path and not (ROOT / path).exists():
            missing.append(f"file {path}")
    assert not missing, f"{_page_id(page)} names what does not exist: {missing}"


def test_readme_commands_install_and_run_the_example_and_the_tests():
    """The README's two first commands: the one CI also runs (.ci/run) and the example's."""
    commands = re.findall(r"^```sh\n(.*?)\n```$", (ROOT / "README.md").read_text(), re.M | re.S)
    example, tests = commands[:2]
    assert example.endswith(".venv/bin/python examples/fx_mnist.py"), example
    assert tests.endswith(".venv/bin/python -m pytest -q"), tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test,plot]' -c constraints.txt" in tests
    assert ".venv/bin/pip install -e '.[test,plot]' -c constraints.txt" in ci
    assert "\n.venv/bin/python -m pytest -q\n" in ci
    for command in (example, tests):
        assert "apt-get install -y dataset-fashion-mnist python3-venv" in command
