"""Random ops in train mode follow torch's generator (``Options(rng="torch")``, the default):
after the same ``torch.manual_seed`` the simulated masks and draws are eager's, bit for bit;
``Options(rng="ipu")`` keeps the simulator's own seeded stream (masks differ from eager's)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx import Options
from popxl_fx.inference import inference_model
from popxl_fx.testing import assert_matches_eager


def _mlp(drop: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), drop, nn.Linear(16, 4)).train()


def _train(model: nn.Module, options: Options) -> dict:
    x, y = torch.randn(6, 8), torch.randn(6, 4)
    return assert_matches_eager(
        model, x, targets=y, loss_fn=nn.MSELoss(), steps=2, options=options, rtol=0, atol=0
    )


def test_dropout_in_train_mode_matches_eager_bit_for_bit_by_default():
    errors = _train(_mlp(nn.Dropout(0.5)), Options(device="cpu"))
    assert max(errors.values()) == 0.0


def test_dropout_with_the_ipu_stream_differs_from_eager_with_a_readable_report():
    with pytest.raises(AssertionError, match=r"step 0: loss: max abs error .* beyond rtol=0"):
        _train(_mlp(nn.Dropout(0.5)), Options(device="cpu", rng="ipu"))


class Noisy(nn.Module):
    """Random ops of every path: a leaf module (Dropout2d), torch functions and ATen random
    ops reached through the fallback (``noise`` has no lowering: it decomposes)."""

    def __init__(self):
        super().__init__()
        self.drop2d = nn.Dropout2d(0.3)

    def forward(self, x):
        return noise(self.drop2d(x))


def noise(x):
    perm = torch.randperm(x.shape[-1])
    return F.dropout(x, 0.4) * torch.rand_like(x) + torch.randn(x.shape) + x[..., perm]


torch.fx.wrap("noise")


def test_random_ops_follow_torchs_generator_in_eager_order():
    model, x = Noisy().train(), torch.randn(2, 3, 4, 5)
    sim = inference_model(model, Options(device="cpu"))
    for seed in (3, 4):  # the first call builds the program: capture does not draw
        torch.manual_seed(seed)
        want = model(x)
        torch.manual_seed(seed)
        got = sim(x)
        assert torch.equal(got, want), f"seed {seed}: {(got - want).abs().max()}"


class NativeDropout(nn.Module):
    """aten.native_dropout called directly (what decompositions and exported graphs hold)."""

    def forward(self, x):
        out, mask = torch.ops.aten.native_dropout.default(x, 0.5, True)
        return out * 2 + mask


def test_native_dropout_draws_eagers_mask_and_trains_bit_for_bit():
    model = nn.Sequential(nn.Linear(8, 16), NativeDropout(), nn.Linear(16, 4)).train()
    errors = _train(model, Options(device="cpu"))
    assert max(errors.values()) == 0.0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop = nn.Linear(8, 8), nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.fc(x)))


def _blocks() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), nn.Linear(8, 4)).train()


def test_outlined_blocks_with_dropout_draw_eagers_masks():
    errors = _train(_blocks(), Options(device="cpu", outline="auto"))
    assert max(errors.values()) == 0.0


def test_recompute_refuses_blocks_that_draw_from_torchs_generator():
    # recomputing the forward in the backward would draw a new mask there
    with pytest.raises(NotImplementedError, match=r"rng='ipu'"):
        _train(_blocks(), Options(device="cpu", outline="auto", recompute=True))
