"""examples/phased_mlp.py runs end to end: the phased MLP matches the unphased one loss by
loss and the example prints both programs' on-chip memory from their Session reports."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

from popxl_fx import data

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def fashion_mnist():
    try:
        data.prepare("fashion-mnist", download=False)
    except data.DataNotFoundError as err:
        pytest.skip(f"no Fashion-MNIST source on this machine: {err}")


def test_phased_mlp_matches_unphased_and_reports_memory(capsys):
    script = ROOT / "examples" / "phased_mlp.py"
    args = ["--steps", "4", "--hidden-layers", "3", "--width", "64"]
    with pytest.MonkeyPatch.context() as patch:  # as `python SCRIPT ARGS`, in this process
        patch.setattr(sys, "argv", [str(script), *args])
        patch.chdir(ROOT)
        patch.syspath_prepend(str(ROOT / "examples"))  # the script's folder, as python does
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert len(re.findall(r"^step +\d+ +loss phased", out, re.M)) == 4
    worst = float(re.search(r"worst loss difference: ([0-9.e+-]+)", out).group(1))
    assert worst < 1e-5, out  # losses ~2.3: float32 round-off of the re-ordered mean
    mem = re.findall(r"(phased|unphased) +variables +([0-9.]+) MiB", out)
    assert [m[0] for m in mem] == ["phased", "unphased"], out
