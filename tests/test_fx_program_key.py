"""`popxl_fx.program_key.same_key`: the one answer to "is this the same program?" that the
program cache, the trainer's repeat path and the structure watch use."""

import torch
from torch import nn

from popxl_fx.pipeline import Programs
from popxl_fx.program_key import same_key
from popxl_fx.torch_structure import structure_key


def test_the_very_object_is_the_same_key_even_when_it_is_unequal_to_itself():
    nan = float("nan")
    assert same_key(nan, nan) and not same_key(nan, float("nan"))


def test_equal_keys_and_unequal_keys():
    model = nn.Linear(2, 2)
    a, b = structure_key(model, None), structure_key(model, None)
    assert a is not b and same_key((("x", (2, 2)), a), (("x", (2, 2)), b))
    assert not same_key((("x", (2, 2)), a), (("x", (3, 2)), a))
    model.weight.requires_grad_(False)
    assert not same_key(a, structure_key(model, None))


def test_the_program_cache_keeps_the_active_program_for_the_same_key():
    programs: Programs[object] = Programs("test")
    built = []
    key = ("input", (torch.Size([2, 2]), torch.float32))
    first = programs.get(key, lambda: built.append(1) or object())
    same = ("input", (torch.Size([2, 2]), torch.float32))  # another, equal object
    assert programs.get(same, lambda: built.append(2) or object()) is first
    assert built == [1]
