"""Shape and indexing lowerings against torch. They move values, so forward outputs are
exact (atol 0); gradients that sum several copies (expand, repeat, gather with repeated
indices) are compared at rtol 1e-6 / atol 1e-6."""

import pytest
import torch

from .fx_cases import Fn, randn
from .fx_harness import check_lowering

CASES = {
    "permute": lambda x: x.permute(2, 0, 1, 3),
    "permute_tuple": lambda x: torch.permute(x, (3, 2, 1, 0)),
    "transpose": lambda x: x.transpose(1, -1),
    "swapaxes": lambda x: torch.swapaxes(x, 0, 2),
    "t_of_2d": lambda x: x.flatten(1).t(),
    "movedim": lambda x: torch.movedim(x, (0, 1), (3, 0)),
    "view_minus1": lambda x: x.view(2, -1, 5),
    "reshape": lambda x: x.reshape((6, 20)),
    "flatten": lambda x: torch.flatten(x, 1, 2),
    "unflatten": lambda x: x.unflatten(3, (5, 1)),
    "contiguous": lambda x: x.transpose(0, 1).contiguous(),
    "squeeze_noop_dim": lambda x: x[:, :1].squeeze(1).squeeze(0),
    "squeeze_all": lambda x: x[:1, :, :1].squeeze(),
    "unsqueeze": lambda x: x.unsqueeze(-1).unsqueeze(0),
    "expand": lambda x: x[:, :1].expand(-1, 3, 4, 5),
    "expand_new_dims": lambda x: x[0, 0].expand(2, 3, 4, 5),
    "expand_as": lambda x: x[:1].expand_as(x),
    "repeat": lambda x: x.repeat(1, 2, 1, 3),
    "repeat_more_dims": lambda x: x[0].repeat(2, 1, 1, 2),
    "tile": lambda x: torch.tile(x, (2,)),
    "cat": lambda x: torch.cat([x, x * 2, x[:, :1]], dim=1),
    "stack": lambda x: torch.stack((x, -x), -1),
    "split_size": lambda x: torch.split(x, 2, dim=2)[1] * 1.0,
    "split_sections": lambda x: x.split([1, 2], 1)[1],
    "chunk_uneven": lambda x: x.chunk(3, -1)[2],
    "chunk_all": lambda x: torch.cat(torch.chunk(x, 2, 2), 0),
    "unbind": lambda x: x.unbind(1)[2],
    "narrow": lambda x: x.narrow(3, 1, 3),
    "select": lambda x: x.select(1, -1),
    "flip": lambda x: x.flip(0, 3),
    "roll": lambda x: torch.roll(x, (1, -2), (1, 3)),
    "roll_flat": lambda x: torch.roll(x, 7),
    "getitem_basic": lambda x: x[1, :, ::2, None, -3:],
    "getitem_ellipsis": lambda x: x[..., 0],
    "getitem_step_none": lambda x: x[None, :, 1:3, ..., ::3],
    "getitem_list": lambda x: x[:, [2, 0, 2]],
}


# index tensors are inputs (run-time indices); negative ones count from the end, as in torch
INDEXED = {
    "getitem_tensor_axis2": (lambda x, i: x[:, :, i], [[2, 0], [1, -1]]),
    "getitem_two_adjacent": (lambda x, i: x[:, i, i[0]], [[2, 0], [1, -1]]),
    "getitem_two_separated": (lambda x, i: x[i[0], :, i[1]], [[1, 0], [1, -1]]),
    "getitem_tensor_then_slice": (lambda x, i: x[i, 1:], [[1, 0], [1, -1]]),
    "index_select": (lambda x, i: torch.index_select(x, 3, i), [4, 0, 0]),
    "gather": (lambda x, i: torch.gather(x, 1, i.expand(2, 2, 4, 5)), [[[[0, 2, 1, 0, 2]]]]),
}


@pytest.mark.parametrize("name", sorted(INDEXED))
def test_indexing_with_tensor(name):
    fn, index = INDEXED[name]
    check_lowering(
        Fn(fn, 2),
        randn(2, 3, 4, 5),
        torch.tensor(index),
        rtol=0,
        atol=0,
        grad_rtol=1e-6,
        grad_atol=1e-6,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape_op(name):
    check_lowering(
        Fn(CASES[name]), randn(2, 3, 4, 5), rtol=0, atol=0, grad_rtol=1e-6, grad_atol=1e-6
    )


def test_getitem_on_a_tuple_of_outputs():
    check_lowering(Fn(lambda x: x.split(2, 1)[1]), randn(3, 4), rtol=0, atol=0)
