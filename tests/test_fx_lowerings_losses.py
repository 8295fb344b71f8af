"""Loss lowerings against torch: values and the gradients of the predictions (and of the
targets where torch has them) for a random cotangent.

Tolerances: rtol 1e-5 / atol 1e-6 (log_softmax and reductions in another order)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .fx_cases import Fn, WithBuffers, randn
from .fx_harness import check_lowering

N, C = 6, 5
LABELS = torch.tensor([0, 3, 4, 1, 3, 2])
LABELS_IGNORED = torch.tensor([0, -100, 4, 1, 3, -100])
W = torch.tensor([0.5, 1.0, 2.0, 1.5, 0.3])

CE = {
    "mean": dict(),
    "sum": dict(reduction="sum"),
    "none": dict(reduction="none"),
    "weight": dict(weight=True),
    "weight_none": dict(weight=True, reduction="none"),
    "smoothing": dict(label_smoothing=0.2),
    "smoothing_weight_sum": dict(label_smoothing=0.1, weight=True, reduction="sum"),
    "smoothing_weight_mean": dict(label_smoothing=0.1, weight=True),
}


@pytest.mark.parametrize("name", sorted(CE))
@pytest.mark.parametrize("ignored", [False, True], ids=["all_valid", "ignore_index"])
def test_cross_entropy(name, ignored):
    kwargs = dict(CE[name])
    weighted = kwargs.pop("weight", False)

    def fn(x, t, **w):
        return F.cross_entropy(x, t, weight=w.get("w"), **kwargs)

    model = WithBuffers(fn, w=W) if weighted else WithBuffers(fn)
    labels = LABELS_IGNORED if ignored else LABELS
    check_lowering(model, randn(N, C, scale=2.0), labels, rtol=1e-5, atol=1e-6)


def test_cross_entropy_spatial_with_ignore_index_and_smoothing():
    fn = lambda x, t: F.cross_entropy(x, t, ignore_index=2, label_smoothing=0.1)
    labels = torch.tensor([[[0, 2, 1], [3, 3, 2]], [[1, 0, 0], [2, 3, 1]]])
    check_lowering(Fn(fn, 2), randn(2, 4, 2, 3), labels, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_probability_targets(smoothing):
    def fn(x, t, w):
        return F.cross_entropy(x, t.softmax(1), weight=w, label_smoothing=smoothing)

    check_lowering(WithBuffers(fn, w=W), randn(N, C), randn(N, C, seed=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "module",
    [
        nn.CrossEntropyLoss(weight=W, label_smoothing=0.05),
        nn.NLLLoss(ignore_index=3),
        nn.NLLLoss(weight=W, reduction="sum"),
    ],
    ids=repr,
)
def test_class_loss_modules(module):
    model = nn.Sequential(nn.LogSoftmax(1)) if isinstance(module, nn.NLLLoss) else None

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre, self.loss = model or nn.Identity(), module

        def forward(self, x, t):
            return self.loss(self.pre(x), t)

    check_lowering(Net(), randn(N, C), LABELS, rtol=1e-5, atol=1e-6)


REGRESSION = {
    "mse": lambda x, t: F.mse_loss(x, t),
    "mse_none": lambda x, t: F.mse_loss(x, t, reduction="none"),
    "l1_sum": lambda x, t: F.l1_loss(x, t, reduction="sum"),
    "smooth_l1": lambda x, t: F.smooth_l1_loss(x, t, beta=0.5),
    "smooth_l1_beta0": lambda x, t: F.smooth_l1_loss(x, t, beta=0.0),
    "huber": lambda x, t: F.huber_loss(x, t, delta=0.7),
    "kl_div_batchmean": lambda x, t: F.kl_div(
        x.log_softmax(1), t.softmax(1), reduction="batchmean"
    ),
    "kl_div_log_target": lambda x, t: F.kl_div(x, t, reduction="sum", log_target=True),
    "bce": lambda x, t: F.binary_cross_entropy(x.sigmoid(), t.sigmoid()),
    "bce_logits": lambda x, t: F.binary_cross_entropy_with_logits(x * 30, t.sigmoid()),
}


@pytest.mark.parametrize("name", sorted(REGRESSION))
def test_regression_and_binary_losses(name):
    check_lowering(Fn(REGRESSION[name], 2), randn(N, C), randn(N, C, seed=1), rtol=1e-5, atol=1e-6)


def test_bce_with_weights():
    def fn(x, t, w, pw):
        target = (t > 0).float()
        return torch.stack(
            [
                F.binary_cross_entropy(x.sigmoid(), target, weight=w, reduction="none"),
                F.binary_cross_entropy_with_logits(
                    x, target, weight=w, pos_weight=pw, reduction="none"
                ),
            ]
        )

    model = WithBuffers(fn, w=torch.rand(N, C) + 0.5, pw=torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0]))
    check_lowering(model, randn(N, C), randn(N, C, seed=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "module",
    [
        nn.MSELoss(),
        nn.L1Loss(reduction="none"),
        nn.SmoothL1Loss(beta=2.0),
        nn.HuberLoss(),
        nn.BCEWithLogitsLoss(pos_weight=torch.full((C,), 2.0)),
        nn.KLDivLoss(log_target=True),
    ],
    ids=repr,
)
def test_regression_loss_modules(module):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.loss = module

        def forward(self, x, t):
            return self.loss(x, t)

    check_lowering(Net(), randn(N, C), randn(N, C, seed=1), rtol=1e-5, atol=1e-6)


# eager's own arithmetic (issue 34): binary_cross_entropy[_with_logits] and their fused
# backward kernels, so values and gradients (of the logits and of the targets) are equal
# bit for bit, not just close
PW = torch.tensor([1.0, 2.0, 0.5, 3.0, 0.25])
BINARY_WEIGHTS = {
    "plain": {},
    "weight": {"w": randn(C, seed=3).abs() + 0.5},
    "pos_weight": {"pw": PW},
    "both": {"w": randn(N, C, seed=4).abs() + 0.5, "pw": PW},
}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weights", sorted(BINARY_WEIGHTS))
def test_bce_with_logits_is_eager_bit_for_bit(reduction, weights):
    def fn(x, t, w=None, pw=None):
        return F.binary_cross_entropy_with_logits(
            x * 3.0, t.sigmoid(), weight=w, pos_weight=pw, reduction=reduction
        )

    model = WithBuffers(fn, **BINARY_WEIGHTS[weights])
    check_lowering(model, randn(N, C), randn(N, C, seed=1), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weight"])
def test_bce_is_eager_bit_for_bit(reduction, weighted):
    def fn(x, t, w=None):
        return F.binary_cross_entropy(x.sigmoid(), t.sigmoid(), weight=w, reduction=reduction)

    model = WithBuffers(fn, **({"w": randn(N, C, seed=4).abs() + 0.5} if weighted else {}))
    check_lowering(model, randn(N, C), randn(N, C, seed=1), rtol=0.0, atol=0.0)


@pytest.mark.parametrize(
    "module",
    [nn.BCEWithLogitsLoss(weight=W, pos_weight=torch.full((C,), 2.0)), nn.BCELoss(reduction="sum")],
    ids=repr,
)
def test_binary_loss_modules_are_eager_bit_for_bit(module):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.loss = module

        def forward(self, x, t):
            p = x.sigmoid() if isinstance(self.loss, nn.BCELoss) else x
            return self.loss(p, t.sigmoid())

    check_lowering(Net(), randn(N, C), randn(N, C, seed=1), rtol=0.0, atol=0.0)


def test_binary_losses_by_their_torch_and_aten_names_are_eager_bit_for_bit():
    """torch.binary_cross_entropy_with_logits (its own lowering: functorch's functionalize
    would decompose it in the fallback) and the ATen ops as a graph names them (kept whole)."""

    def fn(x, t):
        target = t.sigmoid()
        pw = torch.full((C,), 2.0)
        return (
            torch.binary_cross_entropy_with_logits(x, target, None, pw, 1)
            + torch.ops.aten.binary_cross_entropy_with_logits(x, target, None, None, 2).sum()
            + torch._C._nn.binary_cross_entropy(x.sigmoid(), target, None, 1)
        )

    check_lowering(Fn(fn, 2), randn(N, C), randn(N, C, seed=1), rtol=0.0, atol=0.0)
