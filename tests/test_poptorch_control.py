"""PopTorch's execution-strategy behaviour on popxl_fx: ``for_loop`` and ``cond`` as PopTorch
checks and runs them, and the pipeline rules read from the ``Block`` scopes a forward enters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Loop(nn.Module):
    def forward(self, x):
        def body(y):
            y += 1  # the body's inputs are copies: x is left as it was
            return y

        return poptorch.for_loop(3, body, [x])[0]


def test_for_loop_passes_its_inputs_by_value():
    x = torch.ones(1, 5, dtype=torch.int32)
    out = poptorch.inferenceModel(_Loop())(x)
    assert torch.equal(x, torch.ones(1, 5, dtype=torch.int32))
    assert torch.equal(out, torch.full((1, 5), 4, dtype=torch.int32))


class _Checked(nn.Module):
    def __init__(self, inputs):
        super().__init__()
        self.inputs = inputs

    def forward(self, x):
        return poptorch.for_loop(2, lambda *v: v, self.inputs(x))[0]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (lambda x: x, r"\(Object is not list\)"),
        (lambda x: [x, 5], r"\(Object contained in list at index 1 is not torch.tensor\)"),
    ],
)
def test_for_loop_takes_a_list_of_tensors(inputs, message):
    with pytest.raises(ValueError, match=message):
        poptorch.inferenceModel(_Checked(inputs))(torch.ones(2))


class _Trained(nn.Module):
    def __init__(self, use_cond: bool):
        super().__init__()
        self.lin, self.use_cond = nn.Linear(4, 4), use_cond

    def forward(self, condition, x):
        if self.use_cond:
            out = poptorch.cond(condition, self.lin, [x], self.lin, [x])[0]
        else:
            out = poptorch.for_loop(2, self.lin, [x])[0]
        return out, poptorch.identity_loss(out, reduction="sum")


@pytest.mark.parametrize(("use_cond", "name"), [(True, "cond"), (False, "for_loop")])
def test_control_flow_is_inference_only(use_cond, name):
    model = poptorch.trainingModel(_Trained(use_cond))
    with pytest.raises(poptorch.Error, match=rf"poptorch.{name}\(\) is only supported in infer"):
        model(torch.tensor([True]), torch.ones(1, 4))


class _TwoStages(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(1, 1), nn.Linear(1, 1)

    def forward(self, x):
        with poptorch.Block("B1", ipu_id=0):
            out = self.lin1(x)
        with poptorch.Block("B2", ipu_id=1):
            out = self.lin2(out)
            return out, poptorch.identity_loss(out, reduction="mean")


def test_block_scopes_count_as_pipeline_stages_in_training():
    opts = poptorch.Options()
    assert isinstance(opts._execution_strategy, poptorch.PipelinedExecution)
    opts.Training.gradientAccumulation(2)
    model = poptorch.trainingModel(_TwoStages(), opts)
    with pytest.raises(poptorch.Error, match=r"number of pipeline stages \(3\)"):
        model(torch.zeros(2))
    sharded = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    sharded.Training.gradientAccumulation(2)  # no pipeline: no rule on the micro-batches
    poptorch.trainingModel(_TwoStages(), sharded)(torch.zeros(2))


def test_inference_with_accumulation_says_what_a_pipeline_needs():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="Use poptorch.Options\\(\\).deviceIterations to"):
        poptorch.inferenceModel(_TwoStages(), opts)


def test_phased_strategies_take_phases_as_lists_and_name_their_stages():
    strategy = poptorch.ParallelPhasedExecution(
        [poptorch.Stage("0"), poptorch.Stage("1")], [poptorch.Stage("2", "4"), poptorch.Stage("3")]
    )
    strategy.phase(1).ipus(1, 3)
    assert strategy.stage("4") is strategy.phase(1).stage(0)
    assert strategy.stage("3")._ipu == 3
    serial = poptorch.SerialPhasedExecution(["layer1"], ["layer2", "layer2.b"])
    assert serial.phase(1).stage(0).blocks == ("layer2", "layer2.b")
    with pytest.raises(ValueError, match="2 stages but you provided 1 ipus"):
        strategy.phase(0).ipus(0)


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.l2(self.l1(x))


def test_begin_block_marks_survive_copies_and_print():
    import copy

    model = _Twice()
    assert poptorch.BeginBlock(model.l1, user_id=1, ipu_id=1) is model.l1
    with pytest.raises(poptorch.Error, match="already been assigned to a block"):
        poptorch.BeginBlock(model.l1, ipu_id=2)
    for twin in (model, copy.copy(model), copy.deepcopy(model)):
        assert "(l1): BeginBlock(user_id=1, ipu_id=1) Linear(" in poptorch.module_repr(twin)
    assert "BeginBlock(user_id=1" in repr(poptorch.inferenceModel(model))
    poptorch.removeBlocks(model)
    assert "BeginBlock" not in poptorch.module_repr(model)
    block = poptorch.BeginBlock(torch.neg, "f", 2)  # a function: PopTorch's legacy form
    assert (block._user_id, block._ipu_id) == ("f", 2)
    assert torch.equal(block(torch.ones(2)), -torch.ones(2))


class _Overlap(nn.Module):
    def __init__(self, mark_input: bool):
        super().__init__()
        self.mark_input = mark_input

    def forward(self, x):
        mode = poptorch.OverlapMode.OverlapAccumulationLoop
        y = x + 1
        if self.mark_input:
            return poptorch.set_overlap_for_input(y, mode)
        poptorch.set_overlap_for_output(y, mode)
        return y.mean()


@pytest.mark.parametrize(("mark_input", "what"), [(True, "input"), (False, "output")])
def test_overlapped_io_marks_only_model_inputs_and_outputs(mark_input, what):
    model = poptorch.inferenceModel(_Overlap(mark_input))
    with pytest.raises(poptorch.Error, match=f"not a tensor {what} to the model"):
        model(torch.ones(2))


class _Losses(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.lin, self.kind = nn.Linear(4, 4), kind

    def forward(self, x, target):
        out = self.lin(x)
        if self.kind == "none":
            return out, out * 12 + target
        first = nn.functional.mse_loss(out, target)
        second = nn.L1Loss()(out, target) * 5.0
        if self.kind == "two":
            return out, first + second
        return out, poptorch.identity_loss(first + second, reduction="mean")


@pytest.mark.parametrize(
    ("kind", "message"),
    [("none", "Couldn't find a loss in graph!"), ("two", "Multiple independent losses found")],
)
def test_a_trained_graph_has_one_final_loss(kind, message):
    model = poptorch.trainingModel(_Losses(kind))
    with pytest.raises(poptorch.Error, match=message):
        model(torch.ones(2, 4), torch.zeros(2, 4))


def test_losses_feeding_an_identity_loss_fold_into_it():
    torch.manual_seed(0)
    model = _Losses("wrapped")
    eager = _Losses("wrapped")
    eager.load_state_dict(model.state_dict())
    x, target = torch.randn(2, 4), torch.randn(2, 4)
    _, loss = poptorch.trainingModel(model)(x, target)
    assert torch.equal(loss, eager(x, target)[1].detach())
