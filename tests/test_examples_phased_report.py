"""examples/phased_report.py shows seed 003's phased program against the unphased MLP with
`diff`, as it claims: the variables leave the chip, the most on chip at once is the largest
phase's (hand-computed in tests/test_sim_golden_memory.py), and the liveness plots exist."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        module = importlib.import_module("phased_report")
    finally:
        sys.path.remove(str(ROOT / "examples"))
    if module.seed003.find() is None:
        pytest.skip("seed 003 is not in the seeds folder (set POPXL_FX_SEEDS_DIR)")
    return module


def test_phased_report_example(example, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    example.main(["--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "IPU memory (estimate, ipu_hw" in out and "remote variables on chip at most" in out
    row = next(s for s in out.splitlines() if s.startswith("variable_bytes"))
    assert row.split()[1:] == ["8.89", "MiB", "0", "B", "-8.89", "MiB", "(-100%)"]
    line = next(s for s in out.splitlines() if s.startswith("variables on chip at once"))
    # weights + Adam state (4 + 2 + 4 bytes per parameter) against fc1's backward phase
    assert "9,323,620 B unphased, 3,617,280 B phased" in line
    estimate = next(s for s in out.splitlines() if s.startswith("estimated time per training"))
    assert "of 64 samples" in estimate and "estimate" in estimate
    for name in ("phased.json", "unphased.json", "liveness_phased.png", "liveness_unphased.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "liveness_phased.png").read_bytes()[:4] == b"\x89PNG"
