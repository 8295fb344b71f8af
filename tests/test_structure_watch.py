"""`popxl_fx.structure_watch.StructureWatch`: the trainer's per-step structure key, answered
from the last walk when nothing changed. Each change a step must see (a replaced module or
parameter, a flipped requires_grad, ``p.data = ...`` with a new pointer, shape or dtype, a
new buffer, an optimizer param group or option) gives the same key as a full
`structure_key` walk, and an unchanged model gives back the last `Structure` object."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from popxl_fx.program import _modes
from popxl_fx.structure_watch import StructureWatch
from popxl_fx.torch_structure import structure_key


def _model():
    torch.manual_seed(0)
    shared = nn.Linear(4, 4)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), shared, nn.Sequential(shared))


def _flip_grad(m, o):
    m[0].weight.requires_grad_(False)


def _new_storage(m, o):
    m[0].bias.data = m[0].bias.data.clone()


def _same_storage_new_shape(m, o):
    m[0].weight.data = m[0].weight.data.view(2, 6)


def _same_storage_new_dtype(m, o):
    m[1].running_mean.data = m[1].running_mean.data.view(torch.int32)


def _replace_module(m, o):
    m[2] = nn.Linear(4, 4)


def _move_child(m, o):
    m[3] = nn.Sequential()
    m.add_module("4", m[2])


def _drop_bias(m, o):
    m[0].bias = None


def _new_buffer(m, o):
    m[0].register_buffer("extra", torch.zeros(2))


def _dict_write(m, o):
    m[1]._parameters["weight"] = nn.Parameter(torch.ones(4))


def _add_group(m, o):
    o.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})


def _group_option(m, o):
    o.param_groups[0]["momentum"] = 0.5


def _group_params(m, o):
    o.param_groups[0]["params"].pop()


CHANGES = [
    _flip_grad,
    _new_storage,
    _same_storage_new_shape,
    _same_storage_new_dtype,
    _replace_module,
    _move_child,
    _drop_bias,
    _new_buffer,
    _dict_write,
    _add_group,
    _group_option,
    _group_params,
]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__ for c in CHANGES])
def test_a_change_gives_the_full_walks_key(change):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = StructureWatch()
    before = watch.key(model, opt)
    assert watch.key(model, opt) is before  # unchanged: the last object, no walk
    with torch.no_grad():
        change(model, opt)
    after = watch.key(model, opt)
    full = structure_key(model, opt)
    assert after.key == full.key and after.pointers == full.pointers
    assert after != before or after.pointers != before.pointers
    assert watch.key(model, opt) is after  # and the new state is watched from here


def test_modes_follow_train_and_eval():
    model = _model()
    watch = StructureWatch()
    watch.key(model, None)
    assert watch.modes(model) == _modes(model)
    model[1].eval()
    watch.key(model, None)
    assert watch.modes(model) == _modes(model) and not all(watch.modes(model))
    assert watch.modes(_model()) is None  # another model: walked by the caller
