"""Max pooling through the channels-last kernel (popxl_core/ops/_pool_layout.py) gives the
bits of torch's kernel on the NCHW input: values (NaN payloads and signed zeros included) and
indices, tolerance 0, over random shapes, windows, strides, pads, dilations and ceil_mode."""

from __future__ import annotations

import random

import pytest
import torch

from popxl_core.ops import _pool_layout as layout
from popxl_core.sim.bits import same_bits

_aten = torch.ops.aten
_SPECIAL = [float("nan"), float("-inf"), float("inf"), -0.0, 0.0]


def _input(rng: random.Random, shape, dtype, kind: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    if kind == "randn":
        return torch.randn(shape, generator=gen, dtype=dtype)
    x = torch.randint(-2, 2, shape, generator=gen).to(dtype)  # many ties
    if kind == "special":
        where = torch.rand(shape, generator=gen) < 0.3
        pick = torch.randint(0, len(_SPECIAL), (int(where.sum()),), generator=gen)
        x[where] = torch.tensor(_SPECIAL, dtype=dtype)[pick]
    return x


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    while count:
        n, c = rng.choice([1, 2, 3]), rng.choice([8, 16, 17, 33, 64])
        h, w = rng.randint(1, 12), rng.randint(1, 12)
        k = (rng.randint(1, 4), rng.randint(1, 4))
        d = (rng.randint(1, 2), rng.randint(1, 2))
        p = (rng.randint(0, k[0] // 2), rng.randint(0, k[1] // 2))
        if any((k[i] - 1) * d[i] + 1 > (h, w)[i] + 2 * p[i] for i in range(2)):
            continue
        s = (rng.randint(1, 3), rng.randint(1, 3))
        dtype = rng.choice([torch.float32, torch.float64])
        x = _input(rng, (n, c, h, w), dtype, rng.choice(["randn", "ties", "special"]))
        count -= 1
        yield x, (list(k), list(s), list(p), list(d), rng.random() < 0.5)


@pytest.fixture
def always_channels_last(monkeypatch):
    """Small cases take the channels-last path too (the thresholds are about speed)."""
    monkeypatch.setattr(layout, "_MIN_NUMEL", 1)


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked", "contiguous"])
def test_channels_last_pooling_has_torchs_bits(always_channels_last, monkeypatch, blocked):
    # the two ways of transposing the input: image by image, or torch's contiguous()
    monkeypatch.setattr(layout, "_BLOCKED_PLANE", (1, 2**30) if blocked else (0, 0))
    for x, args in _cases(seed=1 + blocked, count=150):
        want_y, want_i = _aten.max_pool2d_with_indices(x, *args)
        y, i = layout.max_pool2d_with_indices(x, *args)
        assert y.is_contiguous() and i.is_contiguous()
        assert same_bits(y, want_y) and torch.equal(i, want_i), (tuple(x.shape), args)
        assert same_bits(layout.max_pool2d(x, *args), _aten.max_pool2d(x, *args))


def test_resnet_stem_pool_takes_the_channels_last_path():
    x = torch.randn(4, 64, 32, 32)
    assert layout._pays(x)
    args = ([3, 3], [2, 2], [1, 1], [1, 1], False)
    want = _aten.max_pool2d_with_indices(x, *args)
    got = layout.max_pool2d_with_indices(x, *args)
    assert same_bits(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(16, 3, 32, 32),  # too few channels for the vector lanes
        torch.randn(1, 16, 4, 4),  # too small to pay for the transposes
        torch.randn(2, 64, 16, 16).to(torch.bfloat16),
        torch.randn(2, 64, 16, 16).contiguous(memory_format=torch.channels_last),
        torch.randn(2, 64, 16, 16).transpose(2, 3),
    ],
    ids=["channels", "small", "bfloat16", "channels_last", "strided"],
)
def test_other_inputs_run_torchs_kernel_as_they_are(x):
    assert not layout._pays(x)
    args = ([2, 2], [2, 2], [0, 0], [1, 1], False)
    want = _aten.max_pool2d_with_indices(x, *args)
    got = layout.max_pool2d_with_indices(x, *args)
    assert same_bits(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[0].stride() == want[0].stride()
