"""``popxl_fx.phase(module)`` marks and ``trainer.report()`` of a phased program.

Marks: ``Options(phased_execution="marked")`` builds the same program as the list of the
marked modules' names, so its losses and weights equal the listed program's and the plain
program's bit for bit (the seed MLP, Adam, 3 steps; measured worst difference 0).

Report: the `PhasedReport`'s rows are computed from the Ir's ops (transfer bytes from the
RemoteLoad/RemoteStore tensors) and the plan's liveness; they are checked against the
simulator's own totals, computed independently: the rows' Streaming Memory bytes add up to the
step's ``remote_bytes_loaded`` / ``remote_bytes_stored`` exactly, the largest row peak is the
plan's peak, and the transfer share is the plan's remote cycles over its total.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx.auto import candidates
from popxl_fx.phase_report import PhasedReport
from popxl_fx.phases import PhaseError

BATCH, STEPS = 8, 3


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
        nn.Linear(64, 10),
    )  # fmt: skip


def _data() -> list:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
        for _ in range(STEPS)
    ]


def _train(model: nn.Module, **options):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-6)
    opts = popxl_fx.Options(device="cpu", **options)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, opts)
    losses = torch.stack([trainer(x, y) for x, y in _data()])
    return trainer, losses, model.state_dict()


def _marked_mlp() -> nn.Sequential:
    model = _mlp()
    for i in (1, 3, 5):
        popxl_fx.phase(model[i])
    return model


def test_marked_phases_equal_the_listed_and_the_plain_program_bit_for_bit():
    _, marked_losses, marked = _train(_marked_mlp(), phased_execution="marked")
    _, listed_losses, listed = _train(_mlp(), phased_execution=("1", "3", "5"))
    _, plain_losses, plain = _train(_marked_mlp())  # marks alone change nothing
    assert torch.equal(marked_losses, listed_losses) and torch.equal(marked_losses, plain_losses)
    for k in plain:
        assert torch.equal(marked[k], plain[k]) and torch.equal(listed[k], plain[k]), k


def test_phase_returns_the_module_and_deepcopy_keeps_the_mark():
    layer = nn.Linear(4, 4)
    assert popxl_fx.phase(layer) is layer
    model = nn.Sequential(layer, nn.ReLU())
    assert popxl_fx.phases.marked(copy.deepcopy(model)) == ["0"]


def test_memory_auto_tries_the_marked_phases_first():
    assert candidates(_marked_mlp(), popxl_fx.Options(), 8)[0] == {"phased_execution": "marked"}
    assert {"phased_execution": "marked"} not in candidates(_mlp(), popxl_fx.Options(), 8)


def test_marked_without_marks_says_how_to_mark():
    with pytest.raises(PhaseError, match=r"popxl_fx\.phase\(module\)"):
        _train(_mlp(), phased_execution="marked")


def test_nested_marks_are_refused():
    model = _mlp()
    wrapped = nn.Sequential(popxl_fx.phase(model), popxl_fx.phase(nn.Identity()))
    popxl_fx.phase(model[1])
    with pytest.raises(PhaseError, match=r"'0\.1' is inside '0' \(both marked"):
        _train(wrapped, phased_execution="marked")


def test_phase_of_a_non_module_is_a_type_error():
    with pytest.raises(TypeError, match="expects an nn.Module"):
        popxl_fx.phase(torch.zeros(3))


@pytest.fixture(scope="module")
def reports():
    twin = _mlp()
    phased, _, _ = _train(_mlp(), phased_execution="children")
    plain, _, _ = _train(twin)
    return phased.report(), plain.report()


def test_phased_report_rows_add_up_to_the_simulators_totals(reports):
    report, _ = reports
    assert isinstance(report, PhasedReport)
    totals = report.totals()
    assert [r.label for r in report.rows] == ["0", "1", "2", "3", "4", "5", "glue after 5"]
    assert sum(r.sm_loaded for r in report.rows) == totals["remote_bytes_loaded"] > 0
    assert sum(r.sm_stored for r in report.rows) == totals["remote_bytes_stored"] > 0
    assert max(r.peak for r in report.rows) == max(totals["peak_bytes_per_ipu"])
    # a phase without parameters moves nothing; one with parameters loads them twice
    by = {r.label: r for r in report.rows}
    assert by["0"].sm_loaded == by["2"].sm_loaded == 0
    weight = (784 * 64 + 64) * 4
    # stored: weights, exp_avg, exp_avg_sq and 2 float32 step counts (weight's, bias's);
    # loaded: the weights once more (forward, then backward)
    assert by["1"].sm_stored == 3 * weight + 2 * 4
    assert by["1"].sm_loaded == 4 * weight + 2 * 4
    cycles = report.plan.work.cycles
    assert report.transfer_share() == cycles.remote / cycles.total > 0
    # the transfer ops' cycles: their remote part plus their syncs
    assert cycles.remote <= sum(r.remote_cycles for r in report.rows) < cycles.total


def test_phased_report_text_and_diff_against_the_plain_compile(reports):
    report, plain = reports
    text = report.summary()
    assert "Phased execution: 3 phases" not in text and "6 phases and 1 glue" in text
    assert "remote transfers" in text and "<- peak" in text
    diff = plain.diff(report, ("plain", "phased"))
    assert diff["variable_bytes"][1] == 0 < diff["variable_bytes"][0]
    assert diff["remote_bytes_loaded"] == (0, report.totals()["remote_bytes_loaded"])
    back = report.diff(plain, ("phased", "plain"))
    assert back["variable_bytes"] == (0, diff["variable_bytes"][0])
    data = json.loads(json.dumps(report.to_dict()))
    assert len(data["phases"]) == len(report.rows) and 0 < data["transfer_share"] < 1
