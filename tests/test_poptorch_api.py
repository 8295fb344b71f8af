"""popxl_fx.poptorch's options, data loader, blocks, ops, errors and import hook."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch
from popxl_fx import compat
from popxl_fx.poptorch import _notes


def test_options_chain_and_read_back():
    opts = poptorch.Options().deviceIterations(4).replicationFactor(2).randomSeed(5)
    opts.Training.gradientAccumulation(3)
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (4, 2, 5)
    assert opts.Training.gradient_accumulation == 3
    assert opts.defaultOutputMode()
    assert opts.anchorMode(poptorch.AnchorMode.Sum).output_mode == poptorch.OutputMode.Sum
    with pytest.raises(ValueError, match="positive int"):
        opts.deviceIterations(0)
    clone = opts.clone()
    opts._freeze()
    with pytest.raises(AttributeError, match="frozen"):
        opts.deviceIterations(2)
    assert clone.deviceIterations(2).device_iterations == 2


def test_poplar_only_setters_note_once():
    _notes.reset()
    opts = poptorch.Options()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opts.setAvailableMemoryProportion({"IPU0": 0.3})
        opts.setAvailableMemoryProportion({"IPU0": 0.3})
        opts._Popart.set("a", 1)
        opts.enableExecutableCaching("/tmp/x").logDir("/tmp")
    notes = [str(w.message) for w in seen if issubclass(w.category, _notes.PopTorchCompatWarning)]
    assert len(notes) == 4 and "setAvailableMemoryProportion" in notes[0]


def test_dataloader_combined_batch():
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(3)
    data = torch.utils.data.TensorDataset(torch.arange(40.0))
    loader = poptorch.DataLoader(opts, data, batch_size=2)
    assert loader.combinedBatchSize == 12
    batches = [b[0] for b in loader]
    assert len(batches) == 3 and torch.equal(batches[0], torch.arange(12.0))  # drop_last


def test_wrong_combined_batch_says_what_poptorch_requires():
    model = nn.Linear(4, 2).eval()
    ipu = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(3))
    with pytest.raises(poptorch.Error, match=r"multiple of deviceIterations\(3\)"):
        ipu(torch.ones(4, 4))


def test_inference_refuses_accumulation():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="gradientAccumulation to 1"):
        poptorch.inferenceModel(nn.Linear(2, 2), opts)


def test_pipeline_needs_micro_batches():
    class Four(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(4))
            for i, layer in enumerate(self.layers):
                poptorch.BeginBlock(layer, f"B{i}", ipu_id=i)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return poptorch.identity_loss(x, reduction="mean")

    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    ipu = poptorch.trainingModel(Four(), opts)
    with pytest.raises(poptorch.poptorch_core.Error, match=r"pipeline stages \(7\)"):
        ipu(torch.ones(4, 2))


def test_ops_compute_their_values():
    x = torch.randn(3, 4)
    assert poptorch.nop(x) is x
    assert poptorch.recomputationCheckpoint(x) is x
    assert torch.equal(poptorch.identity_loss(x, "sum"), x.sum())
    y = torch.randn(4, 2)
    mm = poptorch.serializedMatMul(x, y, poptorch.MatMulSerializationMode.OutputChannels, 2)
    assert torch.equal(mm, x @ y)
    out = poptorch.for_loop(3, lambda a: a * 2, [x])
    assert torch.equal(out[0], x * 8)
    with pytest.raises(poptorch.Error, match="custom_op"):
        poptorch.custom_op([x], "Foo", "dom", 1, [x])
    with pytest.raises(ValueError, match="reduction"):
        poptorch.identity_loss(x, "max")


class _SummedLoss(nn.Module):
    """``inner``'s output as the loss (PopTorch trains only a graph with a loss in it)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return poptorch.identity_loss(self.inner(x), reduction="sum")


def test_optimizer_velocity_dtype_is_the_momentum_storage():
    model = nn.Linear(2, 1)
    opt = poptorch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, velocity_accum_type=torch.float16
    )
    poptorch.trainingModel(_SummedLoss(model), optimizer=opt)(torch.ones(2, 2))
    assert opt.state[model.weight]["momentum_buffer"].dtype == torch.float16


def test_hook_resolves_poptorch_and_popxl():
    compat.install()
    try:
        import poptorch as hooked
        import poptorch.optim as hooked_optim
        import popxl

        assert hooked is poptorch and hooked_optim is poptorch.optim
        assert hooked.poptorch_core.Error is poptorch.Error
        assert repr(popxl.float32) == "popxl.dtypes.float32"
        assert not hooked.ipuHardwareIsAvailable()
    finally:
        compat.uninstall()


class _Pair:
    """A custom argument type holding two tensors."""

    def __init__(self, a, b) -> None:
        self.a, self.b = a, b


class _PairParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct):
        yield struct.a
        yield struct.b

    def reconstruct(self, original_structure, tensor_iterator):
        return _Pair(next(tensor_iterator), next(tensor_iterator))


def test_custom_arguments_and_compile_hooks():
    class Adds(nn.Module):
        def forward(self, pair, scale=None):
            return (pair.a + pair.b) * scale

    poptorch.registerCustomArgParser(_Pair, _PairParser())
    calls = []
    pre = poptorch.registerPreCompileHook(lambda: calls.append("pre"))
    post = poptorch.registerPostCompileHook(lambda: calls.append("post"))
    try:
        ipu = poptorch.inferenceModel(Adds())
        a, b, s = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
        assert torch.equal(ipu(_Pair(a, b), scale=s), (a + b) * s)
        assert torch.equal(ipu(_Pair(b, a), scale=s), (b + a) * s)
    finally:
        poptorch.registerCustomArgParser(_Pair, None)
        pre.remove()
        post.remove()
    assert calls == ["pre", "post"]  # compiled once


def test_executable_files_are_refused_by_name():
    ipu = poptorch.inferenceModel(nn.Linear(2, 2))
    for call in (lambda: ipu.save("x.popef"), lambda: poptorch.load("x.popef")):
        with pytest.raises(poptorch.Error, match="not available"):
            call()


def test_dataloader_gives_each_process_its_block():
    opts = poptorch.Options().deviceIterations(2)
    opts.Distributed.configureProcessId(1, 2)
    data = torch.utils.data.TensorDataset(torch.arange(40.0))
    batches = [b[0] for b in poptorch.DataLoader(opts, data, batch_size=2)]
    assert len(batches) == 5 and torch.equal(batches[0], torch.arange(20.0, 24.0))
    with pytest.raises(poptorch.Error, match="one process"):
        poptorch.inferenceModel(nn.Linear(2, 2), opts)


def test_hooks_must_be_callable():
    with pytest.raises(RuntimeError, match="must be callable"):
        poptorch.registerPreCompileHook(3)


def test_cond_on_a_computed_condition_takes_its_branch():
    class Branches(nn.Module):
        def forward(self, x, c):
            then, other = (lambda a: a * 2), (lambda a: a - 1)
            return poptorch.cond(c.sum() > 0, then, [x], other, [x])[0]

    model = Branches()
    ipu = poptorch.inferenceModel(model)
    x = torch.randn(3)
    for c in (torch.ones(2), -torch.ones(2)):
        assert torch.equal(ipu(x, c), model(x, c))
