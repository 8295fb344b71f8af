"""Blocks and execution strategies: ``poptorch.Block``, ``BeginBlock``, ``BlockFunction``,
``Stage``, ``Phase``, ``PipelinedExecution``, ``ShardedExecution`` and the phased ones.

A block marks which IPU (and pipeline stage) a part of the model runs on. The simulator runs
the whole model as one program on one simulated chip: the values are those of the unsplit
model, which is what PopTorch's pipelining computes too (with gradient accumulation, its
micro-batches are the accumulation's). The blocks still count: PopTorch's rules on how many
micro-batches a pipeline needs are checked (`check_pipeline`).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from . import marks
from .enums import AutoStage, Liveness
from .errors import Error

__all__ = [
    "Block",
    "BlockFunction",
    "ExecutionStrategy",
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "SerialPhasedExecution",
    "ShardedExecution",
    "Stage",
    "check_in_block",
    "check_pipeline",
    "record",
]


def _check_ids(user_id, ipu_id) -> None:
    if ipu_id is not None and (not isinstance(ipu_id, int) or ipu_id < 0):
        raise ValueError(f"a block's ipu_id must be a non-negative int, not {ipu_id!r}.")


class Block(torch.nn.Module):
    """``with poptorch.Block(user_id, ipu_id):`` the code inside runs in that block."""

    _next_auto_id = 0

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None) -> None:
        super().__init__()
        _check_ids(user_id, ipu_id)
        self.user_id = user_id
        self.ipu_id = ipu_id

    @staticmethod
    def useAutoId() -> None:
        Block._next_auto_id = 0

    @staticmethod
    def start(user_id: str | None = None, ipu_id: int | None = None) -> None:
        record(user_id, ipu_id)

    def __enter__(self) -> Block:
        record(self.user_id, self.ipu_id)
        return self

    def __exit__(self, *exc) -> None:
        # PopTorch's compiler has no active IPU from here until the next block starts
        recording = marks.current()
        if recording is not None:
            recording.outside_block = True


def record(user_id, ipu_id) -> None:
    """Note, in the forward being traced, that block ``user_id`` on ``ipu_id`` starts."""
    recording = marks.current()
    if recording is not None:
        recording.blocks.append((user_id, ipu_id))
        recording.outside_block = False


def check_in_block(node: fx.Node, module: Any = None) -> None:
    """PopTorch's rule (a `popxl_fx.capture_watch` watcher): once a ``with Block`` has ended,
    an op of the model before the next block starts belongs to no block, and raises."""
    recording = marks.current()
    if recording is None or not recording.outside_block or not _is_op(node):
        return
    raise Error(
        f"No active Block, all the ops must belong to a Block ({node.meta.get('source', node)} "
        "runs after a `with poptorch.Block` ended and before the next block starts)."
    )


def _is_op(node: fx.Node) -> bool:
    """A node PopART would make an op of: a call, except unpacking a call's results."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], fx.Node) and _holds_tensor(node.args[0])
    return True


def _holds_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("example_value"), torch.Tensor)


def BlockFunction(user_id: str | None = None, ipu_id: int | None = None) -> Callable:
    """A decorator running the function inside ``Block(user_id, ipu_id)``."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


class Stage:
    """One pipeline stage: the blocks named, on one IPU."""

    def __init__(self, *block_ids: str) -> None:
        if not all(isinstance(b, str) for b in block_ids):
            raise ValueError(f"Stage takes block ids (str), got {block_ids}.")
        self._blocks = block_ids
        self._ipu: int | None = None

    @property
    def blocks(self) -> tuple:
        return self._blocks

    def ipu(self, ipu: int) -> Stage:
        self._ipu = ipu
        return self


class Phase:
    """One execution phase: stages that run together (block ids given: one stage of them)."""

    def __init__(self, *arg) -> None:
        if all(isinstance(s, Stage) for s in arg):
            self.stages = list(arg)
        elif all(isinstance(s, str) for s in arg):
            self.stages = [Stage(*arg)]
        else:
            raise ValueError(
                f"Phase takes Stages or block ids (str), not {[type(s).__name__ for s in arg]}."
            )

    def stage(self, idx: int) -> Stage:
        return self.stages[idx]

    def ipus(self, *ipus: int) -> Phase:
        if len(ipus) != len(self.stages):
            raise ValueError(
                f"Phase contains {len(self.stages)} stages but you provided {len(ipus)} ipus"
            )
        for stage, ipu in zip(self.stages, ipus):
            stage.ipu(ipu)
        return self


class ExecutionStrategy:
    """What ``Options.setExecutionStrategy`` takes."""

    pipelined = False

    def __init__(self, *args) -> None:
        self.auto_stage = AutoStage.SameAsIpu
        self.stages: list[Stage] = []
        for arg in args:
            if isinstance(arg, AutoStage):
                self.auto_stage = arg
            elif isinstance(arg, Stage):
                self.stages.append(arg)
            elif isinstance(arg, str):
                self.stages.append(Stage(arg))
            elif isinstance(arg, Phase):
                self.stages.extend(arg.stages)
            elif isinstance(arg, (list, tuple)) and all(isinstance(b, str) for b in arg):
                self.stages.append(Stage(*arg))  # a list of block ids: one stage
            else:
                raise ValueError(
                    f"{type(self).__name__} takes Stages, block ids, Phases or an AutoStage, "
                    f"not {type(arg).__name__}."
                )

    def stage(self, block_id: str) -> Stage:
        """The stage that holds block ``block_id``."""
        for stage in self.stages:
            if block_id in stage.blocks:
                return stage
        raise ValueError(f"Unknown block {block_id}")

    def backendOptions(self) -> dict:
        """PopTorch's serialised form (`Options.toDict`): 0 pipelined, 1 sharded."""
        return {"execution_mode": 0}


class PipelinedExecution(ExecutionStrategy):
    """Each stage on its IPU, micro-batches flowing through them."""

    pipelined = True


class ShardedExecution(ExecutionStrategy):
    """Each stage on its IPU, one micro-batch at a time (no pipelining)."""

    def backendOptions(self) -> dict:
        return {"execution_mode": 1}


class _PhasedExecution(ExecutionStrategy):
    """Each argument one phase: a Phase, a Stage, a block id or a list of either."""

    def __init__(self, *phases) -> None:
        self.phases = [_as_phase(p) for p in phases]
        super().__init__(*[s for p in self.phases for s in p.stages])
        self.separate_backward_phase = False
        self.liveness = Liveness.AlwaysLive

    def phase(self, phase: int) -> Phase:
        return self.phases[phase]

    def useSeparateBackwardPhase(self, use: bool = True):
        self.separate_backward_phase = bool(use)
        return self

    def backendOptions(self) -> dict:
        return {
            "execution_mode": 2,
            "separate_backward_phase": self.separate_backward_phase,
            "tensors_liveness": int(self.liveness),
            "serial_phases_execution": isinstance(self, SerialPhasedExecution),
        }


def _as_phase(arg) -> Phase:
    if isinstance(arg, Phase):
        return arg
    return Phase(*arg) if isinstance(arg, (list, tuple)) else Phase(arg)


class ParallelPhasedExecution(_PhasedExecution):
    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True):
        self.liveness = Liveness.OffChipAfterFwd if off_chip else Liveness.AlwaysLive
        return self


class SerialPhasedExecution(_PhasedExecution):
    def setTensorsLiveness(self, liveness: Liveness):
        self.liveness = Liveness(liveness)
        return self


def _stage_count(strategy: ExecutionStrategy, blocks: list) -> int:
    """How many forward stages the blocks the forward entered make: the strategy's stages,
    else (AutoStage.SameAsIpu, PopTorch's default) one per change of IPU, starting on IPU 0,
    or one per block id (AutoIncrement)."""
    if strategy.stages:
        return len(strategy.stages)
    if strategy.auto_stage == AutoStage.AutoIncrement:
        return max(1, len(dict.fromkeys(blocks)))
    ipus = [0] + [ipu for _, ipu in blocks if ipu is not None]
    return 1 + sum(a != b for a, b in zip(ipus, ipus[1:]))


def check_pipeline(options, blocks: list, training: bool) -> None:
    """PopTorch's rule for a pipeline (its default strategy whenever blocks use several
    IPUs): training runs 2S-1 stages for S forward stages and needs that many micro-batches
    (gradient accumulation); inference needs S device iterations."""
    strategy = options._execution_strategy
    if not strategy.pipelined:
        return
    forward = _stage_count(strategy, blocks)
    if training:
        stages = 2 * forward - 1
        if options.Training.gradient_accumulation < stages:
            raise Error(
                "poptorch.Options().Training.gradientAccumulation must be greater than or "
                f"equal to the number of pipeline stages ({stages}) when using "
                f"poptorch.PipelinedExecution. Please note that a model with {forward} "
                f"pipeline stages in PopTorch will have an additional {forward - 1} stages "
                "when training."
            )
    elif options.device_iterations < forward:
        raise Error(
            "poptorch.Options().deviceIterations must be greater than or equal to the number "
            f"of pipeline stages ({forward}) when using PopTorch.PipelinedExecution."
        )
