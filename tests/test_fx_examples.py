"""examples/fx_mnist.py and examples/fx_compile.py run, and agree with eager PyTorch.

fx_mnist: 40 training steps (batch 32) of the CNN and 2 test batches of 500; the simulated and
the eager model see the same batches from the same initial weights, so their test accuracies
agree to within one image in a thousand (float32 rounding may flip a near-tie argmax).
fx_compile: 3 steps of AdamW with gradient clipping; parameters within 1e-5 of eager.
"""

import importlib
import sys
from pathlib import Path

import pytest

from popxl_fx import data

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    # examples/ is a folder of scripts, not a package: import the script as a module
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def test_fx_mnist_matches_eager(capsys):
    try:
        data.get_data_loaders(32, 500, seed=0)
    except data.DataNotFoundError as err:
        pytest.skip(f"no Fashion-MNIST source on this machine: {err}")
    acc = _load("fx_mnist").main(["--max-steps", "40", "--test-batches", "2"])
    out = capsys.readouterr().out
    assert "Test accuracy (fashion-mnist, cnn): popxl_fx simulator" in out
    assert "IPU memory (estimate" in out
    assert acc["torch"] > 40.0  # it learned something in 40 steps
    assert abs(acc["popxl_fx"] - acc["torch"]) <= 0.1


def test_fx_compile_matches_eager(capsys):
    diff = _load("fx_compile").main(["--steps", "3", "--device", "cpu"])
    assert diff < 1e-5
    assert "after 3 steps the parameters and buffers differ by at most" in capsys.readouterr().out


def test_fx_phased_matches_the_unphased_program(capsys):
    """examples/fx_phased.py: 2 AdamW steps of a 2-block decoder, phased vs unphased: the
    losses are equal bit for bit, and the report diff shows the weights leaving the chip."""
    worst = _load("fx_phased").main(["--steps", "2", "--layers", "2", "--width", "32"])
    out = capsys.readouterr().out
    assert worst == 0
    assert "variable_bytes" in out and "remote_bytes_loaded" in out
