"""The fallback for targets the table lacks: decompose the call into core ATen ops and lower
those one by one through the ``aten.*`` entries of the same table.

The call is re-traced with ``make_fx`` on the node's example inputs (leaf modules through
``torch.func.functional_call``, so their parameters and buffers arrive as inputs and lower to
the same variables as a direct lowering would use).

Hidden state never differs silently: random ops draw from the simulator's seeded stream
(`lowerings/aten_random.py`) or are reported as random ops without a lowering; in-place
updates of buffers (the module's own, or ones passed to a function) become buffer updates;
an in-place update of anything else (a model input, a parameter, an intermediate tensor) is
reported, and the trace leaves tensors held as plain attributes as they were.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import popxl_core as popxl

from .capture_state import plain_tensors
from .errors import Issue, UnsupportedError
from .fallback_memo import call_key, traced_once
from .inplace import mutated_input
from .lowering import LOWERINGS, LoweringContext, lookup, run_graph, target_name, unsupported
from .lowerings.aten_kernels import EAGER_KERNEL_PACKETS, REFUSED
from .lowerings.aten_random import RANDOM_ATEN
from .lowerings.strided import record_storage

__all__ = [
    "Decomposition",
    "decompose",
    "lower_by_decomposition",
    "missing_lowerings",
    "nearby_supported",
]


class Decomposition:
    """A node's call as an ATen graph: inputs = the module's state names, then tensor args."""

    def __init__(self, gm: fx.GraphModule, state_names: list[str]) -> None:
        self.gm = gm
        self.state_names = state_names

    def aten_targets(self) -> list[Any]:
        return [n.target for n in self.gm.graph.nodes if n.op == "call_function"]


def _call(node: fx.Node, root: torch.nn.Module) -> tuple[Callable, list[str], list]:
    """The node's call as fn(*state, *args) and the module state names/values it needs."""
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        state = dict(module.named_parameters())
        state.update(module.named_buffers())
        names = list(state)

        def call(*flat: Any, **kwargs: Any) -> Any:
            params = dict(zip(names, flat[: len(names)]))
            return torch.func.functional_call(module, params, flat[len(names) :], kwargs)

        return call, names, [state[n].detach() for n in names]
    if node.op == "call_method":
        return (lambda self_, *a, **k: getattr(self_, node.target)(*a, **k)), [], []
    return node.target, [], []


# ops core_aten_decompositions would rewrite into other arithmetic than eager's kernel (the
# vector norm as pow -> sum -> pow: 1 ulp off torch's norm kernel, which F.normalize in
# torchvision's Swin V2 attention meets); kept whole, lowered with torch's own kernel
_KEPT = EAGER_KERNEL_PACKETS


# _decompositions' tables by the number of ops registered with torch when each was built
_TABLES: dict[int, dict] = {}


def _table_key() -> int:
    """Which `_decompositions` table holds now: the number of ops registered with torch."""
    return len(torch._C._dispatch_get_all_op_names())


def _decompositions(key: int) -> dict:
    """``core_aten_decompositions`` without the ones that change eager's arithmetic.

    torch builds that table anew on every call (0.1-0.3 s, most of a small fallback's cost), so
    it is built once per set of registered ops: a package imported later (torchvision, a custom
    op library) registers ops that add to it, and then it is built again (``key``: `_table_key`
    now)."""
    if key not in _TABLES:
        table = core_aten_decompositions()
        kept = {getattr(p, o) for p in _KEPT for o in p.overloads()}
        _TABLES[key] = {op: fn for op, fn in table.items() if op not in kept}
    return dict(_TABLES[key])  # a copy: make_fx may keep or change what it is given


def _one_fake_mode():
    """One FakeTensorMode for a decomposition's traces. ``make_fx`` records each node's value
    as a fake tensor of the ambient fake mode, and without one it makes a new FakeTensorMode
    per value, each reading the Python stack (~40 % of a small decomposition's time); the
    recorded shapes, strides and dtypes are the same."""
    return tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True)))


def decompose(node: fx.Node, root: torch.nn.Module) -> Decomposition:
    """Trace ``node``'s call on its example inputs into core ATen ops (once per node)."""
    if "decomposition" not in node.meta:
        node.meta["decomposition"] = _decompose(node, root)
    return node.meta["decomposition"]


def _decompose(node: fx.Node, root: torch.nn.Module) -> Decomposition:
    call, names, state = _call(node, root)
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["example_value"])
    leaves, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def flat_call(*tensors: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, t in zip(positions, tensors[len(state) :]):
            filled[i] = t
        a, k = pytree.tree_unflatten(filled, spec)
        return call(*tensors[: len(state)], *a, **k)

    inputs = [*state, *(leaves[i] for i in positions)]
    module = root.get_submodule(node.target) if node.op == "call_module" else None
    before = _plain_snapshot(module)
    table = _table_key()  # ~2 ms: asked once per call
    key = call_key(node, leaves, spec, table)
    gm = traced_once(key, lambda: _traced(flat_call, inputs, table))
    # x.tanh_(), F.relu(x, inplace=True): the update of x is the call's own result, which
    # the driver rebinds x to (`mutated_input`)
    updates_self = mutated_input(node, root) is not None
    owners = _arg_owners(node, root, [leaves[i] for i in positions])
    _mark_updates(gm, names, updates_self, owners)
    _restore(module, before)
    return Decomposition(gm, names)


def _traced(flat_call: Callable, inputs: list, table_key: int) -> fx.GraphModule:
    """``flat_call`` traced on copies of ``inputs`` into a pure graph of core ATen ops
    (`_decompositions` of ``table_key``)."""

    def fresh() -> list[torch.Tensor]:  # tracing runs the call: keep the model's tensors intact
        return [_clone_in_storage(t) for t in inputs]

    with torch.random.fork_rng(devices=[]):
        # Decompose, then functionalize the ATen graph: in-place ops (also those that the
        # decompositions introduce) become pure ones; a mutated input shows as one
        # aten.copy_ into it at the end (a buffer update).
        table = _decompositions(table_key)
        with _one_fake_mode():
            aten_gm = make_fx(flat_call, decomposition_table=table)(*fresh())
            pure = torch.func.functionalize(aten_gm, remove="mutations")
            gm = make_fx(pure, decomposition_table=table)(*fresh())
        record_storage(gm, fresh())
    return gm


def _clone_in_storage(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` laid out in a copy of its storage as ``t`` is (strides and storage
    offset): the trace records that layout, which ops that address storage (``as_strided``)
    depend on; a plain clone would start at offset 0 in a storage of its own size."""
    t = t.detach()
    if t.is_sparse or t.layout != torch.strided:
        return t.clone()
    whole = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    storage = t.as_strided((whole,), (1,), 0).clone()
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def _plain_snapshot(module: torch.nn.Module | None) -> dict:
    if module is None:
        return {}
    return {key: t.detach().clone() for key, t in plain_tensors(module).items()}


def _restore(module: torch.nn.Module | None, before: dict) -> None:
    """Put back the plain tensor attributes the trace changed (`check` reports such
    updates: capture sees them when it runs the module on the example inputs)."""
    for key, t in plain_tensors(module).items() if module is not None else []:
        old = before.get(key)
        if old is not None and old.shape == t.shape and not torch.equal(old, t.detach()):
            with torch.no_grad():
                t.copy_(old)


def _arg_owners(node: fx.Node, root: torch.nn.Module, tensors: list) -> list[str]:
    """What each tensor argument of the call is: 'buffer <qualname>' for a buffer of the
    model (passed as ``self.<buffer>``), else a description for error messages."""
    by_value = {id(a.meta.get("example_value")): a for a in node.all_input_nodes}
    buffers = dict(root.named_buffers())
    params = dict(root.named_parameters())
    return [_describe_arg(by_value.get(id(t)), i, buffers, params) for i, t in enumerate(tensors)]


def _describe_arg(arg: fx.Node | None, i: int, buffers: dict, params: dict) -> str:
    if arg is None:
        return f"tensor argument {i} of the call"
    if arg.op == "get_attr" and arg.target in buffers:
        return f"buffer {arg.target}"
    if arg.op == "get_attr" and arg.target in params:
        return f"the parameter '{arg.target}'"
    if arg.op == "get_attr":
        return f"the tensor attribute '{arg.target}'"
    if arg.op == "placeholder":
        return f"the model input '{arg.target}'"
    return f"the tensor of fx node '{arg.name}'"


def _mark_updates(
    gm: fx.GraphModule, names: list[str], updates_self: bool, owners: list[str]
) -> None:
    """Tag each ``aten.copy_`` into a module-state input with that state's name, the one into
    the call's in-place updated first argument with ``self_update``, one into a root buffer
    passed as an argument with ``root_buffer_update``, and any other with ``mutates``."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    state = dict(zip(placeholders, names))
    args = dict(zip(placeholders[len(names) :], owners))
    self_input = placeholders[len(names)] if updates_self else None
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            dst = node.args[0]
            if dst in state:
                node.meta["buffer_update"] = state[dst]
            elif dst is self_input:
                node.meta["self_update"] = True
            elif args.get(dst, "").startswith("buffer "):
                node.meta["root_buffer_update"] = args[dst][len("buffer ") :]
            else:
                node.meta["mutates"] = args.get(dst, "a tensor the call did not create")


def missing_lowerings(dec: Decomposition) -> list[Any]:
    """The ATen ops of ``dec`` with no entry in the table (each once, in graph order)."""
    seen: list[Any] = []
    for target in dec.aten_targets():
        if lookup(target) is None and target not in seen:
            seen.append(target)
    return seen


def nearby_supported(target: Any, n: int = 5) -> list[str]:
    """Names of registered targets that look like ``target``'s name."""
    names = {target_name(t) for t in LOWERINGS}
    short = {name.rsplit(".", 1)[-1]: name for name in names}
    wanted = target_name(target).rsplit(".", 1)[-1].lower()
    close = difflib.get_close_matches(wanted, list(short), n=n, cutoff=0.6)
    return [short[c] for c in close]


def _what(node: fx.Node, root: torch.nn.Module) -> str:
    if node.op == "call_module":
        return f"{target_name(type(root.get_submodule(node.target)))} module"
    return target_name(node.target)


def decomposition_issue(node: fx.Node, root: torch.nn.Module) -> Issue | None:
    """None when ``node`` lowers through its decomposition, else the `Issue` saying why not."""
    kind = "unsupported module" if node.op == "call_module" else "unsupported op"
    what = _what(node, root)
    if node.op == "call_function" and _packet(node.target) in REFUSED:  # the op itself
        return unsupported(node, what, kind, f"{REFUSED[_packet(node.target)]}.")
    try:
        dec = decompose(node, root)
    except Exception as exc:  # any failure means there is no decomposition
        return unsupported(
            node,
            what,
            kind,
            f"it has no lowering and no ATen decomposition "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}).",
        )
    state = _hidden_state_hint(dec)
    if state:
        return unsupported(node, what, "hidden state", state)
    missing = missing_lowerings(dec)
    if not missing:
        return None
    refused = [t for t in missing if _packet(t) in REFUSED]
    if refused:
        reason = REFUSED[_packet(refused[0])]
        return unsupported(node, what, kind, f"it needs {target_name(refused[0])}: {reason}.")
    random = [t for t in missing if _packet(t) in RANDOM_ATEN]
    if random:
        return unsupported(node, what, "unsupported random op", _random_hint(random))
    return unsupported(node, what, kind, _missing_hint(node, root, missing))


def _missing_hint(node: fx.Node, root: torch.nn.Module, missing: list[Any]) -> str:
    """The ATen ops a decomposition needs that have no lowering, and the nearby supported
    ops (of the node's target and of those ops)."""
    names = ", ".join(target_name(t) for t in missing)
    own = node.target if node.op != "call_module" else type(root.get_submodule(node.target))
    near = sorted({s for t in missing for s in nearby_supported(t)} | set(nearby_supported(own)))
    which = "which has no lowering" if len(missing) == 1 else "which have no lowerings"
    hint = f"it has no lowering, and its ATen decomposition needs {names}, {which}."
    if near:
        hint += f" Nearby supported: {', '.join(near)}."
    return hint


def _random_hint(random: list[Any]) -> str:
    names = ", ".join(target_name(t) for t in random)
    return (
        f"its ATen decomposition draws random numbers with {names}, which the simulator's "
        "seeded random stream does not implement (it has rand, randn, rand_like, "
        "randn_like, bernoulli, uniform, normal; dropout works)."
    )


def _packet(target: Any) -> Any:
    return target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target


def _hidden_state_hint(dec: Decomposition) -> str:
    """Why ``dec`` updates state the program cannot carry between steps ('' if it does not)."""
    mutated = [n.meta["mutates"] for n in dec.gm.graph.nodes if "mutates" in n.meta]
    if mutated:
        return (
            f"it updates {', '.join(dict.fromkeys(mutated))} in place, which the simulated "
            "program cannot reproduce (only buffers and the updated first argument of an "
            "in-place call are written back); use the out-of-place op."
        )
    return ""


def lower_by_decomposition(node: fx.Node, args: tuple, kwargs: dict, ctx: LoweringContext) -> Any:
    """Lower ``node`` through its ATen decomposition; UnsupportedError names what is missing."""
    root = ctx.owner.torch_module
    model = type(root).__name__
    if isinstance(node.target, torch._ops.OpOverload):  # an ATen op inside a decomposition
        near = nearby_supported(node.target)
        hint = f"Nearby supported: {', '.join(near)}." if near else ""
        raise UnsupportedError(model, [unsupported(node, target_name(node.target), hint=hint)])
    issue = decomposition_issue(node, root)
    if issue is not None:
        raise UnsupportedError(model, [issue])
    dec = decompose(node, root)
    leaves = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, popxl.Tensor)]
    state = [ctx.param(name) for name in dec.state_names]
    for n in dec.gm.graph.nodes:  # errors inside the decomposition point at the user's line
        n.meta.setdefault("source", node.meta.get("source", "<unknown>"))
        n.meta.setdefault("module_path", node.meta.get("module_path", ""))

    def make_ctx(n: fx.Node) -> LoweringContext:
        return LoweringContext(ctx.owner, n, ctx.module_path, ctx.training)

    out = run_graph(dec.gm, [*state, *leaves], make_ctx, _constant, fallback=lower_by_decomposition)
    return _as_seen(out, node)


def _as_seen(out: Any, node: fx.Node) -> Any:
    """The decomposition's outputs as the structure eager returned: a named tuple such as
    ``torch.return_types.sort`` comes back from the ATen graph as a plain tuple, and the
    user's code reads ``.values`` / ``.indices`` from it."""
    seen = node.meta.get("example_value", node.meta.get("val"))
    if isinstance(seen, tuple) and hasattr(type(seen), "n_fields") and isinstance(out, tuple):
        return type(seen)(out)
    return out


def _constant(gm: fx.GraphModule, target: str) -> Any:
    value = getattr(gm, target)
    if isinstance(value, torch.Tensor):
        return popxl.constant(value.detach().numpy(), popxl.dtype.as_dtype(value.dtype))
    return value
