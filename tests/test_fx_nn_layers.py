"""torch.nn layers and losses PopTorch's tests run (CTC loss, EmbeddingBag, Bilinear, RReLU),
lowered and compared with eager torch, forward and gradient, bit for bit (tolerance 0)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx import Options
from popxl_fx.testing import assert_matches_eager

from .fx_cases import Fn, randn
from .fx_harness import check_lowering

T, N, C = 8, 3, 5


def _ctc_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(T, N, C, generator=g).log_softmax(-1)
    targets = torch.randint(1, C, (N, 4), generator=g)
    return log_probs, targets, torch.full((N,), T), torch.tensor([4, 2, 3])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("lengths", ["tensors", "lists"])
def test_ctc_loss_function(reduction, lengths):
    log_probs, targets, in_len, tgt_len = _ctc_data()
    if lengths == "lists":
        in_len, tgt_len = in_len.tolist(), tgt_len.tolist()

    def fn(x):
        return F.ctc_loss(x * 2.0, targets, in_len, tgt_len, reduction=reduction)

    check_lowering(Fn(fn), log_probs, rtol=0, atol=0)


class _CtcModule(nn.Module):
    """Targets and lengths as model inputs (int64, held as int32 on the device)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, C))
        self.loss = nn.CTCLoss(blank=2, reduction="sum", zero_infinity=True)

    def forward(self, x, targets, in_len, tgt_len):
        return self.loss((x * self.scale).log_softmax(-1), targets, in_len, tgt_len)


def test_ctc_loss_module_with_lengths_as_inputs():
    log_probs, targets, in_len, tgt_len = _ctc_data(1)
    targets[targets == 2] = 1  # the blank is never a target
    check_lowering(_CtcModule(), log_probs, targets, in_len, tgt_len, rtol=0, atol=0)


_BAG_INDICES = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_module(mode):
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(10, 3, mode=mode)
    check_lowering(bag, _BAG_INDICES, rtol=0, atol=0)


class _WeightedBag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bag = nn.EmbeddingBag(10, 3, mode="sum", scale_grad_by_freq=True)

    def forward(self, x, weights):
        return self.bag(x, per_sample_weights=weights)


def test_embedding_bag_per_sample_weights():
    check_lowering(_WeightedBag(), _BAG_INDICES, randn(2, 4), rtol=0, atol=0)


class _OffsetBag(nn.Module):
    """F.embedding_bag on flat indices with offsets (the last one closing the last bag)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(randn(10, 3))
        self.mode = mode

    def forward(self, x):
        offsets = torch.cat((torch.arange(0, x.numel(), x.size(1)), torch.tensor([x.numel()])))
        flat = x.reshape(-1)
        return F.embedding_bag(flat, self.weight, offsets, mode=self.mode, include_last_offset=True)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_function_with_offsets(mode):
    check_lowering(_OffsetBag(mode), _BAG_INDICES, rtol=0, atol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_bilinear_module(bias):
    torch.manual_seed(0)
    layer = nn.Bilinear(4, 5, 3, bias=bias)
    check_lowering(layer, randn(2, 3, 4), randn(2, 3, 5, seed=1), rtol=0, atol=0)


def test_bilinear_function():
    fn = Fn(lambda x, w: F.bilinear(x, x * 2.0, w), 2)
    check_lowering(fn, randn(6, 4), randn(3, 4, 4, seed=1), rtol=0, atol=0)


def test_rrelu_in_eval_is_leaky_relu_with_the_mean_slope():
    layer = nn.RReLU(0.1, 0.3).eval()
    check_lowering(layer, randn(4, 5), rtol=0, atol=0)
    check_lowering(Fn(lambda x: F.rrelu(x * 1.5, 0.2, 0.6)), randn(4, 5), rtol=0, atol=0)


def _rrelu_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.RReLU(0.1, 0.4), nn.Linear(16, 4)).train()


def _train_rrelu(options: Options) -> dict:
    x, y = randn(6, 8), randn(6, 4, seed=1)
    loss = nn.MSELoss()
    return assert_matches_eager(
        _rrelu_mlp(), x, targets=y, loss_fn=loss, steps=2, options=options, rtol=0, atol=0
    )


def test_rrelu_in_training_draws_eagers_noise_bit_for_bit():
    errors = _train_rrelu(Options(device="cpu"))
    assert max(errors.values()) == 0.0


def test_rrelu_in_training_on_the_ipu_stream_draws_its_own_slopes():
    with pytest.raises(AssertionError, match=r"step 0: loss: max abs error"):
        _train_rrelu(Options(device="cpu", rng="ipu"))
