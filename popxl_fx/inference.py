"""`popxl_fx.inference_model`: a torch model's forward as one PopXL program on the simulator.

One program per input signature (shapes, dtypes, train/eval mode); a new signature builds a
new program and logs why. Before each call the program takes the torch weights that changed
since it last ran; after a call in train mode the torch buffers take the simulated ones
(batch-norm running statistics), as eager torch would have updated them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import popxl_core as popxl

from .checks import check_inputs, integer_inputs_explained
from .module import Module
from .options import Options, resolve
from .program import (
    Inputs,
    ProgramView,
    Weights,
    describe_change,
    load_inputs,
    log,
    make_session,
    signature_of,
    store,
)
from .replication import check_batch, concat_replicas, replica_examples, split_feeds

__all__ = ["InferenceModel", "inference_model"]


@dataclass
class _Program:
    signature: tuple
    ir: popxl.Ir
    session: popxl.Session
    inputs: Inputs
    outputs: list[popxl.DeviceToHostStream]
    weights: Weights
    module: Module
    forward: Any  # the forward GraphWithNamedArgs


def _versions(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Identity and in-place version of each tensor: what changes when torch updates it."""
    return {n: (id(t), t._version) for n, t in tensors.items()}


class InferenceModel(ProgramView):
    """The callable `inference_model` returns: ``model(*inputs)`` runs the forward on the
    simulator and returns torch tensors in the structure the torch forward returns."""

    _not_called = "the inference model has not been called yet: call it once first."

    def __init__(self, model: nn.Module, options: Options | None = None) -> None:
        self._model = model
        self.options = resolve(options, "inference_model")
        self._programs: dict[tuple, _Program] = {}
        self._active: _Program | None = None
        self._synced: dict[str, tuple[int, int]] = {}

    def __call__(self, *inputs: torch.Tensor) -> Any:
        prog = self._program(inputs)
        self._weights_from_torch(prog)
        replicas = self.options.replication_factor
        out = prog.session.run(split_feeds(prog.inputs.feed(inputs), replicas))
        if any(m.training for m in self._model.modules()):
            # with replication: replica 0's buffers (statistics of the batch's first share)
            prog.weights.to_torch(prog.session, kinds=("buffer",))
            self._synced = _versions(prog.weights.tensors)
        leaves = [concat_replicas(out[s], replicas) for s in prog.outputs]
        return prog.module.unflatten(leaves)

    # programs ------------------------------------------------------------------------
    def _program(self, inputs: Sequence[torch.Tensor]) -> _Program:
        sig = signature_of(self._model, inputs)
        if self._active is not None and self._active.signature == sig:
            return self._active
        if self._active is not None:
            log.info(
                "inference_model: recompiling, %s", describe_change(self._active.signature, sig)
            )
        prog = self._programs.get(sig) or self._build(sig, inputs)
        self._programs[sig] = prog
        self._active, self._synced = prog, {}
        return prog

    def _build(self, sig: tuple, inputs: Sequence[torch.Tensor]) -> _Program:
        check_inputs(self._model, inputs)
        check_batch(inputs, self.options, training=False)
        inputs = replica_examples(inputs, self.options.replication_factor)  # one replica's
        ir = popxl.Ir(replication=self.options.replication_factor)
        with ir.main_graph, popxl.in_sequence():
            ins = load_inputs(inputs, [f"input{i}" for i in range(len(inputs))])
            fxm = Module(self._model, flatten_outputs=True)
            with integer_inputs_explained(self._model, inputs):
                fxm.capture(*inputs)  # trace on the real inputs (valid indices, real branches)
                facts, graph = fxm.create_graph(*ins.tensors)
            variables = facts.init()
            outs = graph.bind(variables).call(*ins.tensors)
            streams = [store(t, f"output{i}") for i, t in enumerate(outs)]
            weights = Weights.from_named(variables.to_dict(), fxm.torch_names())
        session = make_session(ir, self.options)
        session.__enter__()  # stays attached: the weights live on the device between calls
        return _Program(sig, ir, session, ins, streams, weights, fxm, graph)

    def _weights_from_torch(self, prog: _Program) -> None:
        now = _versions(prog.weights.tensors)
        changed = [n for n, v in now.items() if self._synced.get(n) != v]
        if changed:
            prog.session.write_variables_data(
                {prog.weights.variables[n]: _numpy(prog.weights.tensors[n]) for n in changed}
            )
        self._synced = now


def _numpy(t: torch.Tensor) -> Any:
    return t.detach().cpu().contiguous().numpy()


def inference_model(model: nn.Module, options: Options | None = None) -> InferenceModel:
    """``model``'s forward as a PopXL program on the simulated IPU; call it like the model.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 2)).eval()
        >>> sim = popxl_fx.inference_model(net)
        >>> torch.equal(sim(torch.ones(3, 4)), net(torch.ones(3, 4)))
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"inference_model expects a torch.nn.Module, got {type(model).__name__}.")
    return InferenceModel(model, options)
