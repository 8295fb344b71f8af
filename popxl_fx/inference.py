"""`popxl_fx.inference_model`: a torch model's forward as one PopXL program on the simulator.

One program per input signature (shapes, dtypes, train/eval mode, torch's grad mode); a new
signature builds a new program and logs why. Torch's grad mode counts because eager picks
some kernels by it: called under ``torch.no_grad`` the program is eager's no_grad forward.
Before each call the program takes the torch weights that changed since it last ran; after a
call in train mode the torch buffers take the simulated ones (batch-norm running statistics),
as eager torch would have updated them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from popxl_core.ops import RuntimeCheckError

from .calls import POSITIONAL, Binding, bind
from .checks import check_no_autocast
from .guards import raise_model_error
from .options import Options, resolve
from .pipeline import Build, Programs
from .program import ProgramView, signature_of
from .refusals import refuse
from .replication import unreplicated
from .steps import Program, build_inference

__all__ = ["InferenceModel", "inference_model"]


class InferenceModel(ProgramView):
    """The callable `inference_model` returns: ``model(*inputs, **kwargs)`` runs the forward
    on the simulator and returns torch tensors in the structure the torch forward returns
    (tuples, dicts, namedtuples, dataclasses, HuggingFace ``ModelOutput``s). Keyword tensors
    are inputs too; other keyword values (``use_cache=False``) are constants of the program,
    and forward's parameters left out keep their defaults."""

    _not_called = "the inference model has not been called yet: call it once first."
    _entry = "inference_model"

    def __init__(self, model: nn.Module, options: Options | None = None) -> None:
        self._model = model
        self.options = resolve(options)
        refuse("inference_model", self.options)
        self._programs: Programs[Program] = Programs("inference_model")
        self.per_replica: list = []  # the last call's outputs as the device wrote them

    def __call__(self, *inputs: torch.Tensor, **kwargs: Any) -> Any:
        try:
            return self._run(*inputs, **kwargs)
        except RuntimeCheckError as failed:  # a model's `if bad: raise` (popxl_fx.guards)
            raise_model_error(lambda: self._model(*inputs, **kwargs), self._model, failed)

    def _run(self, *inputs: torch.Tensor, **kwargs: Any) -> Any:
        check_no_autocast("the inference model")
        inputs, binding = bind(inputs, kwargs)  # keyword tensors follow the positional ones
        prog = self._program(inputs, binding)
        session = prog.session
        assert session is not None  # inference builds are never plan-only
        prog.weights.changed_from_torch(session)
        out = session.run(prog.inputs.feed(inputs))
        if any(m.training for m in self._model.modules()):
            # with replication: replica 0's buffers (the statistics of the batch's first share)
            prog.weights.to_torch(session, kinds=("buffer",))
            prog.weights.mark_synced()
        # the outputs as the device wrote them: per replica ([R, ...]), per iteration ([n, ...])
        self.per_replica = [out[s] for s in prog.outputs.values()]
        # with replication: outputs concatenated in batch order, scalars averaged
        leaves = list(unreplicated(prog.outputs, out, inputs, self.options).values())
        _write_inputs(inputs, prog.lowered.fxm, leaves)
        return prog.lowered.fxm.unflatten(leaves)

    # programs ------------------------------------------------------------------------
    def build(self, *inputs: torch.Tensor, **kwargs: Any) -> Program:
        """Build (or fetch from the cache) the program for ``inputs`` without running it."""
        inputs, binding = bind(inputs, kwargs)
        return self._program(inputs, binding)

    @property
    def _active(self) -> Program | None:
        return self._programs.active

    def _program(self, inputs: Sequence[torch.Tensor], binding: Binding = POSITIONAL) -> Program:
        # torch's grad mode is part of it: eager under no_grad runs other kernels (SDPA with a
        # float mask computed from parameters: flash then, the math kernel with autograd on)
        sig = (*signature_of(self._model, inputs, binding), torch.is_grad_enabled())
        build = lambda: self._build(sig, inputs, binding)
        return self._programs.get(sig, build, enter=self._entered)

    def _entered(self, prog: Program) -> None:
        prog.weights.forget_synced()  # the program takes every torch weight before its call

    def _build(self, sig: tuple, inputs: Sequence[torch.Tensor], binding: Binding) -> Program:
        build = Build("inference_model", self._model, self.options, binding=binding)
        build.grad_enabled = sig[-1]
        return build_inference(build, sig, inputs)


def _write_inputs(inputs: Sequence[torch.Tensor], fxm, leaves: list) -> None:
    """Eager's in-place updates of the caller's tensors (``x += 1`` on an input in forward):
    the final values, which follow the outputs, copied into the inputs given."""
    written = leaves[fxm.n_outputs :]
    for i, value in zip(fxm.written_inputs, written):
        with torch.no_grad():
            inputs[i].copy_(value.reshape(inputs[i].shape))


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
