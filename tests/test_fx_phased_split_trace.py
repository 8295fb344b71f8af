"""Phases of the repeated blocks (``phased_execution="blocks"``) split the trace that found
the blocks (`phases.phase_plan` keeps `outline.plan_outline`'s leaf trace), not a second
trace of the model with the same leaves: the split and its pieces are those a trace of their
own gives (the same code, node for node), and the phased program's numbers are checked bit
for bit against the plain one's in test_fx_phased.py."""

from __future__ import annotations

import pytest
import torch

import popxl_fx
import popxl_fx.phased
import popxl_fx.phases
import popxl_fx.trace_patch
from examples.fx_phased import Decoder


def _build(phased: str) -> tuple[list, int, int]:
    """A small decoder's phased trainer built on one batch: (every split made, as
    ``(split, the same split traced anew)``, the number of leaf traces `phases` made, the
    number of times the traces' patches of nn.Module were taken off: `trace_patch`)."""
    torch.manual_seed(0)
    model = Decoder(32, 8, 16, 2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = popxl_fx.Options(device="cpu", phased_execution=phased)
    splits, traces, unpatched = [], [], []
    split, trace = popxl_fx.phased.split_pieces, popxl_fx.phases.trace_module
    uninstall = popxl_fx.trace_patch._uninstall

    def compared(root, examples, paths, *args):
        made = split(root, examples, paths, *args)
        splits.append((made, split(root, examples, paths, *args[:2])))  # traced anew
        return made

    def counted(*args):
        traces.append(1)
        return trace(*args)

    g = torch.Generator().manual_seed(1)
    batch = [torch.randint(0, 32, (4, 8), generator=g) for _ in range(2)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(popxl_fx.phased, "split_pieces", compared)
        patch.setattr(popxl_fx.phases, "trace_module", counted)
        patch.setattr(popxl_fx.trace_patch, "_uninstall", lambda: unpatched.append(uninstall()))
        popxl_fx.training_model(model, opt, options=options).build(*batch)
    return splits, len(traces) - len(splits), len(unpatched)  # less the comparison's traces


def _codes(split) -> list[str]:
    gm, pieces = split
    return [gm.code, *(f"{p.label}\n{p.gm.code}" for p in pieces)]


def test_blocks_phases_split_the_trace_that_found_the_blocks():
    splits, traces, _ = _build("blocks")
    assert len(splits) == 1 and traces == 0
    made, anew = splits[0]
    assert _codes(made) == _codes(anew)
    assert [p.label for p in made[1] if p.phase] == ["blocks.0", "blocks.1"]


def test_children_phases_trace_their_split():
    splits, traces, _ = _build("children")
    assert len(splits) == 1 and traces == 1
    assert _codes(splits[0][0]) == _codes(splits[0][1])


def test_a_phased_build_patches_nn_module_once_for_its_split_and_once_for_its_pieces():
    """Each trace outside a `trace_patch.kept_patches` window patches nn.Module's call and
    getattr slots and takes them off again (~1.4 ms a trace): the phased build's traces
    (the blocks' plan, the split, each of its 4 pieces) share two windows (5 before)."""
    _, _, unpatched = _build("blocks")
    assert unpatched == 2
