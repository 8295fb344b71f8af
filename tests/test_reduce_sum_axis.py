"""ReduceSum over one axis takes a direct ``torch.sum(dim=)``; it must give the bits of the
general path (permute the axis last, flatten, sum the last axis) that every other reduction
uses, including for strided and integer inputs."""

from __future__ import annotations

import pytest
import torch

from popxl_core.ops.reduce import _sum_any, _sum_kernel


@pytest.mark.parametrize(
    "shape,axis",
    [
        ((8, 512), 0),
        ((256, 512), 0),
        ((7, 13), 1),
        ((3, 4, 5), 1),
        ((16, 64, 8, 8), 2),
        ((4096, 10), 0),
        ((2, 1000), 1),
    ],
)
@pytest.mark.parametrize("keepdims", [False, True])
def test_one_axis_sum_equals_the_general_path_bitwise(shape, axis, keepdims):
    for seed in range(3):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        for t in (x, x.transpose(0, -1).contiguous().transpose(0, -1)):  # strided too
            want = _sum_any(t, (axis,), keepdims)
            got = _sum_kernel(t, (axis,), keepdims)
            assert got.dtype == want.dtype and torch.equal(got, want)


def test_integer_sum_keeps_its_dtype():
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    got = _sum_kernel(x, (0,), False)
    assert got.dtype == torch.int32 and torch.equal(got, _sum_any(x, (0,), False))
