"""popxl_fx.poptorch.ipu_print_tensor: the compiled program prints the tensor to stderr on
every run, laid out as Poplar's PrintTensor lays it out; eager torch prints nothing."""

from __future__ import annotations

import numpy as np
import torch

import popxl_fx.poptorch as poptorch
from popxl_core.ops._poplar_print import poplar_text
from popxl_core.ops._print_format import print_options


class _Printing(torch.nn.Module):
    def __init__(self, *options):
        super().__init__()
        self.options = options
        self.bias = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return poptorch.ipu_print_tensor(x * 2, "t", *self.options) + self.bias


def test_inference_prints_on_every_run_in_poplar_layout(capfd):
    options = (True, 1000, 3, 75, 8, "auto", ",", "{", "}")
    model = poptorch.inferenceModel(_Printing(*options))
    x = torch.tensor([[0.5, 1.25], [3.0, -1.0]])
    for _ in range(2):
        assert torch.equal(model(x), x * 2)
    expected = "t: {\n {1,2.5}\n {6,-2}\n}\n"
    assert capfd.readouterr().err.count(expected) == 2


def test_eager_prints_nothing(capfd):
    x = torch.ones(2, 2)
    assert torch.equal(_Printing()(x), x * 2)
    assert "t:" not in capfd.readouterr().err


def test_rows_wrap_past_the_line_width_and_digits_are_significant_figures():
    opts = print_options(1000, 3, 15, 4, "scientific", ",", "[", "]", layout="poplar")
    text = poplar_text("t", np.array([[1.23456, 20.0]], np.float32), opts)
    assert text == "t: [\n [1.235e+00,\n   2.000e+01]\n]"


def test_summarised_axes_keep_their_edge_items():
    opts = print_options(4, 1, 75, 3, "fixed", " ", "(", ")", layout="poplar")
    text = poplar_text("t", np.arange(6, dtype=np.int32), opts)
    assert text == "t: (0 ... 5)"
