"""nn.LSTM with proj_size > 0 (h projected by weight_hr_l{k}) against eager torch: outputs,
final (h, c) and the gradients of inputs, initial states and every weight (random cotangent);
several layers, batch_first, bidirectional, unbatched; and 3 training steps.

Tolerances: rtol 1e-5 / atol 1e-5 for the lowering (5 steps of float32 gate arithmetic;
torch's fused LSTM kernel adds the gate terms in another order), and 1e-5 / 1e-6 with
assert_matches_eager after 3 SGD-momentum and AdamW steps."""

import pytest
import torch
from torch import nn

from popxl_fx.api import Options
from popxl_fx.testing import assert_matches_eager

from .fx_cases import randn
from .fx_harness import check_lowering, lowered_ops

TOL = dict(rtol=1e-5, atol=1e-5)
N, T, IN, HID, PROJ = 2, 5, 3, 6, 4


class Wrap(nn.Module):
    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x):
        return self.lstm(x)


class WithState(Wrap):
    def forward(self, x, h, c):
        return self.lstm(x, (h, c))


class OutputOnly(Wrap):
    def forward(self, x):
        return self.lstm(x)[0]


LSTMS = {
    "one_layer": dict(),
    "two_layers_batch_first": dict(num_layers=2, batch_first=True),
    "bidirectional_two_layers": dict(num_layers=2, bidirectional=True),
    "no_bias_bidirectional": dict(bias=False, bidirectional=True),
}


def _lstm(**kwargs):
    torch.manual_seed(0)
    return nn.LSTM(IN, HID, proj_size=PROJ, **kwargs)


def _input(lstm):
    return randn(*((N, T, IN) if lstm.batch_first else (T, N, IN)))


@pytest.mark.parametrize("name", sorted(LSTMS))
def test_lstm_proj(name):
    lstm = _lstm(**LSTMS[name])
    check_lowering(Wrap(lstm), _input(lstm), **TOL)


@pytest.mark.parametrize("name", ["one_layer", "bidirectional_two_layers"])
def test_lstm_proj_with_initial_state(name):
    lstm = _lstm(**LSTMS[name])
    layers = lstm.num_layers * (2 if lstm.bidirectional else 1)
    h0, c0 = randn(layers, N, PROJ, seed=1), randn(layers, N, HID, seed=2)
    check_lowering(WithState(lstm), _input(lstm), h0, c0, **TOL)


def test_unbatched_lstm_proj():
    check_lowering(Wrap(_lstm(num_layers=2)), randn(T, IN), **TOL)


def test_projection_is_a_matmul_per_step():
    # with proj_size each step adds one matmul by weight_hr: 1 input + 2 per step
    names = lowered_ops(OutputOnly(_lstm()), randn(T, N, IN))
    plain = lowered_ops(OutputOnly(nn.LSTM(IN, HID)), randn(T, N, IN))
    assert names.count("MatMul") == plain.count("MatMul") + T


class Classifier(nn.Module):
    """A 2-layer projected LSTM reading the last step, then a linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(IN, HID, num_layers=2, batch_first=True, proj_size=PROJ)
        self.head = nn.Linear(PROJ, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=1e-2),
    ],
    ids=["sgd_momentum", "adamw"],
)
def test_lstm_proj_trains_like_eager(optimizer):
    x = randn(N, T, IN, seed=3)
    y = torch.tensor([0, 2])
    assert_matches_eager(
        Classifier(),
        x,
        targets=y,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=optimizer,
        steps=3,
        rtol=1e-5,
        atol=1e-6,
        options=Options(device="cpu"),
    )
