"""examples/addons_basics.py and examples/addons_custom_optimizer.py run to the end.

Each runs as ``python SCRIPT ARGS`` would, in this process (`runpy`: ``__main__``, its argv),
on a few batches of Fashion-MNIST, and must print what it claims: the outlined schedule calls one
shared subgraph, the optimiser module agrees with a numpy Adam, and training ends with a test
accuracy.
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import sys
from pathlib import Path

import pytest

from popxl_fx import data

ROOT = Path(__file__).resolve().parents[1]
BATCHES = "30"  # the custom optimiser's accuracy claim needs 30 Adam steps
BASICS_BATCHES = "10"  # addons_basics claims no accuracy: 10 batches run every part


@pytest.fixture(scope="module", autouse=True)
def fashion_mnist():
    try:
        data.prepare("fashion-mnist", download=False)
    except data.DataNotFoundError as err:
        pytest.skip(f"no Fashion-MNIST source on this machine: {err}")


def _run(script: str, *args: str) -> str:
    """``python examples/SCRIPT ARGS`` in this process; its stdout."""
    path = ROOT / "examples" / script
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [str(path), *args])
        patch.chdir(ROOT)
        patch.syspath_prepend(str(ROOT / "examples"))  # the script's folder, as python does
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(path), run_name="__main__")
    return out.getvalue()


def _accuracy(out: str) -> float:
    match = re.search(r"test accuracy \(fashion-mnist\): ([0-9.]+)%", out)
    assert match, out[-2000:]
    return float(match.group(1))


def test_addons_basics_runs_and_prints_accuracy():
    out = _run("addons_basics.py", "--max-batches", BASICS_BATCHES, "--outline")
    assert "one graph, two weight sets, two results differ: True" in out
    outlined = out.split("\noutlined:")[1]
    calls = re.findall(r"Call\.\d+\((Dense_subgraph\(\d+\))\)", outlined)
    assert len(calls) == 2 and calls[0] == calls[1], outlined  # two calls of one graph
    assert f"trained {BASICS_BATCHES} steps" in out
    assert 0.0 <= _accuracy(out) <= 100.0


def test_addons_custom_optimizer_matches_numpy_and_trains():
    out = _run("addons_custom_optimizer.py", "--max-batches", BATCHES)
    err = float(re.search(r"max \|simulator - numpy\| = (\S+)", out).group(1))
    assert err < 1e-6, out
    assert "8 parameters updated by 5 optimiser graphs" in out
    assert f"trained {BATCHES} steps" in out
    # 30 Adam steps at lr 1e-3 already beat chance (10%) by far on Fashion-MNIST.
    assert _accuracy(out) > 30.0
