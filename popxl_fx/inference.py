"""`popxl_fx.inference_model`: a torch model's forward as one PopXL program on the simulator.

One program per input signature (shapes, dtypes, train/eval mode); a new signature builds a
new program and logs why. Before each call the program takes the torch weights that changed
since it last ran; after a call in train mode the torch buffers take the simulated ones
(batch-norm running statistics), as eager torch would have updated them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .options import Options, resolve
from .pipeline import Build, Programs
from .program import ProgramView, signature_of
from .replication import from_replicas
from .steps import Program, build_inference

__all__ = ["InferenceModel", "inference_model"]


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
        self._programs: Programs[Program] = Programs("inference_model")
        self._synced: dict[str, tuple[int, int]] = {}

    def __call__(self, *inputs: torch.Tensor) -> Any:
        prog = self._program(inputs)
        self._weights_from_torch(prog)
        out = prog.session.run(prog.inputs.feed(inputs))
        if any(m.training for m in self._model.modules()):
            # with replication: replica 0's buffers (the statistics of the batch's first share)
            prog.weights.to_torch(prog.session, kinds=("buffer",))
            self._synced = _versions(prog.weights.tensors)
        replicas = self.options.replication_factor
        batch = inputs[0].shape[0] // replicas if replicas > 1 else 0
        leaves = [from_replicas(k, out[s], replicas, batch) for k, s in prog.outputs.items()]
        return prog.lowered.fxm.unflatten(leaves)

    # programs ------------------------------------------------------------------------
    @property
    def _active(self) -> Program | None:
        return self._programs.active

    def _program(self, inputs: Sequence[torch.Tensor]) -> Program:
        sig = signature_of(self._model, inputs)
        return self._programs.get(sig, lambda: self._build(sig, inputs), enter=self._entered)

    def _entered(self, prog: Program) -> None:
        self._synced = {}  # the program takes every torch weight before its next call

    def _build(self, sig: tuple, inputs: Sequence[torch.Tensor]) -> Program:
        build = Build("inference_model", self._model, self.options)
        return build_inference(build, sig, inputs)

    def _weights_from_torch(self, prog: Program) -> None:
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
