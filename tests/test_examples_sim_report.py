"""examples/sim_report.py runs to the end and shows what outlining saves, as it claims."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sim_report_example(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        example = importlib.import_module("sim_report")
        example.main(["--out", str(tmp_path)])
    finally:
        sys.path.remove(str(ROOT / "examples"))
    out = capsys.readouterr().out
    assert "IPU memory (estimate, ipu_hw" in out and "program tree:" in out
    line = next(s for s in out.splitlines() if s.startswith("variable_bytes"))
    assert line.split()[1:] == ["3.56", "MiB", "3.56", "MiB", "same"]  # 3,729,448 B each
    code = next(s for s in out.splitlines() if s.startswith("code_bytes"))
    assert "(-26%)" in code
    losses = next(s for s in out.splitlines() if s.startswith("loss from the same"))
    inlined, outlined = (float(w.rstrip(",")) for w in losses.split()[-3::2])
    assert inlined == outlined  # the same kernels in the same order: bit-identical
    assert (tmp_path / "inlined.json").is_file() and (tmp_path / "outlined.json").is_file()


def test_report_overhead_benchmark_runs():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        bench = importlib.import_module("bench_report_overhead")
        times = bench.run(rounds=3, warmup=1)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert {k: len(v) for k, v in times.items()} == {"plain": 3, "report": 3}
