"""Models that used to stop at the lowering table's edge (issue 18): a small SwinTransformer
(shifted-window attention, relative position bias: `roll`, `index`, `pad`, masks; stochastic
depth drawn like eager) and torchvision's RegNet (a submodule named ``block1-0``), against
eager bit for bit."""

import pytest
import torch
from torch import nn

from popxl_fx import Options
from popxl_fx.inference import inference_model
from popxl_fx.testing import assert_matches_eager

CPU = Options(device="cpu")


def _swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(
        patch_size=[4, 4],
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=[4, 4],
        num_classes=10,
        stochastic_depth_prob=0.2,
    )


def test_small_swin_transformer_matches_eager_in_eval_and_train_mode():
    model, x = _swin().eval(), torch.randn(2, 3, 32, 32)
    assert torch.equal(inference_model(model, CPU)(x), model(x))
    errors = assert_matches_eager(
        model.train(),
        x,
        targets=torch.tensor([1, 7]),
        loss_fn=nn.CrossEntropyLoss(),
        steps=2,
        options=CPU,
        rtol=0,
        atol=0,
    )
    assert max(errors.values()) == 0.0  # stochastic depth draws eager's masks


def test_regnet_with_its_block1_0_module_matches_eager_in_eval_mode():
    from torchvision.models import regnet_y_400mf

    torch.manual_seed(0)
    model, x = regnet_y_400mf(num_classes=10).eval(), torch.randn(1, 3, 64, 64)
    assert torch.equal(inference_model(model, CPU)(x), model(x))


@pytest.mark.slow
def test_regnet_trains_two_sgd_steps_equal_to_eager():
    from torchvision.models import regnet_y_400mf

    torch.manual_seed(0)
    model, x = regnet_y_400mf(num_classes=10).train(), torch.randn(2, 3, 64, 64)
    errors = assert_matches_eager(
        model,
        x,
        targets=torch.tensor([3, 5]),
        loss_fn=nn.CrossEntropyLoss(),
        steps=2,
        options=CPU,
        rtol=0,
        atol=0,
    )
    assert max(errors.values()) == 0.0
