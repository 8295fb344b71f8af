"""Recurrent lowerings (unrolled) against torch: outputs, final states and the gradients of
inputs, initial states and every weight.

Tolerances: rtol 1e-5 / atol 1e-5 (5 steps of float32 gate arithmetic; torch fuses the gates
in another order)."""

import pytest
import torch
from torch import nn

from .fx_cases import randn
from .fx_harness import check_lowering

TOL = dict(rtol=1e-5, atol=1e-5)
N, T, IN, HID = 2, 5, 3, 4


class Wrap(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)


class WithState(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h, c):
        if isinstance(self.rnn, nn.LSTM):
            return self.rnn(x, (h, c))
        return self.rnn(x, h + c)


RNNS = {
    "lstm": lambda: nn.LSTM(IN, HID),
    "lstm_2layers_batch_first": lambda: nn.LSTM(IN, HID, num_layers=2, batch_first=True),
    "lstm_bidirectional_2layers": lambda: nn.LSTM(IN, HID, 2, bidirectional=True),
    "gru": lambda: nn.GRU(IN, HID, batch_first=True),
    "gru_bidirectional_no_bias": lambda: nn.GRU(IN, HID, bias=False, bidirectional=True),
    "rnn_tanh_2layers": lambda: nn.RNN(IN, HID, 2),
    "rnn_relu": lambda: nn.RNN(IN, HID, nonlinearity="relu", batch_first=True),
}


@pytest.mark.parametrize("name", sorted(RNNS))
def test_recurrent(name):
    torch.manual_seed(0)
    rnn = RNNS[name]()
    shape = (N, T, IN) if rnn.batch_first else (T, N, IN)
    check_lowering(Wrap(rnn), randn(*shape), **TOL)


@pytest.mark.parametrize("name", ["lstm_bidirectional_2layers", "gru", "rnn_tanh_2layers"])
def test_recurrent_with_initial_state(name):
    torch.manual_seed(0)
    rnn = RNNS[name]()
    shape = (N, T, IN) if rnn.batch_first else (T, N, IN)
    layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
    state = (randn(layers, N, HID, seed=1), randn(layers, N, HID, seed=2))
    check_lowering(WithState(rnn), randn(*shape), *state, **TOL)


def test_unbatched_lstm():
    torch.manual_seed(0)
    check_lowering(Wrap(nn.LSTM(IN, HID, 2)), randn(T, IN), **TOL)


@pytest.mark.parametrize(
    "cell",
    [nn.LSTMCell(IN, HID), nn.GRUCell(IN, HID), nn.RNNCell(IN, HID, nonlinearity="relu")],
    ids=repr,
)
def test_cells(cell):
    torch.manual_seed(0)
    check_lowering(Wrap(cell), randn(N, IN), **TOL)
