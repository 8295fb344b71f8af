"""POPXL_SIM_REPORT: a Session writes its memory and time estimates without being asked."""

import sys

import popxl_core as popxl
from popxl_core import ops


def _session():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        w = popxl.variable([1.0, 2.0], name="w")
        ops.var_updates.accumulate_(w, popxl.constant([1.0, 1.0]))
    return popxl.Session(ir, "ipu_hw")


def test_report_is_appended_to_the_folder_with_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("POPXL_SIM_REPORT", str(tmp_path / "reports"))
    monkeypatch.setattr(sys, "argv", ["/x/inference.py", "--tensor_parallel", "2"])
    first, _ = _session(), _session()
    text = (tmp_path / "reports" / "sim_report.txt").read_text()
    header = "== Session (inference.py --tensor_parallel 2) on ipu_hw: 2 replica(s) x 1 IPU(s)"
    assert text.count(header) == 2
    assert first.report.summary() in text


def test_dash_writes_to_stderr_and_unset_writes_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POPXL_SIM_REPORT", raising=False)
    _session()
    assert capsys.readouterr().err == "" and not list(tmp_path.iterdir())
    monkeypatch.setenv("POPXL_SIM_REPORT", "-")
    session = _session()
    assert session.report.summary() in capsys.readouterr().err
