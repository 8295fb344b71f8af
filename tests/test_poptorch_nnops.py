"""popxl_fx.poptorch's conv, norm and half-precision behaviours, each against eager torch or
PopTorch's documented rule (its tests' expectations)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Convs(nn.Module):
    def __init__(self, nested: bool = False, convs: bool = True) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 2, 3), nn.Conv2d(1, 2, 3)
        self.nested, self.convs = nested, convs

    def forward(self, x):
        with poptorch.MultiConv().partialsTypes(torch.float):
            if self.nested:
                with poptorch.MultiConv():
                    return self.a(x)
            if not self.convs:
                return x * 2
            return self.a(x) - self.b(torch.abs(x))


def test_multiconv_computes_the_convolutions():
    torch.manual_seed(0)
    model, x = _Convs(), torch.randn(2, 1, 8, 8)
    assert torch.equal(poptorch.inferenceModel(model)(x), model(x))


@pytest.mark.parametrize(
    ("nested", "convs", "match"),
    [(True, True, "Nested poptorch.MultiConv"), (False, False, "Unexpected end_multi_conv")],
)
def test_multiconv_misuse_raises_poptorchs_errors(nested, convs, match):
    model = _Convs(nested, convs)
    with pytest.raises(poptorch.Error, match=match):
        poptorch.inferenceModel(model)(torch.ones(2, 1, 8, 8))
    model(torch.ones(2, 1, 8, 8))  # eager torch runs the scope as PopTorch's CPU ops do


def test_multiconv_setters_validate():
    mc = poptorch.MultiConv()
    with pytest.raises(ValueError, match="Invalid partials types"):
        mc.partialsTypes("half")
    with pytest.raises(AssertionError, match="Invalid plan type"):
        mc.planType("parallel")
    with pytest.raises(AssertionError, match="available memory proportion"):
        mc.availableMemoryProportions([])
    assert mc.availableMemoryProportions((0.5, 0.6)).planType(poptorch.MultiConvPlanType.Serial)


def test_distribution_argument_checks_are_off_while_tracing():
    """PopTorch turns torch.distributions' value checks off while it traces (they branch on
    tensor values); the sample's dtype is eager's."""

    class Sample(nn.Module):
        def forward(self, low):
            return torch.distributions.Uniform(low, torch.tensor([10.0])).sample((4, 3))

    low = torch.tensor([1.0], dtype=torch.float16)
    before = torch.distributions.Distribution._validate_args
    out = poptorch.inferenceModel(Sample())(low)
    assert out.dtype == Sample()(low).dtype and out.shape == (4, 3, 1)
    assert torch.distributions.Distribution._validate_args == before  # restored after the trace


class _Twice(nn.Module):
    """One linear called on a half and a float activation (PopTorch's 8-bit IO test)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, y):
        return self.fc(x.half()), self.fc(x.float()), x.half() + y, self.fc(y) * 2


def test_parameters_follow_the_activations_dtype():
    torch.manual_seed(0)
    model, x, y = _Twice(), torch.randint(0, 9, (2, 4), dtype=torch.uint8), torch.randn(2, 4)
    w, b = model.fc.weight.detach(), model.fc.bias.detach()
    got = poptorch.inferenceModel(model)(x, y)
    want = (
        torch.nn.functional.linear(x.half(), w.half(), b.half()),
        torch.nn.functional.linear(x.float(), w, b),
        x.half() + y,  # activations promote as torch does: half + float is float
        model.fc(y).detach() * 2,
    )
    assert [g.dtype for g in got] == [torch.float16, torch.float32, torch.float32, torch.float32]
    assert all(torch.equal(g, e) for g, e in zip(got, want))


def test_float_activations_with_half_weights_run_in_float():
    torch.manual_seed(0)
    conv, x = nn.Conv1d(4, 5, 2).half(), torch.randn(1, 4, 4)
    got = poptorch.inferenceModel(conv)(x)
    want = torch.nn.functional.conv1d(x, conv.weight.detach().float(), conv.bias.detach().float())
    assert got.dtype == torch.float32 and torch.equal(got, want)


class _HalfLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, target):
        out = self.fc(x)
        return out, nn.functional.mse_loss(out, target)


def test_half_activations_train_float32_master_weights():
    """The forward and backward run in half; SGD updates the float32 weights with the half
    gradient cast up (eager torch written out by hand)."""
    torch.manual_seed(0)
    model, x, t = _HalfLoss(), torch.randn(3, 4).half(), torch.randn(3, 4).half()
    w = model.fc.weight.detach().half().requires_grad_()
    b = model.fc.bias.detach().half().requires_grad_()
    nn.functional.mse_loss(nn.functional.linear(x, w, b), t).backward()
    want_w = model.fc.weight.detach() - 0.01 * w.grad.float()
    want_b = model.fc.bias.detach() - 0.01 * b.grad.float()
    out, loss = poptorch.trainingModel(model)(x, t)
    assert out.dtype == loss.dtype == torch.float16 and model.fc.weight.dtype == torch.float32
    assert torch.equal(model.fc.weight.detach(), want_w)
    assert torch.equal(model.fc.bias.detach(), want_b)


class _FrozenBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(6)
        for p in self.parameters():
            p.requires_grad = False

    def forward(self, x, target):
        y = self.bn(x)
        return y, nn.functional.mse_loss(y, target)


@pytest.mark.parametrize("train_mode", [False, True])
def test_training_model_with_nothing_to_train_runs_its_forward(train_mode):
    """PopTorch runs it (eager's backward would raise): the outputs and running statistics
    are eager's forward's."""
    import copy

    torch.manual_seed(0)
    model = _FrozenBn().train(train_mode)
    eager = copy.deepcopy(model)
    x, t = torch.randn(8, 6), torch.randn(8, 6)
    out, loss = poptorch.trainingModel(model)(x, t)
    want_out, want_loss = eager(x, t)
    assert torch.equal(out, want_out) and torch.equal(loss, want_loss)
    assert torch.equal(model.bn.running_mean, eager.bn.running_mean)
    assert torch.equal(model.bn.running_var, eager.bn.running_var)


def _strided_reference(m: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """Group g holds channels g, g + G, g + 2G, ...: each normalised on its own."""
    out = torch.empty_like(x)
    for g in range(m.num_groups):
        idx = torch.arange(g, x.shape[1], m.num_groups)
        out[:, idx] = nn.functional.group_norm(x[:, idx], 1, eps=m.eps)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return out * m.weight.reshape(shape) + m.bias.reshape(shape)


def test_popart_strided_channel_grouping_groups_channels_modulo_groups():
    torch.manual_seed(0)
    gn = nn.GroupNorm(3, 12)
    nn.init.normal_(gn.weight), nn.init.normal_(gn.bias)
    x = torch.randn(2, 12, 5)
    opts = poptorch.Options()
    opts._Popart.set("groupNormStridedChannelGrouping", True)
    got = poptorch.inferenceModel(gn, opts)(x)
    want = _strided_reference(gn, x).detach()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, gn(x), rtol=1e-2, atol=1e-2)  # torch groups contiguously
    assert torch.equal(poptorch.inferenceModel(gn)(x), gn(x).detach())  # without the option
