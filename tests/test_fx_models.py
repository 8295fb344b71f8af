"""The Done-when model list of popxl_fx, in training_model and compile mode, against eager.

Each model trains 3 steps with SGD (momentum 0.9) and with AdamW; `assert_matches_eager`
compares losses, forward outputs (and logits' argmax), gradients, the final parameters and
buffers, and the optimizer state. Tolerance: float32, rtol 1e-3 with atol 1e-5 per element
(gradients and parameters near zero are compared absolutely). Dropout is set to p=0
(fx_zoo.no_dropout). AdamW uses eps=1e-6: parameters whose true gradient is exactly zero
(attention key biases, biases followed by batch norm) get rounding noise as gradient, and
with eps=1e-8 Adam's normalisation turns any difference in that noise into steps of +-lr.

The torchvision CNNs (resnet18, mobilenet_v2, vgg11_bn, efficientnet_b0; 4x3x64x64,
num_classes=10) run 3 steps in float32, per element (not normwise). These models amplify
rounding (batch norm over 4x2x2 values, ReLU6, max-pool near-ties): eager float32 itself
leaves float64 by ~1e-2 within 3 steps, so they pass only because the simulator runs eager's
float32 arithmetic op for op: the same aten kernels forward and backward (convolution with
its bias and convolution_backward, native_batch_norm and its backward incl. the running
statistics, max_pool2d_with_indices, hardtanh/threshold, silu/sigmoid/hardswish backward,
adaptive_avg_pool2d, log_softmax/nll_loss backward) and torch's single-tensor optimizer code.
Measured max abs difference after 3 steps (python -m tools.fx_maxdiff), for loss, forward
outputs, gradients, final parameters/buffers and optimizer state, SGD-momentum and AdamW,
training_model and compile: 0.0 (bit for bit) for resnet18, mobilenet_v2, efficientnet_b0
and vgg11_bn (and vit_b_16, tests/test_fx_models_vit.py).
vgg11_bn (129M parameters) and the other torchvision models run with device="cpu" (no IPU
memory limit: vgg11_bn with AdamW state does not fit one IPU); vgg11_bn needs ~8 GB (SGD,
compile) to ~15 GB (AdamW, training_model) of host memory: the model, its eager twin, their
optimizer state and the simulator's copies. The small models run on the default "ipu_hw".
The torchvision models are marked slow: CI runs them in a separate step (pytest -m slow).
"""

import pytest

from popxl_fx import Options

from .fx_zoo import OPTIMIZERS, TORCHVISION, ZOO, train_against_eager

RTOL, ATOL = 1e-3, 1e-5
SMALL = ["seed_mlp", "small_cnn", "lstm", "gpt", "bert"]
CNNS = ["resnet18", "mobilenet_v2", "vgg11_bn", "efficientnet_b0"]
# float64, semantics to rounding (vgg11_bn and vit_b_16 would need ~10 GB of host memory)
TV_FLOAT64 = [("resnet18", "sgd_momentum")]


def run(build, optimizer: str, via: str, options=None) -> dict:
    return train_against_eager(build, optimizer, via, rtol=RTOL, atol=ATOL, options=options)


@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", SMALL)
def test_small_models(name, optimizer, via):
    run(ZOO[name], optimizer, via)


def _double(case):
    case.model.double()
    case.inputs = tuple(x.double() if x.is_floating_point() else x for x in case.inputs)
    return case


@pytest.mark.slow
@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("name, optimizer", TV_FLOAT64)
def test_torchvision_models_float64(name, optimizer, via):
    """3 steps in float64: the lowerings and updates are torch's to rounding (rtol 1e-9)."""
    train_against_eager(
        lambda: _double(TORCHVISION[name]()),
        optimizer,
        via,
        rtol=1e-9,
        atol=1e-12,
        options=Options(device="cpu"),
    )


@pytest.mark.slow
@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", CNNS)
def test_torchvision_cnns(name, optimizer, via):
    """3 steps in float32, every element at rtol 1e-3 / atol 1e-5, device="cpu"."""
    run(TORCHVISION[name], optimizer, via, Options(device="cpu"))
