"""``Options(precision="float16", loss_scaling=S)`` against eager PyTorch doing the same
float16 arithmetic by hand, and against the float32 program.

The reference (`_half_step`): a ``model.half()`` copy of the float32 master model made every
step, its forward and loss in float16 on float16 inputs, ``(loss * S).backward()`` in float16,
``p.grad = half_p.grad.float() / S`` and the torch optimizer stepping the float32 masters.
Under ``Ir.numerics == "torch"`` (popxl_fx's) the simulator runs torch's own float16 kernels,
so this is the same arithmetic op for op: losses and parameters are compared bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import popxl_core as popxl
import popxl_fx
from popxl_fx.trainer import Trainer

from .fx_train_util import max_diff, train_eager, train_fx
from .fx_zoo import GPT, SeedMLP, small_cnn


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def _adam(ps):
    return torch.optim.Adam(ps, lr=1e-3)


def _mlp_batches(n: int, batch: int = 16):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
        for _ in range(n)
    ]


def _half_step(scale: float, loss_fn=F.cross_entropy):
    """Eager float16 training by hand (no autocast): see the module docstring."""

    def step(model, batch):
        half = copy.deepcopy(model).half()
        batch = [x.half() if x.is_floating_point() else x for x in batch]
        if loss_fn is None:  # forward returns (loss, ...)
            out = half(*batch)[0]
        else:
            out = loss_fn(half(*batch[:-1]), batch[-1])
        (out * scale).backward()
        for p, h in zip(model.parameters(), half.parameters()):
            p.grad = h.grad.float() / scale
        with torch.no_grad():  # BatchNorm's running statistics, as model.half() kept them
            for b, h in zip(model.buffers(), half.buffers()):
                b.copy_(h)
        return out.detach()

    return step


def _assert_same(a, b):
    assert all(torch.equal(x, y) for x, y in zip(a, b)), max_diff(a, b)


@pytest.mark.parametrize("optimizer", [_sgd, _adam], ids=["sgd_momentum", "adam"])
@pytest.mark.parametrize("scale", [1024.0, 1000.0])
def test_seed_mlp_is_eager_float16_training_bit_for_bit(optimizer, scale):
    torch.manual_seed(0)
    model, batches = SeedMLP(), _mlp_batches(3)
    ref_losses, ref = train_eager(model, batches, optimizer, _half_step(scale))
    losses, state, _ = train_fx(
        model, batches, F.cross_entropy, optimizer, precision="float16", loss_scaling=scale
    )
    _assert_same(losses, ref_losses)
    assert all(torch.equal(state[k], ref[k]) for k in ref)
    assert losses[0].dtype == torch.float16  # the float16 program's loss, as eager's


def test_gpt_decoder_is_eager_float16_training_bit_for_bit():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    batches = [tuple(torch.randint(0, 64, (4, 16), generator=g) for _ in range(2))] * 3
    model = GPT()
    ref_losses, ref = train_eager(model, batches, _sgd, _half_step(512.0, None))
    losses, state, _ = train_fx(model, batches, None, _sgd, precision="float16", loss_scaling=512.0)
    _assert_same(losses, ref_losses)
    assert all(torch.equal(state[k], ref[k]) for k in ref)


def test_batchnorm_cnn_keeps_float16_running_statistics_like_model_half():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    batches = [
        (torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g))
        for _ in range(3)
    ]
    model = small_cnn()
    ref_losses, ref = train_eager(model, batches, _sgd, _half_step(256.0))
    losses, state, _ = train_fx(
        model, batches, F.cross_entropy, _sgd, precision="float16", loss_scaling=256.0
    )
    _assert_same(losses, ref_losses)
    assert all(torch.equal(state[k], ref[k]) for k in ref)
    assert state["1.running_var"].dtype == torch.float32  # torch's format, float16 values


def test_the_gradients_the_optimizer_gets_are_eager_half_gradients_unscaled():
    torch.manual_seed(0)
    model, (x, y) = SeedMLP(), _mlp_batches(1)[0]
    scale = 1024.0
    m = copy.deepcopy(model)
    options = popxl_fx.Options(device="cpu", precision="float16", loss_scaling=scale)
    trainer = Trainer(m, _sgd(m.parameters()), F.cross_entropy, options, record=True)
    trainer(x, y)
    half = copy.deepcopy(model).half()
    (F.cross_entropy(half(x.half()), y) * scale).backward()
    for name, p in half.named_parameters():
        got = trainer.last[f"grad.{name}"]
        assert got.dtype == torch.float32
        assert torch.equal(got, p.grad.float() / scale), name


def test_torch_numerics_sum_float16_embedding_gradients_as_eager():
    """ScatterReduce's ``"torch"`` kernel: float16 rows summed one after another (eager's
    embedding backward), where torch's scatter_reduce rounds differently; others unchanged."""
    from popxl_core.ops.registry import get_opdef

    opdef = get_opdef("ScatterReduce")
    g = torch.Generator().manual_seed(5)
    grad = (torch.randn(64, 8, generator=g) * 100).half()
    idx = torch.randint(0, 10, (64,), generator=g, dtype=torch.int32)
    attrs = {"reduction": "sum", "axis": 0, "axis_size": 10, "enable_index_broadcast": True}
    want = torch.ops.aten.embedding_dense_backward(grad, idx.long(), 10, -1, False)
    assert torch.equal(opdef.kernel_for("torch")(grad, idx, **attrs), want)
    assert not torch.equal(opdef.kernel_for("ipu")(grad, idx, **attrs), want)  # not vacuous
    x = grad.float()
    assert torch.equal(opdef.kernel_for("torch")(x, idx, **attrs), opdef.kernel(x, idx, **attrs))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("n", [64, 5000])  # eager's kernel has another path past 3000 rows
def test_torch_numerics_embedding_gradient_cuts_off_out_of_range_indices(dtype, n):
    """The ``"torch"`` kernel is eager's embedding backward, which adds only rows whose index
    is in range: indices below 0 and at or past ``axis_size`` are cut off as the default
    kernel cuts them, whatever the dtype and index count."""
    from popxl_core.ops.registry import get_opdef

    opdef = get_opdef("ScatterReduce")
    g = torch.Generator().manual_seed(6)
    data = torch.randn(n, 2, 3, generator=g).to(dtype)
    idx = torch.randint(-3, 13, (n,), generator=g, dtype=torch.int32)
    attrs = {"reduction": "sum", "axis": 0, "axis_size": 10, "enable_index_broadcast": True}
    got = opdef.kernel_for("torch")(data, idx, **attrs)
    want = torch.zeros(10, 2, 3, dtype=dtype)
    for row, i in zip(data, idx.tolist()):  # one add after another, each rounded to dtype
        if 0 <= i < 10:
            want[i] += row
    assert got.shape == (10, 2, 3) and bool(((idx < 0) | (idx >= 10)).any())
    assert torch.equal(got, want)
    if dtype != torch.float16:  # float16: torch's scatter_reduce rounds differently
        assert torch.equal(got, opdef.kernel(data, idx, **attrs))


def test_within_a_stated_bound_of_the_float32_run_after_20_steps():
    torch.manual_seed(0)
    model, batches = SeedMLP(), _mlp_batches(20)
    losses32, state32, _ = train_fx(model, batches, F.cross_entropy, _sgd)
    losses16, state16, _ = train_fx(
        model, batches, F.cross_entropy, _sgd, precision="float16", loss_scaling=1024.0
    )
    # measured: losses differ by at most 3.4e-3 (float16's spacing at 2.3 is 2e-3: under two
    # steps of it), weights (O(0.05)) by at most 8.7e-5, while training moved them by 0.13
    assert max_diff(losses16, losses32) <= 8e-3
    assert max_diff(state16, state32) <= 4e-4
    assert max_diff(state32, model.state_dict()) > 0.1


def test_master_weights_optimizer_state_and_accumulation_are_float32():
    torch.manual_seed(0)
    model = SeedMLP()
    _, state, trainer = train_fx(
        model, _mlp_batches(1), F.cross_entropy, _sgd, precision="float16", loss_scaling=8.0
    )
    prog = trainer._active
    args = prog.forward.args.to_dict()
    assert {t.dtype for n, t in args.items() if n.endswith("weight")} == {popxl.float32}
    casts = [op for op in prog.forward.graph.ops if op.type == "Cast"]
    assert {op.outputs[0].dtype for op in casts} == {popxl.float16} and len(casts) == 8
    assert prog.forward.graph.outputs[0].dtype == popxl.float16  # activations and loss
    assert {v.dtype for v in prog.optim.variables()} == {popxl.float32}
    assert {t.dtype for t in state.values()} == {torch.float32}
    momentum = trainer.optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert momentum.dtype == torch.float32


@pytest.mark.parametrize(
    "split", [{"batch_serialisation": 4}, {"gradient_accumulation": 4}], ids=lambda d: [*d][0]
)
def test_with_slices_or_micro_batches_equals_the_float16_plain_program(split):
    torch.manual_seed(0)
    model, batches = SeedMLP(), _mlp_batches(3)
    opts = {"precision": "float16", "loss_scaling": 1024.0}
    plain_losses, plain, _ = train_fx(model, batches, F.cross_entropy, _sgd, **opts)
    losses, state, trainer = train_fx(model, batches, F.cross_entropy, _sgd, **split, **opts)
    # float32 accumulators of the slices' float16 gradients: measured worst 0 on the losses
    # (bound: one float16 step at 2.3, for the mean of 4 float16 losses against one) and
    # 7.1e-6 on the weights (float16 rounding of per-slice against whole-batch sums)
    assert max_diff(losses, plain_losses) <= 2e-3
    assert max_diff(state, plain) <= 2e-5
    accum = [t for n, t in trainer._active.backward.args.to_dict().items() if "accum." in n]
    assert accum and {t.dtype for t in accum} == {popxl.float32}


def test_with_slices_only_activations_go_to_streaming_memory():
    """The backward's float16 weight copies are cast once per step from the masters, not
    stored per slice like activations: Streaming Memory holds half the float32 program's."""
    torch.manual_seed(0)
    model, batches = SeedMLP(), _mlp_batches(1, batch=64)
    *_, f32 = train_fx(model, batches, F.cross_entropy, _sgd, batch_serialisation=4)
    *_, f16 = train_fx(
        model,
        batches,
        F.cross_entropy,
        _sgd,
        batch_serialisation=4,
        precision="float16",
        loss_scaling=1024.0,
    )
    a, b = (t.report().totals()["streaming_memory_bytes"] for t in (f32, f16))
    # measured 0.57 MiB against 1.14 MiB (the int64 labels are the same size in both)
    assert b <= 0.51 * a


@pytest.mark.parametrize("name", ["seed_mlp", "bn_cnn_eval"])
def test_inference_is_model_half_bit_for_bit_from_float32_weights(name):
    torch.manual_seed(0)
    model = SeedMLP() if name == "seed_mlp" else small_cnn().eval()
    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(4))
    infer = popxl_fx.inference_model(model, popxl_fx.Options(device="cpu", precision="float16"))
    assert torch.equal(infer(x), copy.deepcopy(model).half()(x.half()))
    with torch.no_grad():  # a change to the float32 weights reaches the next call
        next(model.parameters()).mul_(0.5)
    out = infer(x)
    assert out.dtype == torch.float16 and torch.equal(out, copy.deepcopy(model).half()(x.half()))
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_loss_scale_float16_cannot_hold_is_refused_at_build():
    model = SeedMLP()
    trainer = popxl_fx.training_model(
        model,
        _sgd(model.parameters()),
        F.cross_entropy,
        popxl_fx.Options(device="cpu", precision="float16", loss_scaling=2.0**17),
    )
    with pytest.raises(ValueError, match="larger than float16 can hold"):
        trainer(*_mlp_batches(1)[0])


def test_other_entry_points_refuse_float16():
    with pytest.raises(ValueError, match="compile refuses it"):
        popxl_fx.compile(SeedMLP(), popxl_fx.Options(precision="float16"))
