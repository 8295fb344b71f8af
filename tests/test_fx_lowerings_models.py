"""Acceptance of the lowering table on torchvision models (num_classes=10, random init).

Every fx node of resnet18, mobilenet_v2, vgg11_bn, efficientnet_b0 and vit_b_16 lowers
through a table entry (the ATen decomposition fallback is disabled); mobilenet_v2 and vgg11_bn
only in the slow tier, as they need no op the other three lack.
Slow tier (``-m slow``): the lowered model against torch, in eval mode (running statistics
filled by torch train-mode passes, zero-initialised heads re-drawn, so outputs are not
trivial) for outputs and gradients of the input and every parameter, and in train mode for
outputs and the updated batch-norm buffers. Tolerance rtol 1e-4 / atol 1e-5: float32 sums
of up to ~4600 products per output through 12-50 layers. (Train-mode gradients of batch-norm
nets at batch 2 are ill-conditioned: torch float32 itself differs from float64 by ~2% there,
so they are left to the model-zoo tests with their stated tolerances.)
"""

import pytest
import torch
import torchvision

import popxl_core as popxl
import popxl_fx.fallback
from popxl_fx.module import Module

from .fx_cases import randn
from .fx_harness import check_lowering

MODELS = ["resnet18", "mobilenet_v2", "vgg11_bn", "efficientnet_b0", "vit_b_16"]


def _model(name: str, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    kwargs = {"num_classes": 10}
    if name == "vit_b_16":
        kwargs["image_size"] = size
    return getattr(torchvision.models, name)(**kwargs)


def _no_fallback(node, *args, **kwargs):
    raise AssertionError(f"{node.format_node()} needed the ATen fallback")


# mobilenet_v2 and vgg11_bn use no op the others lack: their build time goes to the slow tier
_SLOW_BUILD = pytest.mark.slow


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=_SLOW_BUILD) if n in ("mobilenet_v2", "vgg11_bn") else n
        for n in MODELS
    ],
)
def test_every_node_lowers_through_the_table(name, monkeypatch):
    monkeypatch.setattr(popxl_fx.fallback, "lower_by_decomposition", _no_fallback)
    model = _model(name, 32)
    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = Module(model).create_graph(popxl.TensorSpec((2, 3, 32, 32), popxl.float32))
    assert graph.graph.outputs[0].shape == (2, 10)


def _prepared(name: str, size: int) -> torch.nn.Module:
    model = _model(name, size)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():  # e.g. vit's zero-initialised head
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
        model.train()
        for seed in (11, 12):
            model(randn(4, 3, size, size, seed=seed))
    for m in model.modules():  # dropout / stochastic depth off: exact comparisons
        if hasattr(m, "p") and isinstance(m.p, float):
            m.p = 0.0
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_matches_torch_in_eval_mode(name):
    size = 32 if name == "vit_b_16" else 64
    model = _prepared(name, size).eval()
    check_lowering(model, randn(2, 3, size, size), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "efficientnet_b0"])
def test_model_forward_and_buffers_in_train_mode(name):
    model = _prepared(name, 64).train()
    check_lowering(model, randn(2, 3, 64, 64), rtol=1e-4, atol=1e-5, grad=False)
