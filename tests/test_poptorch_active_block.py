"""popxl_fx.poptorch: once a ``with poptorch.Block`` has ended, an op before the next block
starts raises PopTorch's "No active Block" error; ops in blocks, or with no block at all,
run as eager does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Scoped(nn.Module):
    """``tail``: an op after the last block's scope has ended."""

    def __init__(self, tail: bool, restart: bool = False) -> None:
        super().__init__()
        self.tail, self.restart = tail, restart

    def forward(self, x):
        poptorch.Block.useAutoId()
        with poptorch.Block(ipu_id=0):
            x = x * 4
        if self.restart:
            poptorch.Block.start(ipu_id=1)  # a block started again: its ops have a block
        if self.tail:
            x = x + 1
        return x


def _pipelined(iterations: int = 2) -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(iterations)
    return opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))


def test_an_op_after_a_block_scope_ends_raises():
    ipu = poptorch.inferenceModel(_Scoped(tail=True), _pipelined())
    with pytest.raises(poptorch.Error, match="No active Block, all the ops must belong"):
        ipu.compile(torch.randn(2, 5))


def test_an_op_in_a_block_started_again_runs():
    x = torch.randn(4, 5)
    out = poptorch.inferenceModel(_Scoped(tail=True, restart=True), _pipelined())(x)
    assert torch.equal(out, x * 4 + 1)


def test_returning_after_a_block_scope_runs():
    x = torch.randn(2, 5)
    assert torch.equal(poptorch.inferenceModel(_Scoped(tail=False), _pipelined(1))(x), x * 4)


def test_a_training_loss_after_the_blocks_is_the_wrappers_not_the_models():
    class Fit(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            with poptorch.Block(ipu_id=0):
                # a loss of 'none' reduction: the step sums it outside the model's code
                return poptorch.identity_loss(self.lin(x), reduction="none")

    ipu = poptorch.trainingModel(Fit())
    assert ipu(torch.randn(2, 3)).shape == (2, 3)
