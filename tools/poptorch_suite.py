"""Run PopTorch's own Python tests, unchanged, against popxl_fx's PopTorch layer.

    python tools/poptorch_suite.py MIRROR [--files a_test.py,b_test.py] [--json OUT]
                                          [--overlay DIR] [--legacy-torch-load]
                                          [-- PYTEST ARGS]

MIRROR is a git directory of github.com/graphcore/poptorch (the `fetch` tool's bare mirror).
Its ``tests/*.py`` (and nothing else: no C++ tests, custom ops or ``tests/gnn``) are written to
a temporary folder, never into this repository; pytest runs there in this process after
`popxl_fx.compat.install()`, so ``import poptorch`` in their conftest, helpers and tests
resolves to ``popxl_fx.poptorch``. Prints passed / failed / skipped per file (and writes them
as JSON with ``--json``).

``--overlay DIR`` runs them under the pytest that PopTorch's requirements.txt pins (6.2.5; some
tests match its wording of ``pytest.raises`` messages): DIR is made by
``pip install --no-deps --target DIR pytest==6.2.5 pluggy==0.13.1 py attrs==21.4.0 iniconfig
toml``. It leads ``sys.path`` here and PYTHONPATH in the tests' subprocesses, and this
environment's pytest plugins (xdist, ...) are not loaded, as they need a newer pytest.

``--legacy-torch-load`` gives ``torch.load`` the default of the torch PopTorch pins (2.0.1:
``weights_only=False``; torch 2.6 made it True) through torch's own switch for it,
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, here and in the tests' subprocesses: a test that saves
and loads a whole module is refused by the installed torch itself, in eager too, without it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["extract", "left_out", "main", "legacy_torch_load", "pytest_from", "run"]

# What is left out, each with why: tools/poptorch_left_out/*.txt, lines "NODEID | WHY". A node
# id without "::" leaves a whole file out; one with it, the tests it prefixes (pytest --deselect).
LEFT_OUT_DIR = Path(__file__).resolve().parent / "poptorch_left_out"


def left_out(folder: Path = LEFT_OUT_DIR) -> dict[str, str]:
    """Every left-out node id (or file) with its reason, from the lists in ``folder``."""
    entries: dict[str, str] = {}
    for listing in sorted(folder.glob("*.txt")):
        for number, line in enumerate(listing.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            nodeid, bar, why = (part.strip() for part in line.partition("|"))
            if not bar or not nodeid or not why:
                raise ValueError(f"{listing.name}:{number}: expected 'NODEID | WHY', got {line!r}")
            entries[nodeid] = why
    return entries


def extract(mirror: str, dest: Path) -> list[str]:
    """Write the mirror's ``tests/*.py`` into ``dest``; returns the test files' names."""
    git = ["git", f"--git-dir={mirror}"]
    listing = subprocess.run(
        [*git, "ls-tree", "--name-only", "HEAD", "tests/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    names = []
    for path in listing:
        if not path.endswith(".py"):
            continue
        text = subprocess.run(
            [*git, "show", f"HEAD:{path}"], check=True, capture_output=True
        ).stdout
        (dest / Path(path).name).write_bytes(text)
        names.append(Path(path).name)
    # their conftest reads pytest.ini-free defaults; an empty ini keeps this repo's out
    (dest / "pytest.ini").write_text("[pytest]\n")
    return sorted(n for n in names if n.endswith("_test.py") or n.startswith("test_"))


class _Tally:
    """A pytest plugin counting each file's outcomes (a test counts once: its worst phase)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            if self.outcomes.get(report.nodeid) in ("failed",):
                return
            self.outcomes[report.nodeid] = report.outcome

    def pytest_deselected(self, items) -> None:
        for item in items:  # the tests left_out() names, counted as "left_out"
            self.outcomes[item.nodeid] = "left_out"

    def per_file(self) -> dict[str, dict[str, int]]:
        files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for nodeid, outcome in self.outcomes.items():
            files[nodeid.split("::")[0]][outcome] += 1
        return {f: dict(c) for f, c in sorted(files.items())}


def pytest_from(overlay: str = ""):
    """The ``pytest`` module to run with: the overlay's (first on ``sys.path``, and in the tests'
    subprocesses' PYTHONPATH, without autoloaded plugins) or else this environment's."""
    if overlay:
        if "pytest" in sys.modules or "_pytest" in sys.modules:
            raise RuntimeError("--overlay: pytest was imported before the overlay could lead")
        overlay = os.path.abspath(overlay)
        sys.path.insert(0, overlay)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join([overlay, *paths])
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import pytest

    return pytest


def legacy_torch_load() -> None:
    """``torch.load``'s default as PopTorch's pinned torch had it (`--legacy-torch-load`)."""
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # read by torch.load at each call


def run(mirror: str, files: list[str] | None, pytest_args: list[str], overlay: str = "") -> dict:
    pytest = pytest_from(overlay)

    from popxl_fx import compat

    with tempfile.TemporaryDirectory(prefix="poptorch_tests_") as tmp:
        dest = Path(tmp)
        available = extract(mirror, dest)
        skipped = left_out()
        chosen = files or [f for f in available if f not in skipped]
        deselect = [a for n in skipped if "::" in n for a in ("--deselect", n)]
        compat.install()
        saved_env = _children_get_the_hook()
        tally = _Tally()
        cwd = os.getcwd()
        os.chdir(dest)
        sys.path.insert(0, str(dest))
        try:
            args = [
                "-q",
                "-p",
                "no:cacheprovider",
                "-c",
                str(dest / "pytest.ini"),
                "--rootdir",
                str(dest),
                *(["-n", "0"] if "xdist" in pytest_plugins_loadable() else []),
                *deselect,
                *pytest_args,
                *chosen,
            ]
            code = pytest.main(args, plugins=[tally])
        finally:
            os.chdir(cwd)
            sys.path.remove(str(dest))
            os.environ.clear()
            os.environ.update(saved_env)
    return {"exit_code": int(code), "files": tally.per_file()}


def pytest_plugins_loadable() -> set[str]:
    """The autoloaded plugins' names that pytest would load here (none with autoload off)."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return set()
    from importlib.metadata import entry_points

    return {e.name for e in entry_points(group="pytest11")}


def _children_get_the_hook() -> dict[str, str]:
    """The tests' own Python subprocesses (``python3 -m pytest ...``, ``sys.executable -c``)
    import poptorch too: they get the hook, and ``python3`` is this Python (as in an activated
    venv). Returns the environment as it was."""
    from popxl_fx import compat

    saved = dict(os.environ)
    os.environ.update(compat.child_env())
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    return saved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mirror", help="git directory of graphcore/poptorch")
    parser.add_argument(
        "--files", default="", help="comma-separated test files (default: all but those left out)"
    )
    parser.add_argument("--json", default="", help="write the per-file counts here")
    parser.add_argument("--overlay", default="", help="a folder holding PopTorch's pinned pytest")
    parser.add_argument(
        "--legacy-torch-load", action="store_true", help="torch.load(weights_only=False) default"
    )
    args, rest = parser.parse_known_args(argv)  # the rest (after --) goes to pytest
    files = [f for f in args.files.split(",") if f] or None
    if args.legacy_torch_load:
        legacy_torch_load()
    result = run(args.mirror, files, [a for a in rest if a != "--"], args.overlay)
    total = collections.Counter()
    for name, counts in result["files"].items():
        total.update(counts)
        print(f"{name:40s} " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    print("total", dict(total))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
