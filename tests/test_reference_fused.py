"""The compiler's fused paths against the reference interpreter, on whole training steps.

popxl_fx trainers (linear layers, GELU, cross-entropy, SGD / Adam / AdamW updates) run once
compiled and once on `popxl_core.sim.reference` (no fusion, no ``out=`` reuse, no multi-tensor
kernels, no views). The compiled runs use the fused paths: ``out=`` reuse in Adam's chain
(inplace.py), multi-tensor optimizer updates (foreach.py, both grouping modes; Adam's
``lerp_``/``addcmul_``/``addcdiv_`` as ``torch._foreach_lerp_``/``_addcmul_``/``_addcdiv_``),
direct torch calls (direct.py), released temporaries (release.py), the first linear layer's
gradient without its unread input gradient (``dead_output_kernels``), the weight gradients
written into buffers kept between steps (``buffered_kernel``) and, for a small CNN, a
convolution's data and weight gradients in one call (conv_pairs.py); the test checks that the
fusions ran. ``fused=True`` optimizers run torch's fused kernels: compiled, one call over a
param group's parameters (foreach.py, `forms.multi_tensor_foreach`); interpreted, one call per
parameter. (popxl_fx lowers nn.Linear to eager's own addmm/mm ops, so the transposed-matmul
fusion of fuse.py does not arise here; tests/test_fuse.py bounds it against ``(a @ b).T``.)

With the transposed matmuls off, losses, weights and optimizer state after three steps must be
equal to the bit: ``out=`` reuse and the foreach kernels compute every element with the same
ATen op as the unfused program. The transposed matmul is the one fusion that may differ:
``b.T @ a.T`` (eager PyTorch's own call for a linear weight gradient) and ``(a @ b).T`` sum the
same products, but the GEMM blocks them differently for the two layouts, so the gradient may
differ in the last bit (measured: 1 ulp, 1.5e-8 on weights of magnitude ~0.2 after three steps).
With it on, the tolerance is 1e-6 relative to each tensor's largest entry (8 ulp of float32): a
sum's rounding error scales with its summands, so an entry near zero of a gradient (or momentum,
``exp_avg``) may differ by a few ulp of the gradient's large entries; the updates move weights
by lr times that.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx
from popxl_core.sim import CompileOptions

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam_wd": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.3, 0.99)),
    # torch's fused kernels, one call per param group when compiled, one per op interpreted
    "fused_sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, fused=True),
    "fused_adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-2, fused=True),
    "fused_adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, fused=True),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(20, 24),
        nn.GELU(),
        nn.Linear(24, 24),
        nn.GELU(),
        nn.Linear(24, 5),
    )


def _train(
    opt_name: str,
    reference: bool,
    make=None,
    x_shape=(6, 4, 5),
    dtype=torch.float32,
    fx_options=None,
    **options: bool,
):
    model = (make or _model)()
    opt = OPTIMIZERS[opt_name](model.parameters())
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(*x_shape, generator=g).to(dtype), torch.randint(0, 5, (6,), generator=g))
        for _ in range(3)
    ]
    compiler = CompileOptions(interpret=reference, **options)
    trainer = popxl_fx.training_model(
        model,
        opt,
        nn.CrossEntropyLoss(),
        options=popxl_fx.Options(compiler=compiler, **(fx_options or {})),
    )
    losses = [trainer(x, y).clone() for x, y in batches]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    opt_state = {
        f"{i}.{k}": v.clone()
        for i, s in enumerate(opt.state_dict()["state"].values())
        for k, v in s.items()
    }
    return trainer, losses, state, opt_state


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


def _compare(fast_run, ref_run, equal) -> None:
    _, f_losses, f_state, f_opt = fast_run
    _, r_losses, r_state, r_opt = ref_run
    for i, (a, b) in enumerate(zip(f_losses, r_losses)):
        assert equal(a, b), f"loss {i}: {a.item()!r} vs {b.item()!r}"
    assert f_state.keys() == r_state.keys() and f_opt.keys() == r_opt.keys()
    for k in f_state:
        assert equal(f_state[k], r_state[k]), f"parameter {k} differs"
    for k in f_opt:
        assert equal(f_opt[k], r_opt[k]), f"optimizer state {k} differs"


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = float(b.abs().max()) if b.numel() else 0.0
    return a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-6, atol=1e-6 * scale)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_training_step_compiled_matches_reference(opt_name):
    ref = _train(opt_name, reference=True)
    assert type(ref[0].session._program).__name__ == "ReferenceProgram"
    # the default: every kind of the optimizer's chain grouped (foreach_fresh=True)
    grouped = _train(opt_name, reference=False, transposed_matmuls=False)
    stats = grouped[0].session._program.stats
    assert stats["transposed_matmuls"] == 0
    assert stats["foreach_groups"] >= 1 and stats["foreach_ops"] >= 6, stats
    assert stats["dead_outputs"] == 1, stats  # the first layer's input gradient, not computed
    assert stats["buffered_ops"] == 3, stats  # the weight gradients, in kept buffers
    if opt_name.startswith("adam"):  # torch's lerp_/addcmul_/addcdiv_, each kind one kernel
        for kind in ("LerpInplace", "AddcmulInplace", "AddcdivInplace", "Sqrt"):
            assert stats.get(f"foreach_{kind}") == 6, stats  # the 6 parameters
    _compare(grouped, ref, _bits_equal)
    # per-tensor chains writing into the previous tensor's dead temporaries
    chains = _train(opt_name, reference=False, transposed_matmuls=False, foreach_fresh=False)
    chain_stats = chains[0].session._program.stats
    assert chain_stats["foreach_ops"] <= stats["foreach_ops"]
    if opt_name.startswith("adam"):
        assert chain_stats["out_reuse"] >= 6, chain_stats  # at least one per parameter
        assert chain_stats.get("foreach_LerpInplace") == 6, chain_stats
        assert chain_stats.get("foreach_AddcmulInplace") == 6, chain_stats
    _compare(chains, ref, _bits_equal)
    one_by_one = _train(opt_name, reference=False, transposed_matmuls=False, foreach=False)
    assert one_by_one[0].session._program.stats["foreach_groups"] == 0
    _compare(one_by_one, ref, _bits_equal)
    # popxl_fx lowers nn.Linear to eager's own addmm/mm ops, so no transpose(matmul) is left
    # for fuse.py here; tests/test_fuse.py bounds that fusion against (a @ b).T
    fast = _train(opt_name, reference=False)
    _compare(fast, ref, _close)


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False),
        nn.ReLU(),
        nn.Conv2d(8, 4, 1, groups=4),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 5),
    )


def test_conv_gradients_in_one_call_match_reference():
    """conv_pairs.py: dx, dw and db from one convolution_backward are the separate calls'
    bits. Each conv joins: the first's dw and db (its input needs no gradient), the second's
    dx and dw (no bias), the third's three."""
    cnn = {"make": _cnn, "x_shape": (6, 3, 8, 8)}
    ref = _train("sgd_momentum", reference=True, **cnn)
    paired = _train("sgd_momentum", reference=False, **cnn)
    assert paired[0].session._program.stats["conv_pairs"] == 3
    _compare(paired, ref, _bits_equal)
    apart = _train("sgd_momentum", reference=False, conv_pairs=False, **cnn)
    assert apart[0].session._program.stats["conv_pairs"] == 0
    _compare(apart, ref, _bits_equal)


def test_half_conv_gradients_in_one_call_match_reference():
    """A float16 CNN with float partials (PopTorch's default): the joint call computes its
    float16 operands in float32 and rounds each gradient once, the separate kernels' bits
    (the mixed_precision tutorial's half step: one call per conv, as eager's)."""
    half = {"make": lambda: _cnn().half(), "x_shape": (6, 3, 8, 8), "dtype": torch.float16}
    half["fx_options"] = {"partials_type": "float"}
    ref = _train("sgd_momentum", reference=True, **half)
    joint = _train("sgd_momentum", reference=False, **half)
    apart = _train("sgd_momentum", reference=False, conv_pairs=False, **half)
    assert joint[0].session._program.stats["conv_pairs"] == 3
    assert apart[0].session._program.stats["conv_pairs"] == 0
    _compare(joint, ref, _bits_equal)
    _compare(apart, ref, _bits_equal)
