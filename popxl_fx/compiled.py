"""`compile`: a torch module whose forward, and backward, run on the simulated IPU.

The module keeps its own parameters, so an unchanged torch loop works: ``loss.backward()``
fills ``p.grad`` and any ``torch.optim`` optimizer (gradient clipping included) steps them.

Two programs per input signature (shapes, dtypes, train/eval, which inputs need gradients):
- forward: loads the inputs, calls the traced forward graph and stores its outputs and, when
  gradients are needed, the activations the gradient graph will read (autodiff adds them as
  forward outputs);
- backward (built on first use): loads the output gradients and those activations, calls the
  gradient graph and stores the gradients of the parameters and of the inputs.
Both build the same forward graph and gradient graph, so a forward output or input is the same
position in both. A `torch.autograd.Function` joins them: its forward hands back the simulated
outputs, its backward runs the backward program. Parameters and buffers are written from torch
before each forward (the optimizer changes them); buffers (batch-norm statistics) come back after.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import RuntimeCheckError
from popxl_core.transforms.grad_info import ExpectedConnectionType

from .checks import check_inputs, check_no_autocast
from .explain import Explanation
from .guards import raise_model_error
from .options import Options, resolve
from .pipeline import Build, Programs, Stage, weights_of
from .program import Inputs, Weights, describe_change, load_inputs, signature_of, store
from .refusals import refuse
from .steps import CompiledGraphs, lower_for_compile

__all__ = ["CompiledForward", "compile"]

_local = threading.local()  # set while a program is built: forward calls then run eagerly


@dataclass
class _ForwardProgram:
    signature: tuple
    session: popxl.Session
    inputs: Inputs
    outputs: list[popxl.DeviceToHostStream]  # forward outputs, then activations
    weights: Weights
    graphs: CompiledGraphs
    wants: list[bool]  # which inputs need gradients
    examples: tuple  # the inputs traced (the backward program traces the same)
    stages: list[Stage]
    backward: _BackwardProgram | None = None


@dataclass
class _BackwardProgram:
    session: popxl.Session
    streams: list[popxl.HostToDeviceStream]  # one per gradient-graph input
    sources: list[tuple[str, Any]]  # ("grad", output) | ("output", i) | ("input", i) | ("var", n)
    results: list[tuple[str, Any, popxl.DeviceToHostStream]]  # ("param", name) | ("input", i)
    stages: list[Stage]


class CompiledForward:
    """The ``forward`` that `compile` installs on a module instance."""

    def __init__(self, model: nn.Module, options: Options) -> None:
        self.model = model
        self.options = options
        self._programs: Programs[_ForwardProgram] = Programs("compile", self._why)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "building", False):  # the trace of a program runs the model eagerly
            return type(self.model).forward(self.model, *args, **kwargs)
        if kwargs:
            raise TypeError(
                f"compiled {type(self.model).__name__}: pass inputs positionally "
                f"(got keyword arguments {sorted(kwargs)})."
            )
        check_no_autocast(f"compiled {type(self.model).__name__}")
        needs_grad = torch.is_grad_enabled()
        wants = [bool(needs_grad and isinstance(a, torch.Tensor) and a.requires_grad) for a in args]
        trainable = needs_grad and any(p.requires_grad for p in self.model.parameters())
        sig = (signature_of(self.model, args), tuple(wants), trainable)
        prog = self._program(sig, args, wants if trainable or any(wants) else None)
        try:
            return self._run(prog, args)
        except RuntimeCheckError as failed:  # a model's `if bad: raise` (popxl_fx.guards)
            eager = lambda: type(self.model).forward(self.model, *args)
            raise_model_error(eager, self.model, failed)

    # programs ------------------------------------------------------------------------
    def _program(self, sig: tuple, args: tuple, wants: list[bool] | None) -> _ForwardProgram:
        return self._programs.get(sig, lambda: self._build_forward(sig, args, wants))

    def _why(self, old: tuple, new: tuple) -> str:
        what = type(self.model).__name__
        if old[0] != new[0]:
            return f"{what}: {describe_change(old[0], new[0])}"
        return f"{what}: gradients are now needed for other tensors"

    def _building(self):
        return _Building()

    def __deepcopy__(self, memo: dict) -> CompiledForward:
        import copy

        # a copy of the model gets its own programs, built when it is first called
        return CompiledForward(copy.deepcopy(self.model, memo), self.options)

    def _build_forward(self, sig, args, wants) -> _ForwardProgram:
        check_inputs(self.model, args)
        examples = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
        build = Build("compile", self.model, self.options)
        with build.ir.main_graph, popxl.in_sequence(), self._building():
            ins = load_inputs(args, [f"input{i}" for i in range(len(args))])
            graphs = lower_for_compile(build, ins.tensors, wants, examples)
            variables = graphs.lowered.facts.init()
            site = graphs.lowered.forward.bind(variables).call_with_info(*ins.tensors)
            outs = [store(t, f"output{i}") for i, t in enumerate(site.outputs)]
            weights = weights_of(variables, graphs.lowered)
        session = build.session()
        assert session is not None  # compile builds are never plan-only
        return _ForwardProgram(
            sig, session, ins, outs, weights, graphs, wants or [], examples, build.stages
        )

    def _build_backward(self, prog: _ForwardProgram) -> _BackwardProgram:
        specs = [popxl.TensorSpec(s.shape, s.dtype) for s in prog.inputs.streams]
        build = Build("compile", self.model, self.options)
        with build.ir.main_graph, popxl.in_sequence(), self._building():
            g = lower_for_compile(build, specs, prog.wants, prog.examples)
            fwd, bwd = g.lowered.forward, g.lowered.backward
            assert bwd is not None  # `lower_for_compile` builds it: prog.wants is never None
            fwd_outputs = {t: i for i, t in enumerate(fwd.graph.outputs)}
            var_names = {t: n for n, t in fwd.args.to_dict().items()}
            info = bwd.grad_graph_info
            streams, loaded = [], []
            sources: list[tuple[str, Any]] = []
            for i, conn in enumerate(info.expected_inputs):
                t = conn.fwd_tensor
                if conn.connection_type is ExpectedConnectionType.FwdGrad:
                    sources.append(("grad", fwd_outputs[t]))
                elif t in fwd_outputs:
                    sources.append(("output", fwd_outputs[t]))
                elif t in g.input_positions:
                    sources.append(("input", g.input_positions[t]))
                else:
                    sources.append(("var", var_names[t]))
                streams.append(popxl.h2d_stream(t.shape, t.dtype, f"grad_in{i}"))
                loaded.append(ops.host_load(streams[-1], f"grad_in{i}"))
            outs = ops.call(bwd.graph, *loaded)
            results = []
            for i, (conn, t) in enumerate(zip(info.expected_outputs, outs)):
                src = conn.fwd_tensor
                key = (
                    ("input", g.input_positions[src])
                    if src in g.input_positions
                    else ("param", var_names[src])
                )
                results.append((*key, store(t, f"grad_out{i}")))
        session = build.session()
        assert session is not None  # compile builds are never plan-only
        return _BackwardProgram(session, streams, sources, results, build.stages)

    def explain(self):
        """The pipeline as it ran for the last program called (`popxl_fx.explain`)."""
        prog = self._programs.active
        if prog is None:
            raise RuntimeError(
                f"compiled {type(self.model).__name__} has not been called yet: call it once."
            )
        programs = {"forward": prog.stages}
        if prog.backward is not None:
            programs["backward"] = prog.backward.stages
        return Explanation(f"compile({type(self.model).__name__})", self.options, programs)

    # running -------------------------------------------------------------------------
    def _run(self, prog: _ForwardProgram, args: tuple) -> Any:
        state = {n: _numpy(t) for n, t in prog.weights.tensors.items()}
        prog.session.write_variables_data({v: state[n] for n, v in prog.weights.variables.items()})
        out = prog.session.run(prog.inputs.feed(args))
        prog.weights.to_torch(prog.session, kinds=("buffer",))
        values = [torch.from_numpy(out[s].copy()) for s in prog.outputs]
        n = prog.graphs.n_outputs
        if prog.graphs.lowered.backward is None:
            return prog.graphs.lowered.fxm.unflatten(values[:n])
        saved = _Saved(prog, [_numpy(a) for a in args], state, [v.numpy() for v in values])
        params = [prog.weights.tensors[name] for name in prog.graphs.trainable]
        wanted = [a for a, w in zip(args, prog.wants) if w]
        results = _Bridge.apply(self, saved, *wanted, *params)
        return prog.graphs.lowered.fxm.unflatten(results)

    def backward(self, saved: _Saved, grads: tuple) -> dict:
        prog = saved.prog
        if prog.backward is None:
            prog.backward = self._build_backward(prog)
        bwd = prog.backward
        feeds = {}
        for stream, (kind, key) in zip(bwd.streams, bwd.sources):
            feeds[stream] = {
                "grad": lambda k: _grad_value(grads, saved.outputs, k),
                "output": lambda k: saved.outputs[k],
                "input": lambda k: saved.inputs[k],
                "var": lambda k: saved.state[k],
            }[kind](key)
        out = bwd.session.run(feeds)
        return {(kind, key): torch.from_numpy(out[s].copy()) for kind, key, s in bwd.results}


@dataclass
class _Saved:
    """What a forward hands its backward: the program and the values it ran with."""

    prog: _ForwardProgram
    inputs: list[np.ndarray]
    state: dict[str, np.ndarray]
    outputs: list[np.ndarray]


class _Building:
    def __enter__(self):
        self.before = getattr(_local, "building", False)
        _local.building = True

    def __exit__(self, *exc):
        _local.building = self.before


def _grad_value(grads: tuple, outputs: list[np.ndarray], index: int) -> np.ndarray:
    g = grads[index] if index < len(grads) else None
    return np.zeros_like(outputs[index]) if g is None else _numpy(g)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


class _Bridge(torch.autograd.Function):
    """Simulated outputs forward; the backward program's gradients backward."""

    @staticmethod
    def forward(ctx, runner: CompiledForward, saved: _Saved, *tensors: torch.Tensor):
        ctx.runner, ctx.saved = runner, saved
        n = saved.prog.graphs.n_outputs
        outs = tuple(torch.from_numpy(v.copy()) for v in saved.outputs[:n])
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return outs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        prog = ctx.saved.prog
        result = ctx.runner.backward(ctx.saved, grads)
        wanted = [("input", i) for i, w in enumerate(prog.wants) if w]
        params = [("param", n) for n in prog.graphs.trainable]
        return (None, None, *[result.get(k) for k in wanted + params])


def _install(model: nn.Module, options: Options) -> nn.Module:
    # an instance attribute: nn.Module.__call__ finds it, fx traces type(model).forward
    model.__dict__["forward"] = CompiledForward(model, options)
    return model


def _compiled_class(cls: type, opts: Options) -> type:
    """A subclass of ``cls`` whose instances get the simulated forward; ``cls`` itself (and its
    plain instances made later) stay as they were."""

    def __init__(self, *args, **kwargs):
        cls.__init__(self, *args, **kwargs)
        _install(self, opts)

    namespace = {
        # the wrapped class's own __init__, read from the class (the checker flags any
        # __init__ read from a `type` value)
        "__init__": functools.wraps(cls.__init__)(__init__),  # type: ignore[misc]
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    return type(cls.__name__, (cls,), namespace)


def compile(model_or_class: nn.Module | type, options: Options | None = None):
    """Run a torch module's forward and backward on the simulated IPU.

    On an instance, installs the simulated forward on it and returns it; on an ``nn.Module``
    subclass (as a decorator), returns a subclass whose instances get it (the class itself
    stays as it was). Programs are built on the first call
    for each input signature.

    Example:
        >>> model = compile(nn.Linear(4, 2), Options(device="cpu"))
        >>> model(torch.randn(3, 4)).sum().backward()  # doctest: +SKIP
    """
    opts = resolve(options)
    refuse("compile", opts)
    if isinstance(model_or_class, nn.Module):
        return _install(model_or_class, opts)
    if isinstance(model_or_class, type) and issubclass(model_or_class, nn.Module):
        return _compiled_class(model_or_class, opts)
    raise TypeError(
        f"compile expects an nn.Module instance or subclass, got {type(model_or_class).__name__}."
    )
