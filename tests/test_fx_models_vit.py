"""vit_b_16 (torchvision, image_size=64, num_classes=10, 4x3x64x64, dropout p=0) trains 3 steps
of SGD-momentum and of AdamW on the simulator, in training_model and in compile mode, against
eager PyTorch: float32, every forward output, gradient, final parameter and optimizer state
`allclose` per element at rtol 1e-3 (atol 1e-5 for values near zero), not normwise.

The lowerings use eager's own CPU kernels (addmm vs mm for linear layers as at::linear picks,
native_layer_norm, the flash-attention kernel of F.scaled_dot_product_attention, the patch
convolution with its bias and convolution_backward, aten's log-softmax/nll backward) and the
optimizer updates are torch's single-tensor code op for op, so the simulator computes eager
float32's numbers (tools/fx_maxdiff.py prints the max differences). Measured on a shared
2-core machine: 7-12 minutes and 5.6-7.5 GB of host memory per test (model, eager twin,
simulator state). vit_b_16 with AdamW state (86M parameters) does not fit one IPU: the tests
run with Options(device="cpu"), which ignores the IPU memory limit.
"""

import pytest

from popxl_fx import Options

from .fx_zoo import OPTIMIZERS, TORCHVISION, train_against_eager

RTOL, ATOL = 1e-3, 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_vit_b_16_three_steps(optimizer, via):
    errors = train_against_eager(
        TORCHVISION["vit_b_16"], optimizer, via, rtol=RTOL, atol=ATOL, options=Options(device="cpu")
    )
    assert set(errors) >= {"loss", "gradients", "parameters", "optimizer state"}
