"""Targets without a table entry lower through their core-ATen decomposition (forward and
gradient against eager torch); what cannot decompose raises an error in the user's terms."""

import pytest
import torch
import torchvision
from torch import nn

from popxl_fx.errors import UnsupportedError
from popxl_fx.lowering import LOWERINGS, lowers

from .fx_capture_util import eager_grads, run_module


def odd_activation(x):
    """Not in the table: decomposes to sigmoid, mul, pow, mean, exp, log1p, where, sub."""
    return x * torch.sigmoid(x) + x.pow(2).mean(-1, keepdim=True) - nn.functional.softplus(x)


torch.fx.wrap("odd_activation")


def gated(x):
    """Not in the table: softmax, select, unsqueeze, expand, any, logical_not, full_like."""
    first = x.select(1, 0).unsqueeze(1).expand(-1, x.shape[1])
    keep = torch.logical_not((x > 0.5).any(-1, keepdim=True))
    return torch.where(keep, torch.softmax(x, -1) * first, torch.full_like(x, 0.5)).squeeze()


torch.fx.wrap("gated")


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        return gated(self.fc(x))


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return odd_activation(self.fc(x))


class WithStochasticDepth(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        # torchvision marks stochastic_depth with torch.fx.wrap: a leaf call in the trace.
        return torchvision.ops.stochastic_depth(self.fc(x), 0.5, "row", self.training) + x


class Shuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.shuffle = nn.PixelShuffle(2)  # no table entry: an unusual leaf module
        self.cos = nn.CosineSimilarity(dim=-1)

    def forward(self, x):
        y = self.shuffle(self.fc(x))
        return self.cos(y, y * 2.0 + 1.0)


def _check(model, x, rtol, atol):
    torch.manual_seed(1)
    y = model(x)
    dy = torch.randn_like(y)
    ours = run_module(model, x, dy=dy)
    ref = eager_grads(model, [x], dy)
    torch.testing.assert_close(ours["out"][0], ref["out"], rtol=rtol, atol=atol)
    assert set(ours["grads"]) == set(ref["grads"])
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(ours["grads"][name], grad, rtol=rtol, atol=atol, msg=name)


def test_wrapped_function_decomposes_and_matches_eager():
    assert odd_activation not in LOWERINGS
    torch.manual_seed(0)
    # log1p is lowered as log(1 + x): a few ulps from torch's log1p, hence 1e-6.
    _check(Wrapped(), torch.randn(4, 6), rtol=1e-6, atol=1e-6)


def test_wrapped_function_with_shape_and_mask_ops_matches_eager():
    torch.manual_seed(3)
    model, x = Gated(), torch.randn(6, 5)
    keep = torch.logical_not((model.fc(x) > 0.5).any(-1))
    assert 0 < int(keep.sum()) < 6  # both branches of the where are taken
    _check(model, x, rtol=1e-6, atol=1e-6)


def test_torchvision_wrapped_stochastic_depth_in_eval_mode():
    torch.manual_seed(0)
    _check(WithStochasticDepth().eval(), torch.randn(4, 6), rtol=0, atol=0)


def test_unusual_leaf_modules_decompose_with_their_parameters():
    assert nn.PixelShuffle not in LOWERINGS and nn.CosineSimilarity not in LOWERINGS
    torch.manual_seed(0)
    _check(Shuffle(), torch.randn(2, 4, 3, 3), rtol=1e-6, atol=1e-6)


class FractionalPool(nn.Module):
    """A torch.nn leaf whose ATen op (aten.fractional_max_pool2d) has no lowering."""

    def __init__(self):
        super().__init__()
        self.head = nn.Sequential(nn.FractionalMaxPool2d(2, output_size=(2, 2)))

    def forward(self, x):
        return self.head[0](x)


def test_missing_aten_op_raises_with_module_path_source_and_missing_op():
    with pytest.raises(UnsupportedError) as info:
        run_module(FractionalPool(), torch.randn(1, 1, 5, 5))
    (issue,) = info.value.issues
    what = "torch.nn.FractionalMaxPool2d module"
    assert issue.kind == "unsupported module" and issue.what == what
    assert issue.module_path == "head.0"
    assert issue.source.endswith(f"test_fx_capture_fallback.py:{_line('self.head[0](x)')}")
    assert "aten.fractional_max_pool2d" in issue.hint


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line" not in line)


def picky(x, mode):
    return x * 2.0


torch.fx.wrap("picky")


@lowers(picky)  # a test-only entry that refuses one argument value
def _picky(ctx, x, mode):
    if mode != "ok":
        raise ValueError(f"picky: mode={mode!r} is not supported")
    return x * 2.0


class Picky(nn.Module):
    def forward(self, x):
        return picky(x, "bad")  # picky-line


def test_lowering_errors_keep_their_type_and_name_node_module_and_line():
    with pytest.raises(ValueError, match="mode='bad'") as info:
        run_module(Picky(), torch.randn(2, 3))
    (note,) = info.value.__notes__
    assert "fx node 'picky'" in note and "in the root module" in note
    assert note.endswith(f"test_fx_capture_fallback.py:{_line('# picky-line')}")
