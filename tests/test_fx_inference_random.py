"""Random ops get fresh seeds: dropout masks differ per call and per op, and follow torch's
dropout semantics (zeros or x / (1 - p)); eval mode is the identity."""

import torch
from torch import nn

from popxl_fx.inference import inference_model


class TwoDropouts(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Dropout(0.5)
        self.b = nn.Dropout(0.5)

    def forward(self, x):
        return self.a(x), self.b(x)


def test_dropout_masks_are_fresh_per_call_and_per_op_and_scaled_like_torch():
    x = torch.rand(64, 64) + 1.0
    sim = inference_model(TwoDropouts().train())
    a1, b1 = sim(x)
    a2, _ = sim(x)
    for y in (a1, b1, a2):
        kept = y != 0
        torch.testing.assert_close(y[kept], x[kept] * 2.0, rtol=0, atol=0)
        assert 0.4 < kept.float().mean() < 0.6  # 4096 draws at p=0.5
    assert not torch.equal(a1 != 0, b1 != 0)  # two ops, two seeds
    assert not torch.equal(a1 != 0, a2 != 0)  # the seed variable advances every call


def test_dropout_in_eval_mode_is_the_identity():
    x = torch.randn(8, 8)
    a, b = inference_model(TwoDropouts().eval())(x)
    assert torch.equal(a, x) and torch.equal(b, x)
