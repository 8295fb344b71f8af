"""Bit for bit: models whose every op runs eager's own CPU kernel (linear layers as at::linear
picks addmm or mm, layer norm, gelu, softmax/log-softmax/nll, embedding, SDPA and
nn.MultiheadAttention through torch's CPU flash-attention kernel) train 3 steps of
SGD-momentum and of AdamW on the simulator with exactly eager float32's numbers: losses,
forward outputs, gradients, final parameters and optimizer state, rtol=0 and atol=0.

(tests/test_fx_models.py checks the whole zoo at rtol 1e-3; the other small models, the LSTM
and the CNN, are not yet eager's kernel for kernel.)
"""

import pytest

from .fx_zoo import OPTIMIZERS, ZOO, train_against_eager

EXACT = ["seed_mlp", "gpt", "bert"]


@pytest.mark.parametrize("via", ["training_model", "compile"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", EXACT)
def test_models_match_eager_bit_for_bit(name, optimizer, via):
    errors = train_against_eager(ZOO[name], optimizer, via, rtol=0.0, atol=0.0)
    assert errors["parameters"] == 0.0 and errors["gradients"] == 0.0
