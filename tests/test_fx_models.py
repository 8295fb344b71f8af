"""The Done-when model list of popxl_fx, in training_model and compile mode, against eager.

Each model trains 3 steps with SGD (momentum 0.9) and with AdamW; `assert_matches_eager`
compares losses, forward outputs (and logits' argmax), gradients, the final parameters and
buffers, and the optimizer state. Tolerance: float32, rtol 1e-3 with atol 1e-5 (gradients and
parameters near zero are compared absolutely). Dropout is set to p=0 (fx_zoo.no_dropout).
AdamW uses eps=1e-6: parameters whose true gradient is exactly zero (attention key biases,
biases followed by batch norm) get rounding noise as gradient, and with eps=1e-8 Adam's
normalisation turns that noise into steps of +-lr in torch and in the simulator alike, with
independent signs; eps=1e-6 keeps those steps below 1e-5 while real gradients are unaffected.
vgg11_bn and vit_b_16 with AdamW state do not fit one IPU, so the torchvision models run with
device="cpu" (no IPU memory limit); the small models run on the default "ipu_hw".
The torchvision models are marked slow: CI runs them in a separate step (pytest -m slow).
"""

import pytest
import torch

from popxl_fx import Options
from popxl_fx.testing import assert_matches_eager

from .fx_zoo import TORCHVISION, ZOO

RTOL, ATOL = 1e-3, 1e-5
SMALL = ["seed_mlp", "small_cnn", "lstm", "gpt", "bert"]
OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, eps=1e-6),
}


def run(build, optimizer: str, via: str, options=None, normwise=False) -> dict:
    case = build()
    return assert_matches_eager(
        case.model,
        case.inputs,
        targets=case.targets,
        loss_fn=case.loss_fn,
        optimizer=OPTIMIZERS[optimizer],
        steps=3,
        options=options,
        rtol=RTOL,
        atol=ATOL,
        via=via,
        normwise=normwise,
    )


@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", SMALL)
def test_small_models(name, optimizer, via):
    run(ZOO[name], optimizer, via)


@pytest.mark.slow
@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", list(TORCHVISION))
def test_torchvision_models(name, optimizer, via):
    run(TORCHVISION[name], optimizer, via, Options(device="cpu"))
