"""examples/fx_mnist.py, fx_compile.py and fx_transforms.py run, and agree with their references.

fx_mnist: 40 training steps (batch 32) of the CNN and 2 test batches of 500; the simulated and
the eager model see the same batches from the same initial weights, so their test accuracies
agree to within one image in a thousand (float32 rounding may flip a near-tie argmax).
fx_compile: 3 steps of AdamW with gradient clipping; parameters within 1e-5 of eager.
fx_transforms: 3 Adam steps of a 2-block row transformer, plain against
outline + gradient accumulation 2 + 2 replicas with RTS, from the same weights on the same
batches. explain() shows every transform stage; the losses agree to float32 round-off of a
mean loss summed in another order (bound 1e-5, about 40 ulps of a loss near 2; seen 2.4e-7);
the report diff shows the outlined code shrinking.
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
    assert "Phased execution: 2 phases" in out and "remote transfers" in out  # PhasedReport


def test_fx_transforms_matches_the_plain_program(capsys):
    try:
        data.get_data_loaders(32, 500, seed=0)
    except data.DataNotFoundError as err:
        pytest.skip(f"no Fashion-MNIST source on this machine: {err}")
    result = _load("fx_transforms").main(["--max-steps", "3", "--test-batches", "1"])
    out = capsys.readouterr().out
    for stage in ("lower", "backward", "accumulation", "replication", "optimizer", "session"):
        assert f" {stage} " in out, stage
    assert "outlined: model.blocks.*: one graph, 2 calls" in out
    assert "plain    transformed" in out and "code_bytes" in out
    line = next(s for s in out.splitlines() if s.startswith("max loss difference"))
    assert result["max_loss_difference"] < 1e-5
    assert float(line.split(":")[1]) == pytest.approx(result["max_loss_difference"], rel=1e-2)
    assert "test accuracy (500 images): plain" in out
    # one test batch of 500: the two models' predictions may differ only on near-ties
    assert abs(result["accuracy_plain"] - result["accuracy_transformed"]) <= 0.4


def test_fx_transforms_refuses_a_batch_the_transforms_cannot_split(capsys):
    with pytest.raises(SystemExit) as exc:
        _load("fx_transforms").parse_args(["--batch-size", "30"])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--batch-size" in last and "multiple of 4" in last and "got 30" in last
