"""The out-of-memory error of a traced model (`popxl_fx.oom`): per-module table with torch
names and the remedies as exact Options, ranked by estimated bytes saved.

The GPT decoder of tests/fx_zoo.py is planned on an "ipu_hw" of 2 tiles (1.2 MiB), where it
does not fit; the error text is checked for its table (categories, torch module names from
the forward and the backward; the repeated blocks as one row first, then the largest
modules) and its ranked remedies. The table's bytes are
checked against the plan: the categories of all rows add up to the variables plus the
not-always-live peak (exactly: every byte is attributed to one module and category).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import popxl_fx
from popxl_core.sim.machine import machine_for
from popxl_core.sim.plan import OutOfMemoryError, build_plan
from popxl_fx.oom import CATEGORIES, module_table
from popxl_fx.program import _model_oom_message
from tests.fx_zoo import GPT


def _oom(phased):
    torch.manual_seed(0)
    model = GPT()
    options = popxl_fx.Options(device="cpu", phased_execution=phased)
    trainer = popxl_fx.training_model(model, torch.optim.Adam(model.parameters()), None, options)
    x = torch.randint(0, 64, (8, 16))
    trainer(x, x)
    tiny = dataclasses.replace(machine_for("ipu_hw"), tiles_per_ipu=2)
    with pytest.raises(OutOfMemoryError) as info:
        build_plan(trainer.ir, tiny)
    return model, options.replace(device="ipu_hw"), info.value


@pytest.mark.parametrize("phased", [False, "blocks"])
def test_table_accounts_for_every_byte_by_module(phased):
    model, _, err = _oom(phased)
    names = {n for n, _ in model.named_parameters()}
    rows = module_table(err.plan, 0, "", names)
    m = err.plan.memory[0]
    total = sum(getattr(r, c) for r in rows for c in CATEGORIES)
    assert total == m.variables + m.activations
    assert [r.total for r in rows] == sorted((r.total for r in rows), reverse=True)
    by_module = {r.module: r for r in rows}
    assert any(r.gradients for r in rows)  # backward ops name their torch module
    if phased is False:
        assert by_module["blocks.0.qkv"].weights == 32 * 96 * 4 + 96 * 4
        assert by_module["blocks.0.qkv"].optimizer == 2 * (32 * 96 * 4 + 96 * 4) + 2 * 4


def test_message_has_the_table_and_ranked_options():
    model, options, err = _oom(False)
    text = _model_oom_message(err, options, "", model)
    assert "does not fit one IPU with device='ipu_hw'" in text
    assert re.search(r"module\s+weights\s+gradients\s+optimizer\s+activations\s+total", text)
    assert "blocks.0-3 (4 x DecoderBlock)" in text  # the repeated blocks: one row
    assert "blocks.1.mlp.0" not in text and "head" in text
    tried = re.findall(r"    (Options\(.*?\)).*: about ([\d.]+) (KiB|MiB|B)\n", text)
    assert [t[0] for t in tried][:1] and "Options(phased_execution='blocks')" in text
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    saved = [float(n) * scale[u] for _, n, u in tried]
    assert saved == sorted(saved, reverse=True)
