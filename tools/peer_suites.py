"""Run Graphcore's whole PopXL and popxl.addons test suites on this project; report per file.

The conformance runner (``../shared/conformance/run``) runs a chosen selection of Graphcore's
tests; this tool runs all of them (popart's ``tests/integration/popxl`` and
``tests/unittests/python/popxl``, popxl-addons' ``tests``), to show where PopXL accepts a program
that this project refuses. Nothing of Graphcore's is copied into the project: the files are
exported at run time from git mirrors into a temporary folder, with a conftest that resolves
``popxl`` / ``popxl_addons`` to this project (``popxl_core.compat.install()``).

    python tools/peer_suites.py --mirror ../.mirror [--exclude-list FILES.txt] [-k EXPR]
           [--only SUBSTRING ...] [--timeout SECONDS] [--junit OUT.xml]

``--mirror`` is a folder holding ``graphcore+popart/repo`` and ``graphcore+popxl-addons/repo``
(bare git directories or checkouts). ``--exclude-list`` takes the conformance runner's
``files.txt`` to report only the files beyond that selection. Every test gets ``--timeout``
seconds (SIGALRM in the test process), so one hung test cannot stall the report.
Prints one line per file (passed / failed / errors / skipped) and the totals.
``PYTHONPATH`` is kept, after the project's root: a package a test needs from outside the
project (an overlay made with ``pip install --target``) goes there, as
``tools/peer_suites_left_out.txt`` lists for each such test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple

__all__ = ["SUITES", "export_suites", "run_pytest", "per_file", "main"]

# (mirror folder, export name, folders of the suite inside the repository). Each folder runs in
# a pytest process of its own: popart's two suites both have a top-level `utils.py` and
# same-named test files, which one process would import as one module.
SUITES: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    (
        "graphcore+popart",
        "peer_popart",
        ("tests/integration/popxl", "tests/unittests/python/popxl"),
    ),
    ("graphcore+popxl-addons", "peer_addons", ("tests",)),
)
# files the suites import from outside their folders (popxl_test_device_helpers -> test_util)
_SUPPORT = {"graphcore+popart": ("tests/integration/test_util.py",)}

# The suites' own conftests only seed numpy; this one also makes `popxl` this project and gives
# every test a time limit (a hung test otherwise hides every result after it). TEST_TARGET is
# what popart's ctest sets for a test's variant (add_popart_py_unit_test(... VARIANTS
# IpuModel2) in tests/integration/popxl/CMakeLists.txt); `popxl_test_device_helpers` reads it
# to choose the Session's device string, and every device string is the simulator here.
_CONFTEST = """\
import os
import random
import signal
import numpy as np
import pytest
import popxl_core.compat
popxl_core.compat.install()
os.environ.setdefault("TEST_TARGET", "IpuModel2")
_LIMIT = int({timeout})


def _expired(signum, frame):
    raise TimeoutError(f"test ran past {{_LIMIT}} s (tools/peer_suites.py --timeout)")


@pytest.fixture(autouse=True)
def _seeds_and_limit():
    np.random.seed(0)
    random.seed(0)
    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(_LIMIT)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
"""


def _gitdir(repo: str) -> str:
    return os.path.join(repo, ".git") if os.path.isdir(os.path.join(repo, ".git")) else repo


def _test_files(gitdir: str, folders: Iterable[str]) -> List[str]:
    out = subprocess.run(
        ["git", "--git-dir", gitdir, "ls-tree", "-r", "--name-only", "HEAD", *folders],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [p for p in out if p.endswith(".py")]


def export_suites(mirror: str, work: str, timeout: int) -> Dict[str, List[str]]:
    """Export the suites into ``work``; returns export name -> the repository's test paths."""
    exported: Dict[str, List[str]] = {}
    for folder, name, roots in SUITES:
        gitdir = _gitdir(os.path.join(mirror, folder, "repo"))
        if not os.path.isdir(gitdir):
            raise SystemExit(f"peer_suites: no git mirror at {gitdir} (pass --mirror)")
        dest = os.path.join(work, name)
        os.makedirs(dest, exist_ok=True)
        archive = subprocess.run(
            ["git", "--git-dir", gitdir, "archive", "HEAD", *roots, *_SUPPORT.get(folder, ())],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
        files = _test_files(gitdir, roots)
        for root in roots:
            with open(os.path.join(dest, root, "conftest.py"), "w") as f:
                f.write(_CONFTEST.format(timeout=timeout))
        exported[name] = [p for p in files if os.path.basename(p).startswith("test_")]
    return exported


def _excluded(path: Optional[str]) -> Dict[str, set]:
    """Repository name ('popart' / 'popxl-addons') -> paths listed in the conformance files.txt."""
    listed: Dict[str, set] = defaultdict(set)
    if path:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and not line.startswith("#"):
                    listed[parts[0]].add(parts[1])
    return listed


def run_pytest(work: str, targets: List[str], junit: str, extra: List[str], python: str) -> int:
    """One pytest process over ``targets`` (paths relative to ``work``); returns its exit code."""
    env = dict(os.environ)
    root = os.getcwd()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["--continue-on-collection-errors"]
    cmd += [f"--rootdir={work}", f"--junitxml={junit}", "-rfE", "--tb=line", *extra, *targets]
    return subprocess.run(cmd, cwd=work, env=env).returncode


def _file_of(case: ET.Element) -> str:
    """The test file of a junit testcase (classname 'peer_x.tests....test_y[.Class]')."""
    # a collection error has no classname; its name is the module's dotted path
    parts = (case.get("classname") or case.get("name", "")).split(".")
    for i in range(len(parts), 0, -1):
        if parts[i - 1].startswith("test_"):
            return "/".join(parts[:i]) + ".py"
    return case.get("file") or "/".join(parts)


def _why(case: ET.Element) -> str:
    """The last 'E   ...' line of a failure (the exception), for the report."""
    text = "".join(child.text or child.get("message", "") for child in case)
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    return (lines[-1] if lines else text.strip().splitlines()[-1] if text.strip() else "")[:140]


def per_file(junit: str) -> Tuple[Dict[str, Dict[str, int]], Dict[str, str]]:
    """File -> {'passed', 'failed', 'error', 'skipped'} counts read from a junit xml report,
    and file -> the first failure's exception line."""
    counts: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    why: Dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        kind = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        kind = {"failure": "failed"}.get(kind, kind)
        counts[_file_of(case)][kind] += 1
        if kind in ("error", "failed"):
            why.setdefault(_file_of(case), _why(case))
    return counts, why


def _report(counts: Dict[str, Dict[str, int]], why: Dict[str, str], files: List[str]) -> None:
    """Print one line per file and the totals (a file passes when nothing in it fails)."""
    total = defaultdict(int)
    passing = 0
    for path in files:
        c = counts.get(path, {})
        bad = c.get("failed", 0) + c.get("error", 0)
        passing += bad == 0 and c.get("passed", 0) > 0
        for k in ("passed", "failed", "error", "skipped"):
            total[k] += c.get(k, 0)
        state = "FAIL" if bad else ("pass" if c.get("passed", 0) else "none")
        print(
            f"{state:4} {path}: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
            f"{c.get('error', 0)} errors, {c.get('skipped', 0)} skipped"
            + (f"  [{why[path]}]" if path in why else "")
        )
    print(
        f"peer suites: {passing} of {len(files)} files pass; tests: {total['passed']} passed, "
        f"{total['failed']} failed, {total['error']} errors, {total['skipped']} skipped"
    )


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--mirror", required=True, help="folder with graphcore+popart/repo etc.")
    ap.add_argument("--exclude-list", help="conformance files.txt: leave its files out")
    ap.add_argument("--only", nargs="*", default=[], help="run files whose path has one of these")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("--junit", help="keep the junit xml reports as JUNIT.<i>.xml")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("-k", dest="keyword", help="pytest -k expression")
    args = ap.parse_args(argv)
    excluded = _excluded(args.exclude_list)
    repo_of = {"peer_popart": "popart", "peer_addons": "popxl-addons"}
    with tempfile.TemporaryDirectory() as work:
        exported = export_suites(os.path.abspath(args.mirror), work, args.timeout)
        files = [
            f"{name}/{p}"
            for name, paths in exported.items()
            for p in paths
            if p not in excluded[repo_of[name]]
            and (not args.only or any(s in p for s in args.only))
        ]
        extra = ["-k", args.keyword] if args.keyword else []
        counts, why = {}, {}
        for i, root in enumerate(_roots()):
            group = [f for f in files if f.startswith(root + "/")]
            if not group:
                continue
            junit = os.path.join(work, f"junit{i}.xml")
            rc = run_pytest(work, group, junit, extra, args.python)
            if not os.path.exists(junit):
                print(f"peer suites: pytest ended (exit {rc}) without a report for {root}")
                return 1
            if args.junit:
                shutil.copy(junit, f"{args.junit}.{i}.xml")
            c, w = per_file(junit)
            counts.update(c)
            why.update(w)
        _report(counts, why, files)
    return 0


def _roots() -> List[str]:
    return [f"{name}/{root}" for _, name, roots in SUITES for root in roots]


if __name__ == "__main__":
    sys.exit(main())
