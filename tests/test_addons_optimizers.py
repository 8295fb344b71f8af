"""addons.optimizers.adam.AdamOptimizerStep over several steps against torch.optim.AdamW
and the same update written in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popxl_core as popxl
from addons.optimizers.adam import AdamOptimizerStep
from popxl_core import ops

SHAPE = (3, 4)
STEPS = 4


def _grads(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(STEPS)]


def _w0() -> np.ndarray:
    return np.random.default_rng(99).standard_normal(SHAPE).astype(np.float32)


def _run_popxl(grads, *, scale_grads=1.0, norm_of=None, **hyper):
    """Apply one AdamOptimizerStep per gradient (fed through a stream); return the weight
    after each step and the optimiser state variables."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(_w0(), name="w")
        g_stream = popxl.h2d_stream(SHAPE, popxl.float32, "grad")
        g = ops.host_load(g_stream, "g")
        extra = {}
        if norm_of is not None:
            # a variable written before each step (scalar streams are not exercised here)
            extra["global_norm"] = norm = popxl.variable(np.float32(0), name="global_norm")
        facts, graph = AdamOptimizerStep().create_graph(w, g, **hyper, **extra)
        state = facts.init()
        graph.bind(state).call(w, g, *extra.values())
    session = popxl.Session(ir, "ipu_hw")
    weights = []
    with session:
        for grad in grads:
            inputs = {g_stream: grad * np.float32(scale_grads)}
            if norm_of is not None:
                session.write_variable_data(norm, np.float32(norm_of(grad) * scale_grads))
            session.run(inputs)
            weights.append(session.get_tensor_data(w).copy())
    return weights, facts, state, session, graph


def _numpy_adamw(
    grads, lr, beta1=0.9, beta2=0.999, eps=1e-5, weight_decay=1e-2, bias_correction=True, clip=None
):
    w, m, v = _w0().astype(np.float64), 0.0, 0.0
    out = []
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64) * (clip(g) if clip else 1.0)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        mh, vh = (m / (1 - beta1**t), v / (1 - beta2**t)) if bias_correction else (m, v)
        w = w - lr * (mh / (np.sqrt(vh) + eps) + weight_decay * w)
        out.append(w.copy())
    return out


def _torch_adamw(grads, lr, beta1, beta2, eps, weight_decay):
    p = torch.nn.Parameter(torch.from_numpy(_w0()))
    opt = torch.optim.AdamW([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    out = []
    for g in grads:
        p.grad = torch.from_numpy(g)
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


def test_matches_torch_adamw_over_several_steps():
    hyper = dict(lr=0.05, beta1=0.8, beta2=0.99, eps=1e-5, weight_decay=0.1)
    grads = _grads(0)
    ours, *_ = _run_popxl(grads, first_order_dtype=popxl.float32, **hyper)
    ref_torch = _torch_adamw(grads, **hyper)
    ref_np = _numpy_adamw(grads, **hyper)
    for step, (a, b, c) in enumerate(zip(ours, ref_torch, ref_np)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    assert not np.allclose(ours[0], _w0())  # it moved


def test_state_variables_and_defaults():
    grads = _grads(1)[:2]
    ours, facts, state, session, graph = _run_popxl(grads, lr=1e-2)
    assert sorted(facts.keys_flat()) == ["first_order", "second_order", "step"]
    assert all(f.by_ref for f in facts.values_flat())
    assert facts.first_order.dtype is popxl.float16  # the default first_order_dtype
    assert facts.second_order.dtype is popxl.float32
    assert session.get_tensor_data(state.step) == 2.0  # adam_updater counts the steps
    ref = _numpy_adamw(grads, lr=1e-2)
    np.testing.assert_allclose(ours[-1], ref[-1], rtol=1e-3, atol=1e-4)  # float16 m
    types = [op.type for op in graph.graph.ops]
    assert types == ["Accumulate", "Accumulate", "AdamUpdater", "ScaledAddLhsInplace"]


def test_without_bias_correction_or_weight_decay():
    grads = _grads(2)
    ours, facts, *_ = _run_popxl(
        grads, lr=0.02, bias_correction=False, weight_decay=0.0, first_order_dtype=popxl.float32
    )
    assert "step" not in facts
    ref = _numpy_adamw(grads, lr=0.02, bias_correction=False, weight_decay=0.0)
    np.testing.assert_allclose(ours[-1], ref[-1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_loss_scaling_is_undone(as_tensor):
    grads, scale = _grads(3), 128.0
    if as_tensor:
        ours = _run_scaled_tensor(grads, scale, lr=0.05, first_order_dtype=popxl.float32)
    else:
        ours, *_ = _run_popxl(
            grads, scale_grads=scale, loss_scaling=scale, lr=0.05, first_order_dtype=popxl.float32
        )
    ref = _numpy_adamw(grads, lr=0.05)
    np.testing.assert_allclose(ours[-1], ref[-1], rtol=1e-5, atol=1e-6)


def _run_scaled_tensor(grads, scale, **hyper):
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(_w0(), name="w")
        s = popxl.variable(np.float32(scale), name="loss_scaling")
        g_stream = popxl.h2d_stream(SHAPE, popxl.float32, "grad")
        g = ops.host_load(g_stream, "g")
        facts, graph = AdamOptimizerStep().create_graph(w, g, loss_scaling=s, **hyper)
        graph.bind(facts.init()).call(w, g, s)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        for grad in grads:
            session.run({g_stream: grad * np.float32(scale)})
        return [session.get_tensor_data(w).copy()]


@pytest.mark.parametrize("norm_max", [0.5, 100.0])
def test_global_norm_clipping(norm_max):
    grads = _grads(4)

    def norm(g):
        return float(np.sqrt((g.astype(np.float64) ** 2).sum()))

    ours, *_ = _run_popxl(
        grads,
        scale_grads=8.0,
        norm_of=norm,
        lr=0.05,
        loss_scaling=8.0,
        global_norm_max=norm_max,
        first_order_dtype=popxl.float32,
    )
    ref = _numpy_adamw(grads, lr=0.05, clip=lambda g: min(1.0, norm_max / norm(g)))
    np.testing.assert_allclose(ours[-1], ref[-1], rtol=1e-5, atol=1e-6)
    if norm_max < 1:  # per-step clip factors differ, so Adam's result changes
        unclipped = _numpy_adamw(grads, lr=0.05)
        assert not np.allclose(ref[-1], unclipped[-1], rtol=1e-6, atol=1e-7)


def test_global_norm_needs_a_max():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(_w0(), name="w")
        n = popxl.variable(np.float32(1.0), name="n")
        with pytest.raises(ValueError, match="global_norm_max"):
            AdamOptimizerStep().create_graph(w, w.spec, lr=0.1, global_norm=n)
