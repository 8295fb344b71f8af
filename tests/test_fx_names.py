"""Any legal torch module name works (torchvision RegNet's ``block1-0``): variable names are
escaped for PopXL/DotTree and map back to the exact torch names in gradients, state dicts
and errors."""

from collections import OrderedDict

import pytest
import torch
from torch import nn

from popxl_fx import Options
from popxl_fx.inference import inference_model
from popxl_fx.names import escape, unescape
from popxl_fx.testing import assert_matches_eager

CPU = Options(device="cpu")

NAMES = [
    "trunk_output.block1-0.proj.weight",
    "a.b c.0.w",
    "x_y.z",
    "_esc_a.b",  # looks escaped: escaped again, so unescape cannot misread it
    "é-1.ü",
    "2x.w",
    "under_score-1",
    "-_-",
]


@pytest.mark.parametrize("name", NAMES)
def test_escape_gives_valid_names_and_unescape_the_exact_torch_name(name):
    escaped = escape(name)
    assert all(c.isidentifier() or c.isdigit() for c in escaped.split("."))
    assert unescape(escaped) == name


def test_plain_names_are_unchanged():
    assert escape("layer1.0.conv1.weight") == "layer1.0.conv1.weight"


def _odd_model() -> nn.Module:
    torch.manual_seed(0)
    inner = nn.Sequential(OrderedDict([("conv a", nn.Linear(4, 4)), ("2x", nn.ReLU())]))
    return nn.Sequential(OrderedDict([("block1-0", inner), ("head", nn.BatchNorm1d(4))]))


def test_inference_with_names_that_are_not_identifiers_matches_eager():
    model, x = _odd_model().eval(), torch.randn(3, 4)
    assert torch.equal(inference_model(model, CPU)(x), model(x))


@pytest.mark.parametrize("via", ["training_model", "compile"])
def test_training_with_names_that_are_not_identifiers_matches_eager(via):
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    errors = assert_matches_eager(
        _odd_model().train(),
        x,
        targets=y,
        loss_fn=nn.MSELoss(),
        steps=2,
        options=CPU,
        via=via,
        rtol=0,
        atol=0,
    )
    assert max(errors.values()) == 0.0  # gradients compared by torch name ('block1-0.conv a...')
