"""examples/mnist_popxl.py on the simulator matches the same network in eager PyTorch.

Same initial weights, same Fashion-MNIST batches, float32. Training is capped at STEPS steps
(of the 750 in one epoch at batch 80) to keep CI fast.
"""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

import popxl_core as popxl
from popxl_fx import data

STEPS = 300
BATCH, TEST_BATCH, LR = 80, 80, 0.05
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mnist_popxl.py"


def _load_example():
    # examples/ is a folder of scripts, not a package: import the script as a module
    if str(EXAMPLE.parent) not in sys.path:
        sys.path.insert(0, str(EXAMPLE.parent))
    return importlib.import_module(EXAMPLE.stem)


@pytest.fixture(scope="module")
def example():
    return _load_example()


@pytest.fixture(scope="module")
def loaders():
    try:
        return data.get_data_loaders(BATCH, TEST_BATCH, seed=0)
    except data.DataNotFoundError as err:
        pytest.skip(f"no Fashion-MNIST source on this machine: {err}")


@pytest.fixture(scope="module")
def trained(example, loaders):
    """Train both networks in lockstep; returns everything the tests look at."""
    train_loader, test_loader = loaders
    weights = example.init_weights(0)
    prog = example.build_train_ir(weights, BATCH, LR)
    session = popxl.Session(prog.ir, "ipu_hw")
    params = example.eager_params(weights)
    with session:
        steps = {"popxl": example.sim_step(prog, session), "torch": example.eager_step(params, LR)}
        losses = example.train(
            steps, example.batches(train_loader, max_steps=STEPS), progress=False
        )
    return example, prog, session, params, losses, test_loader


def test_per_step_losses_match_eager(trained):
    _, _, _, _, losses, _ = trained
    sim, eager = np.array(losses["popxl"]), np.array(losses["torch"])
    assert len(sim) == len(eager) == STEPS
    np.testing.assert_allclose(sim, eager, rtol=1e-5, atol=0)
    # The losses must actually fall, or matching them would prove little.
    assert sim[-50:].mean() < 0.5 * sim[:5].mean()


def test_trained_weights_match_eager(trained):
    _, prog, session, params, _, _ = trained
    values = session.get_tensors_data(list(prog.variables.values()))
    for name, var in prog.variables.items():
        eager = params[name].detach().numpy()
        np.testing.assert_allclose(values[var], eager, rtol=1e-4, atol=1e-6, err_msg=name)


def test_test_accuracy_matches_eager(trained):
    example, prog, session, params, _, test_loader = trained
    test_prog = example.build_test_ir(TEST_BATCH)
    test_session = popxl.Session(test_prog.ir, "ipu_hw")
    example.copy_weights(prog, session, test_prog, test_session)
    test_data = list(example.batches(test_loader))
    with test_session:
        sim = example.evaluate(example.sim_predict(test_prog, test_session), test_data)
    eager = example.evaluate(example.eager_predict(params), test_data)
    assert abs(sim - eager) <= 0.5, (sim, eager)
    assert sim > 70.0, f"{STEPS} steps should reach well above chance (10%), got {sim:.2f}%"


def test_report_summary_is_text(trained):
    _, _, session, _, _, _ = trained
    summary = session.report.summary()
    assert isinstance(summary, str) and "IPU" in summary
