"""The lower, backward and recompute stages of the build pipeline: the traced model's forward
graph (`lower`) and its gradient graph (`backward`, `accumulating_backward`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

import addons
import popxl_core as popxl

from . import (
    lowerings,  # noqa: F401  (fills the lowering table)
    trace_patch,
)
from .calls import POSITIONAL, Binding
from .module import Module
from .options import Options
from .precision import check_loss_scale, half_copy, half_inputs
from .program import log

if TYPE_CHECKING:  # pragma: no cover (pipeline.py re-exports this module)
    from .pipeline import Build

__all__ = [
    "Lowered",
    "accumulating_backward",
    "backward",
    "entered",
    "gradient_graph",
    "lower",
    "lower_module",
    "lower_piece",
]


@dataclass
class Lowered:
    """The traced model in one Ir: its module, variable factories, forward graph and (when
    asked) the backward graph."""

    fxm: Module
    facts: Any  # addons.NamedVariableFactories of the torch parameters and buffers
    forward: addons.GraphWithNamedArgs
    backward: addons.GraphWithNamedArgs | None = None

    def torch_names(self) -> dict[str, tuple[str, Any]]:
        return self.fxm.torch_names()

    def outlined_blocks(self, prefix: str = "") -> list[list[str]]:
        """The outlined blocks' module paths per group, as the user's model names them
        (``prefix``, the loss wrapper's ``"model."``, stripped)."""
        return [[p[len(prefix) :] for p in paths] for paths in self.fxm.outlined_paths()]

    def trainable(self) -> list[str]:
        """Variable names of the parameters that require gradients (forward arg order)."""
        names = self.torch_names()
        return [
            n
            for n in self.forward.args.to_dict()
            if n in names and names[n][0] == "param" and names[n][1].requires_grad
        ]


def lower(
    build: Build,
    root: nn.Module,
    specs: Sequence[Any],
    examples: Sequence[Any],
    contexts: Sequence[Callable[[], contextlib.AbstractContextManager]] = (),
    differentiated: bool = True,
) -> Lowered:
    """Capture ``root`` on ``examples`` (the user's inputs: real branches and indices) and
    lower it to a forward graph taking ``specs``. ``contexts`` wrap both (they turn errors
    into the user's terms).

    With ``Options(outline=...)`` each group of repeated blocks is one graph called once per
    block (`popxl_fx.outline`); with ``recompute=True`` and ``differentiated`` (a backward
    will be built) each block's gradient graph recomputes its forward. Both happen while the
    forward is lowered, since a block's gradient graph must exist before its call sites do;
    the "recompute" stage is recorded after "backward", which calls those graphs. With
    ``precision="float16"`` the traced module is a float16 copy (`popxl_fx.precision`).
    """
    lowered, captured = _lowered(build, root, specs, examples, contexts, differentiated)
    build.record("capture", f"torch.fx graph of {len(captured.gm.graph.nodes)} nodes")
    blocks = lowered.fxm.block_graphs(build.ir)
    build.record("lower", _lower_detail(lowered.fxm, specs), [lowered.forward, *blocks])
    return lowered


def lower_piece(build: Build, gm: nn.Module, examples: Sequence[Any], contexts=()) -> Lowered:
    """One phase's piece of the traced step (`phases.Piece.gm`) lowered as `lower` lowers the
    whole model (the same `Module`, options and captures), to a forward graph taking the
    examples' specs; unrecorded: the phased shape records its pieces' stages once."""
    specs = [popxl.TensorSpec(tuple(x.shape), popxl.dtype.as_dtype(x.dtype)) for x in examples]
    return _lowered(build, gm, specs, examples, contexts, True, POSITIONAL)[0]


def _lowered(
    build: Build, root: nn.Module, specs, examples, contexts, differentiated, binding=None
) -> tuple:
    """`lower` without its records: (the lowered graphs, the capture). ``binding``: how the
    inputs reach ``root`` (the build's when None; a phase's piece takes them positionally)."""
    opts = build.options
    recompute = opts.recompute and differentiated
    binding = build.binding if binding is None else binding
    fxm = _module(opts, root, build.prefix, recompute, build.weightless, binding)
    fxm.shared = build.shared  # the captures of the other builds of this signature
    if opts.precision == "float16":
        examples = half_inputs(examples)
    fxm.grad_enabled = build.grad_enabled
    fxm.writes_inputs = build.entry == "inference_model"  # eager updates the caller's inputs
    build.captures.append(fxm)
    captured, facts, fwd = lower_module(fxm, examples, specs, contexts)
    return Lowered(fxm, facts, fwd), captured


def lower_module(
    fxm: Module,
    examples: Sequence[Any],
    specs: Sequence[Any],
    contexts: Sequence[Callable[[], contextlib.AbstractContextManager]] = (),
) -> tuple:
    """Capture ``fxm`` on ``examples`` and lower it to a forward graph taking ``specs``, both
    inside ``contexts``: (captured, variable factories, forward graph). The whole model's
    (`lower`) and each phase's piece (`phased`) are lowered so."""
    with trace_patch.kept_patches():  # its traces patch nn.Module once (trace_patch)
        with entered(contexts):
            captured = fxm.capture(*examples)
        with entered(contexts):
            facts, fwd = fxm.create_graph(*specs)
    return captured, facts, fwd


def _module(
    options: Options,
    root: nn.Module,
    prefix: str,
    recompute: bool,
    weightless: bool | frozenset[str] = False,
    binding: Binding = POSITIONAL,
) -> Module:
    """The traced module: ``root`` itself, or (precision="float16") a float16 copy of it
    whose parameters are ``root``'s float32 master weights (`popxl_fx.precision`); outlined
    as ``options.outline`` says (names relative to ``prefix``, where the model sits);
    ``weightless`` for what-if plans (`Module`)."""
    kwargs: dict[str, Any] = {
        "outline": options.outline,
        "recompute": recompute,
        "outline_prefix": prefix,
        "weightless": weightless,
        "rng": options.rng,  # where train-mode random ops draw from
        "binding": binding,
        "numerics": options.numerics,
    }
    if options.precision == "float16":
        check_loss_scale(options)
        return Module(half_copy(root), flatten_outputs=True, master=root, **kwargs)
    return Module(root, flatten_outputs=True, **kwargs)


def _check_no_torch_draws(blocks: Sequence[popxl.Graph]) -> None:
    """A recomputed block re-runs its forward in the backward: a draw from torch's generator
    (Options(rng="torch") dropout) would give a new mask there, a wrong gradient."""
    drawing = [g.name for g in blocks if any(op.type == "TorchRandom" for op in g.ops)]
    if drawing:
        raise NotImplementedError(
            f"Options(recompute=True) with random ops drawing from torch's generator in "
            f"{', '.join(drawing)}: recomputation would draw new masks in the backward. Use "
            "Options(rng='ipu') (seeded draws replay exactly), or recompute=False."
        )


def _record_recompute(build: Build, lowered: Lowered) -> None:
    """The "recompute" stage: the blocks' recomputing gradient graphs (made while lowering)
    are what the backward calls."""
    if not lowered.fxm.recompute:
        return
    blocks = [g.name for g in lowered.fxm.block_graphs(build.ir)]
    _check_no_torch_draws(lowered.fxm.block_graphs(build.ir))
    if not blocks:  # said, not silent: explain shows it too
        log.warning(
            "Options(recompute=True): outline=%r found no repeated block, so nothing is "
            "recomputed; list the modules to recompute with outline=[...].",
            build.options.outline,
        )
        build.record("recompute", "no outlined block: nothing recomputed")
        return
    made = [
        g
        for g in build.ir.graphs
        if "_bwd_recomp" in g.name or any(g.name == f"{b}_bwd" for b in blocks)
    ]
    build.record("recompute", "each outlined block's backward recomputes its forward", made)


def _lower_detail(fxm: Module, specs: Sequence[Any]) -> str:
    plan = fxm.outline_plan(*specs)
    if plan is None or not plan.groups:
        return "the whole model inlined in one forward graph"
    return "outlined: " + "; ".join(plan.describe())


@contextlib.contextmanager
def entered(contexts: Sequence[Callable[[], contextlib.AbstractContextManager]]):
    """Every context of ``contexts`` (each made by calling it) entered, in order."""
    with contextlib.ExitStack() as stack:
        for make in contexts:
            stack.enter_context(make())
        yield


def backward(
    build: Build,
    lowered: Lowered,
    provided: Sequence[popxl.Tensor],
    required: Sequence[popxl.Tensor],
) -> addons.GraphWithNamedArgs:
    """The gradient graph of the forward (autodiff), kept on ``lowered``.
    [accumulation uses `addons.autodiff_with_accumulation`]"""
    grad = gradient_graph(lowered, provided, required)[1]
    build.record("backward", f"autodiff: {len(required)} gradients", [grad])
    _record_recompute(build, lowered)
    return grad


def accumulating_backward(
    build: Build, lowered: Lowered, loss: popxl.Tensor, required: Sequence[popxl.Tensor]
) -> tuple[Any, addons.GraphWithNamedArgs]:
    """The gradient graph that mean-accumulates the gradients of ``required`` into
    ``accum.<name>`` variables (`addons.autodiff_with_accumulation`); returns their
    factories and the graph (kept on ``lowered``)."""
    facts, grad = gradient_graph(lowered, [loss], (), accumulated=required)
    build.record("backward", f"autodiff: {len(required)} gradients, accumulated", [grad])
    _record_recompute(build, lowered)
    return facts, grad


def gradient_graph(
    lowered: Lowered,
    provided: Sequence[popxl.Tensor],
    required: Sequence[popxl.Tensor],
    accumulated: Sequence[popxl.Tensor] = (),
) -> tuple[Any, addons.GraphWithNamedArgs]:
    """The forward's gradient graph (autodiff), kept on ``lowered``, unrecorded: every
    training step's backward (`backward`, `accumulating_backward`, each phase's piece). The
    gradients of ``accumulated`` are mean-accumulated into ``accum.<name>`` variables
    (`addons.autodiff_with_accumulation`): returns their factories (None without) and the
    graph."""
    facts = None
    if accumulated:
        facts, grad = addons.autodiff_with_accumulation(
            lowered.forward, accumulated, grads_provided=provided, grads_required=required
        )
    else:
        grad = addons.autodiff(lowered.forward, grads_provided=provided, grads_required=required)
    lowered.backward = grad
    return facts, grad
