"""`popxl_fx.Module`: a traced torch module as an `addons.Module`.

``build(*xs)`` captures the torch module for the shapes/dtypes of ``xs`` (once per signature),
then lowers its fx graph node by node. Each parameter and buffer the graph uses becomes a
variable input named by its torch qualified name (``"layer1.0.conv1.weight"``), initialised
from the torch tensor, so the module fits ``create_graph``, ``bind``, ``autodiff`` and
``call_module`` like any addons layer. Building it sets the Ir's ``numerics`` (``"torch"`` unless
``Options(numerics="ipu")``): a lowered torch model's reference is eager PyTorch, bit for bit
(`popxl_core.Ir.numerics`).

With ``outline=`` (see `popxl_fx.outline`), the submodules of each outlined group become one
block graph, built once by a child `Module`, that every call site calls with its own variables
bound (``"blocks.3.attn.weight"``): the ``addons.Module.call_module`` pattern. With
``recompute=True`` each block's gradient graph is ``addons.transforms.recompute_graph`` of its
autodiff, registered before the call sites exist, so the backward recomputes the block's
activations instead of reading them from the forward. The variables' data (torch tensors as
factory data, a call site's own factories) comes from `popxl_fx.variable_data`; the variables
themselves are made by `ModuleVariables` (module_variables.py).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Literal

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

import addons
import popxl_core as popxl

from . import fallback
from .calls import POSITIONAL, Binding
from .capture import Captured, capture
from .capture_cache import SharedCaptures, shared_or_made, unshared
from .capture_effects import WARN_KINDS
from .errors import Issue, UnsupportedError
from .example_values import forget_examples
from .lowering import LoweringContext, run_graph
from .module_outputs import Outputs
from .module_variables import ModuleVariables
from .outline import Group, OutlinePlan, plan_outline
from .variable_data import SEED_NAME, named_tensors, site_factories

__all__ = ["Module", "SEED_NAME", "signature"]


def signature(model: nn.Module, inputs: tuple) -> tuple:
    """What a trace is specialised to: input shapes/dtypes and every module's train mode."""
    shapes = tuple(
        (tuple(x.shape), _key_dtype(x.dtype))
        if isinstance(x, (torch.Tensor, popxl.Tensor, popxl.TensorSpec))
        else repr(x)
        for x in inputs
    )
    return shapes, tuple(m.training for m in model.modules())


# An IR tensor may hold a 64-bit torch value in 32 bits (`Options.narrow_64bit`, casts to
# int64): the trace made on the torch example serves the graph built on the narrower tensor.
_KEY_NARROW = {"int64": "int32", "float64": "float32"}


def _key_dtype(dtype: Any) -> str:
    name = popxl.dtype.as_dtype(dtype).name
    return _KEY_NARROW.get(name, name)


def _example(x: Any) -> Any:
    """A torch example for a popxl tensor/spec (random floats; zeros for ints: safe indices)."""
    if not isinstance(x, (popxl.Tensor, popxl.TensorSpec)):
        return x
    dt = x.dtype.as_torch()
    if dt.is_floating_point:
        return torch.randn(tuple(x.shape), generator=torch.Generator().manual_seed(0)).to(dt)
    return torch.zeros(tuple(x.shape), dtype=dt)


class Module(Outputs, ModuleVariables):
    """A torch module whose `build` lowers its fx trace with the lowering table.

    Args:
        torch_module: the model; it is read, never changed.
        flatten_outputs: return the forward's outputs as a flat tuple of tensors (what
            ``create_graph`` needs for dict/nested outputs); `unflatten` restores the structure.
        cache: as for `addons.Module`: reuse the graph for calls with the same input specs
            (e.g. one graph for several ``call_module`` outlines).
        master: a module with the same parameter and buffer names as ``torch_module`` that
            holds the weights (``precision="float16"``: ``torch_module`` is a float16 copy
            traced for its arithmetic, ``master`` the user's float32 model). A parameter whose
            dtype differs becomes a variable of the master's dtype, cast where the graph uses
            it (so its gradient comes back in the master's dtype); a buffer keeps the traced
            dtype and starts from the master's value.
        outline: ``False``, ``"auto"`` or a tuple of module names and classes
            (`popxl_fx.Options.outline`); names are relative to ``outline_prefix``.
        recompute: give each outlined block a recomputing gradient graph.
        outline_prefix: where the user's model sits in ``torch_module`` (``"model."`` in
            the loss wrapper).
        weightless: variables get zero-filled data of the right shape and dtype instead of a
            copy of the torch tensors (what-if planning: the memory plan needs no values; a
            broadcast zero costs no host memory until a Session attaches). ``True``: all of
            them; a set of qualified names: those only (the ones the owner writes when the
            Session attaches; a traced constant keeps its data).
        binding: how the graph's inputs reach ``forward`` (keyword tensors and constants,
            `popxl_fx.calls.Binding`); positional by default.
    """

    # the captures this module shares with other builds (`capture_cache`), when it does
    shared: SharedCaptures | None = None

    def __init__(
        self,
        torch_module: nn.Module,
        flatten_outputs: bool = False,
        cache: bool = False,
        master: nn.Module | None = None,
        outline: Literal[False] | str | tuple = False,
        recompute: bool = False,
        outline_prefix: str = "",
        rng: str = "torch",
        weightless: bool | frozenset[str] = False,
        binding: Binding = POSITIONAL,
        numerics: str = "torch",
    ) -> None:
        super().__init__(cache=cache)
        self.numerics = numerics  # Options.numerics: the Ir's kernels ("torch": eager's)
        self.weightless = weightless
        self.binding = binding
        if recompute and outline is False:
            raise ValueError("recompute=True recomputes outlined blocks: give outline= too.")
        self.torch_module = torch_module
        self.rng = rng  # Options.rng: where train-mode random ops draw from
        self.master = master
        self.flatten_outputs = flatten_outputs
        self.outline = outline
        self.recompute = recompute
        self.outline_prefix = outline_prefix
        self._plans: dict[tuple, OutlinePlan] = {}
        self._plan: OutlinePlan | None = None
        self._sites: dict[str, Any] = {}
        self.out_spec: pytree.TreeSpec | None = None
        self._captures: dict[tuple, Captured] = {}
        self._vars: dict[str, popxl.Tensor] = {}
        self._seed: list[popxl.Tensor] = []
        # master weights' working copies (their casts) in the last graph built, by name
        self.working_copies: dict[str, popxl.Tensor] = {}
        # which inputs require grad in eager (compile's autograd bridge, tests): see
        # `requires_grad`
        self.inputs_require_grad: tuple[bool, ...] = ()
        self._grad_inputs: set[int] = set()

    # capture ---------------------------------------------------------------------------
    def capture(self, *example_inputs: Any) -> Captured:
        """The capture for these inputs' signature (traced on first use, then cached)."""
        key = signature(self.torch_module, example_inputs), self.binding.key()
        if key not in self._captures:
            examples = tuple(_example(x) for x in example_inputs)
            make = lambda: capture(self.torch_module, examples, self.binding)
            self._captures[key] = shared_or_made(self.shared, key, self.torch_module, make)
        return self._captures[key]

    def issues(self, *example_inputs: Any) -> list[Issue]:
        """Everything that stops the capture for these inputs from lowering (all at once)."""
        captured = self.capture(*example_inputs)
        if captured.checked is None:
            from .check import all_issues  # check imports the lowering table

            captured.checked = all_issues(captured, self.torch_module)
        return list(captured.checked)

    def forget_examples(self) -> None:
        """Once built: the captures' example tensors become meta tensors (`example_values`)."""
        # the shared captures are their owner's to forget (`capture_cache`)
        forget_examples(*unshared(self.shared, self._captures.values()), *self._plans.values())

    def outline_plan(self, *example_inputs: Any) -> OutlinePlan | None:
        """Which call sites outline for these inputs (None without ``outline``); planned on
        the first build for a signature, from the inputs the model was captured with."""
        if self.outline is False:
            return None
        key = signature(self.torch_module, example_inputs)
        if key not in self._plans:
            examples = self.capture(*example_inputs).example_inputs
            self._plans[key] = plan_outline(
                self.torch_module, self.outline, examples, self.outline_prefix, self.binding
            )
        return self._plans[key]

    def outlined_paths(self) -> list[list[str]]:
        """The module paths of the outlined call sites, one list per group (block graph)."""
        return [g.paths for plan in self._plans.values() for g in plan.groups]

    def block_graphs(self, ir: popxl.Ir) -> list[popxl.Graph]:
        """The outlined block graphs this module has built in ``ir`` (one per group)."""
        groups = [g for plan in self._plans.values() for g in plan.groups]
        return [g for group in groups for g in (group.n_outputs or {}) if g.ir is ir]

    def torch_names(self) -> dict[str, tuple[str, torch.Tensor]]:
        """Variable name -> ("param" | "buffer", torch tensor), for every torch tensor (the
        master's tensors when there is a master: they are the weights); the variable name is
        the torch name, escaped where it is not a valid PopXL name (`popxl_fx.names`)."""
        return named_tensors(self.master if self.master is not None else self.torch_module)

    # build -----------------------------------------------------------------------------
    def build(self, *xs: popxl.Tensor) -> Any:
        captured = self.capture(*xs)
        issues = self.issues(*xs)
        for issue in [i for i in issues if i.kind in WARN_KINDS]:
            warnings.warn(f"{type(self.torch_module).__name__}: {issue}", stacklevel=2)
        issues = [i for i in issues if i.kind not in WARN_KINDS]
        if issues:
            raise UnsupportedError(type(self.torch_module).__name__, issues)
        popxl.gcg().ir.numerics = self.numerics  # "torch": eager PyTorch's kernels
        self._vars, self._seed, self.working_copies, self.draws = {}, [], {}, 0
        traced = named_tensors(self.torch_module)
        self._canonical = {id(t): n for n, (_, t) in traced.items()}
        self._kinds = {n: kind for n, (kind, _) in traced.items()}
        self._masters = {n: t for n, (_, t) in self.torch_names().items()}
        plan = self._plan = self.outline_plan(*xs)
        self._sites = {}
        gm = plan.gm if plan is not None else captured.gm
        written: dict[int, popxl.Tensor] = {}
        try:
            self._grad_inputs = {id(x) for x, g in zip(xs, self.inputs_require_grad) if g}
            out = run_graph(
                gm,
                xs,
                self._context,
                self._attr,
                self._call_site,
                self._path_prefix,
                fallback.lower_by_decomposition,  # looked up per build: tests replace it
                written,
            )
            self._advance_seed()
        finally:
            self._vars, self._seed, self._sites, self._plan = {}, [], {}, None
            self._grad_inputs = set()
        return self._outputs(gm, captured, out, written)

    _path_prefix = ""  # a block graph's builder names its ops "<label>.<path>"

    # outlined call sites ---------------------------------------------------------------
    def _call_site(self, node: fx.Node, args: tuple) -> Any:
        """One outlined call: the group's block graph, bound to this module's variables."""
        group = self._plan.group_of(node.name) if self._plan is not None else None
        if group is None:
            return NotImplemented
        builder = _builder(group)
        builder.rng = self.rng
        facts, graph = builder.create_graph(*args)
        n = group.n_outputs.setdefault(graph.graph, len(graph.graph.outputs))
        if self.recompute and not self.has_grad_graph_info(graph.graph):
            self._recompute_grad(graph, n)
        if node.target not in self._sites:  # a module called twice binds the same variables
            factories = site_factories(facts, self.torch_module, node.target, self.weightless)
            # overwrite=True merges "blocks.1" into the "blocks" tree "blocks.0" made
            self._sites[node.target] = self.add_variable_inputs(
                node.target, factories, overwrite=True
            )
        outs = graph.bind(self._sites[node.target]).call(*args)
        return builder.unflatten(outs[:n])

    def _recompute_grad(self, graph: addons.GraphWithNamedArgs, n: int) -> None:
        """Autodiff of the block, as `recompute_graph`, used wherever the block is
        differentiated (autodiff adds forward outputs: before any call site exists)."""
        from addons.transforms import recompute_graph

        grad = graph.autodiff(grads_provided=graph.graph.outputs[:n], method="autodiff")
        self.add_called_graphs_grad_info(
            {**grad.called_graphs_grad_info, graph.graph: recompute_graph(grad).grad_graph_info}
        )

    def _context(self, node: fx.Node) -> LoweringContext:
        path = node.target if node.op == "call_module" else node.meta.get("module_path", "")
        training = self.torch_module.get_submodule(path).training
        return LoweringContext(self, node, path, training)

    def _attr(self, gm: fx.GraphModule, target: str) -> Any:
        value: Any = gm
        for part in target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor) and id(value) in self._canonical:
            return self.variable_for(value)
        if isinstance(value, torch.Tensor):
            return popxl.constant(value.detach().numpy(), popxl.dtype.as_dtype(value.dtype))
        return value


def _builder(group: Group) -> Module:
    """The child Module that builds ``group``'s block graph (once per Ir: GraphCache)."""
    if group.builder is None:
        builder = _block_class(type(group.representative))(
            group.representative, flatten_outputs=True, cache=True
        )
        rep = group.captured
        key = signature(group.representative, rep.example_inputs), builder.binding.key()
        builder._captures[key] = rep
        builder._path_prefix = group.label
        group.builder = builder
        group.n_outputs = weakref.WeakKeyDictionary()
    return group.builder


_BLOCK_CLASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _block_class(torch_class: type) -> type:
    """A `Module` subclass named like the torch class: the block graph is then called
    ``DecoderBlock_subgraph(N)`` (graphs are named after the building class)."""
    if torch_class not in _BLOCK_CLASSES:
        _BLOCK_CLASSES[torch_class] = type(torch_class.__name__, (Module,), {})
    return _BLOCK_CLASSES[torch_class]
