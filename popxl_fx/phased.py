"""The training program of ``Options(phased_execution=...)``: phase by phase, weights and
optimizer state in Streaming Memory.

The model's graph is cut into pieces (`phases.split_pieces`: one per phase module, one per
stretch of code between phases), each lowered to a graph of its own with its own autodiff.
Every trainable parameter lives in a remote buffer (a remote variable: the Session and the
torch bridge read and write it like any variable); buffers, frozen parameters and random
seeds stay on chip. The main graph then runs, in order:

    forward:  per piece, load its parameters, call its forward graph (the loaded copies die
              after the call; the activations its backward needs stay, as in the plain step)
    backward: per piece in reverse, load its parameters again, call its gradient graph with
              the gradients of its outputs (the sum of what the later pieces gave back),
              reduce the gradients over replicas, run the optimizer's update of the piece's
              parameters on loaded state (`optim_remote.RemoteState`), store parameters and
              state back

Each piece is lowered, differentiated and updated by the stages every shape of step uses
(`lower_stage.lower_piece`, `lower_stage.gradient_graph`, `step_parts.update_parameters`:
gradients reduced over replicas, unscaled, the optimizer's updates); what is phased is here:
the cut into pieces, the remote buffers, and each phase's loads and stores.

This is seed 003's shape (phased execution by hand) for any traced model. Every op is the
plain program's op on the same values, and each piece's backward is autodiff of its forward,
so numbers equal the plain program's; only where a value feeds several pieces are its
gradient contributions added in piece order (float32 round-off). With gradient_accumulation
or batch_serialisation each phase runs every slice of the batch on its loaded weights, the
values between phases waiting in Streaming Memory (`phased_slices`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.utils._pytree as pytree

import addons
import popxl_core as popxl
from addons.remote import load_remote, named_variable_buffers, store_remote
from popxl_core import ops
from popxl_core.sim.machine import machine_for

from . import trace_patch
from .built import BuiltStep, Extras, StepShape
from .calls import POSITIONAL
from .loss import check_scalar_loss, loss_index
from .lower_stage import Lowered, entered, gradient_graph, lower_piece
from .module import signature
from .optim_groups import state_slots
from .optim_remote import RemoteState
from .phase_report import PhaseSteps
from .phased_seed import SeedStream
from .phased_slices import Slices, SliceStore
from .phases import Piece, check_phase_sizes, phase_plan, split_pieces
from .pipeline import Build
from .precision import scaled_seed
from .program import Weights, store
from .refusals import refuse
from .replication import replica_examples, replication_of, split_replicas
from .step_parts import load_step_inputs, training_contexts, update_parameters
from .variable_data import SEED_NAME

__all__ = ["PhasedShape"]


@dataclass
class _Lowered:
    """One piece in the Ir: its graphs, variables and what crosses its boundary."""

    piece: Piece
    graphs: Lowered  # `lower_stage.lower_piece`'s: module, factories, forward (+ backward)
    remote: list[str]  # trainable parameter keys (remote)
    local: dict[str, popxl.Tensor]  # on-chip variables by key (buffers, seeds, frozen)
    buffers: Any = None  # NamedRemoteBuffers of the remote parameters
    remote_vars: dict[str, popxl.Variable] = field(default_factory=dict)
    needs: list[bool] = field(default_factory=list)  # per input: its gradient is wanted
    provided: list[int] = field(default_factory=list)  # outputs given a gradient
    accum: Any = None  # with several slices: the backward's gradient accumulators' factories

    @property
    def forward(self) -> addons.GraphWithNamedArgs:
        return self.graphs.forward

    @property
    def backward(self) -> addons.GraphWithNamedArgs | None:
        return self.graphs.backward


class PhasedShape(StepShape):
    """The phased training step (see the module docstring)."""

    def refuse(self, build: Build, req: Any) -> None:
        """Refuse, before any capture, what phased execution does not do."""
        refuse("phased", build.options)  # what phasing does not combine with (yet)
        if req.record:
            raise NotImplementedError(
                "recording outputs and gradients (assert_matches_eager) is not available with "
                "phased_execution; compare against the plain trainer instead."
            )

    def capture(self, build: Build, req: Any, step_inputs: tuple) -> tuple:
        # one window for the phases' traces and the split's (`trace_patch`): nn.Module is
        # patched once, not once per trace
        with trace_patch.kept_patches():
            return _capture_pieces(build, req)

    def build(self, build: Build, req: Any, step_inputs: tuple, captured: tuple) -> BuiltStep:
        contexts, gm, pieces = captured
        names = _torch_names(req.root)
        ins, lowered, steps, outputs = _lower_and_schedule(build, req, contexts, gm, pieces, names)
        variables = {k: v for lp in lowered for k, v in lp.local.items()}
        variables.update({k: v for lp in lowered for k, v in lp.remote_vars.items()})
        weights = Weights.from_named(variables, names, build.prefix)
        # Trainer.report reads the phases' steps
        return BuiltStep(ins, outputs, weights, lowered[0].graphs, Extras(phases=steps))


def _capture_pieces(build: Build, req: Any) -> tuple:
    """The traced step split at the phase boundaries: (contexts, graph module, pieces)."""
    opts = build.options
    contexts = training_contexts(req, req.inputs)
    examples = Slices.of(opts).examples(replica_examples(req.inputs, split_replicas(opts)))
    spec = opts.phased_execution
    assert not isinstance(spec, bool)  # phased: a kind or module names (`Options` checked)
    with entered(contexts):
        paths, traced = _phase_paths(build, req.root, spec, examples)
        gm, pieces = _split(build, req.root, examples, paths, traced)
    _check_sizes(build, req, pieces)
    build.captures += [gm, *(p.gm for p in pieces)]
    build.record("capture", f"torch.fx graph of {len(gm.graph.nodes)} nodes, {len(pieces)} pieces")
    return contexts, gm, pieces


def _phase_paths(build: Build, root: Any, spec: Any, examples: tuple) -> tuple:
    """`phase_plan`: the phases' paths, found once per key for the builds sharing captures
    (`capture_cache`; ``"blocks"`` traces the model to find its repeated blocks, the same
    trace for the candidate and the chosen build of ``memory="auto"``), and the leaf trace
    finding them made when `split_pieces` may take it for its own (None otherwise).

    The key is complete: the paths depend only on the root (the cache's owner, by identity),
    the spec, the examples' signature (the builds of one trainer signature trace the same
    inputs, as every shared capture does) and the prefix; they hold no example values, so
    there is nothing to forget. A shared hit gives no trace (the split is shared too)."""
    made: list = []  # the (paths, trace) this build made, where it made them

    def make() -> list:
        made.append(phase_plan(root, spec, examples, build.prefix))
        return made[0][0]

    if build.shared is None:
        paths = make()
    else:
        key = "phase_paths", spec, signature(root, examples), build.prefix
        paths = list(build.shared.get(key, root, make, lambda paths: ()))
    # the trace was made with positional inputs: another binding traces the split itself
    traced = made[0][1] if made and build.binding == POSITIONAL else None
    return paths, traced


def _split(build: Build, root: Any, examples: tuple, paths: list[str], traced) -> tuple:
    """`split_pieces` (on ``traced``, the leaf trace `phase_plan` made, when not None), made
    once per key for the builds sharing captures (`capture_cache`): the same pieces then hit
    the same piece captures."""
    make = lambda: split_pieces(root, examples, paths, build.prefix, build.binding, traced)
    if build.shared is None:
        return make()
    key = tuple(paths), signature(root, examples), build.prefix, build.binding.key()
    parts = lambda split: (split[0], *(p.gm for p in split[1]))
    return build.shared.get(key, root, make, parts)


def _lower_and_schedule(build: Build, req: Any, contexts, gm, pieces, names) -> tuple:
    """Inputs, the lowered pieces, then main's schedule: every forward in phase order, then
    every backward with its optimizer update in reverse; (inputs, lowered, steps, outputs)."""
    opts = build.options
    slices = Slices.of(opts)
    ins = load_step_inputs(build, req, req.inputs)
    envs = slices.envs([n for n in gm.graph.nodes if n.op == "placeholder"], ins.tensors)
    leaves, out_spec = pytree.tree_flatten(next(iter(reversed(gm.graph.nodes))).args[0])
    loss_node = leaves[loss_index(out_spec, len(leaves), req.model)]
    shards = opts.replication_factor if opts.replicated_tensor_sharding else 1
    with trace_patch.kept_patches():  # every piece's capture in one window (`trace_patch`)
        lowered = [_lower_piece(p, names, contexts, shards, build) for p in pieces]
    seed = SeedStream.shared(lowered)  # one stream through every piece
    build.record("lower", _lower_detail(lowered))
    _plan_gradients(lowered, loss_node)
    for lp in lowered:
        _differentiate(lp, slices.count > 1)
    build.record("backward", "autodiff per piece, gradients chained piece to piece")
    if slices.count > 1:
        build.record("accumulation", _slices_detail(slices))
    steps = [PhaseSteps(lp.piece.label, lp.piece.phase) for lp in lowered]
    kept = SliceStore(slices.count)
    seed.start(slices.count)
    fwd_calls = _forwards(build, lowered, steps, envs, kept, seed)
    seed.finish()
    loss = slices.loss([kept.fetch(env[loss_node]) for env in envs])
    check_scalar_loss(loss, req.model, req.has_loss_fn)
    build.planned = True
    _backwards(build, req, lowered, fwd_calls, steps, (envs, kept), loss_node)
    return ins, lowered, steps, {"loss": store(loss, "loss")}


def _forwards(build: Build, lowered: list, steps: list, envs: list, kept, seed) -> list:
    """Every piece's forward in phase order, drawing from ``seed`` (`SeedStream`); each
    phase's ops kept for the report."""
    main = build.ir.main_graph
    fwd_calls = []
    for i, (lp, st) in enumerate(zip(lowered, steps)):
        n = len(main.ops)
        fwd_calls.append(_forward(lp, i, envs, kept, seed))
        st.forward = list(main.ops[n:])  # the report's per-phase rows
    return fwd_calls


def _backwards(build: Build, req: Any, lowered, fwd_calls, steps, where, loss_node) -> None:
    """Every piece's backward and optimizer update, last phase first. ``where``: the slices'
    values (``envs``) and the `SliceStore` keeping them."""
    opts, main = build.options, build.ir.main_graph
    envs, kept = where
    optimizer = req.optimizer
    optimizer.remote = RemoteState(replication_of(opts))
    dtype = loss_node.meta["example_value"].dtype
    # the loss scale, as every step shape seeds it (`update_parameters` divides it back)
    seed = scaled_seed(opts.loss_scaling, popxl.dtype.as_dtype(dtype))
    grads: list[dict] = [{loss_node: seed} for _ in envs]  # per slice
    for lp, calls, st in reversed(list(zip(lowered, fwd_calls, steps))):
        n = len(main.ops)
        _backward_and_update(build, lp, calls, (grads, kept), optimizer)
        st.backward = list(main.ops[n:])
    replicated = opts.replication_factor > 1
    if replicated:
        build.record("replication", _replication_detail(opts))
    # every phase's reduction and update is built: the two records share one plan
    detail = f"{type(optimizer.optimizer).__name__} per phase, state remote"
    build.record("optimizer", detail, unchanged=replicated)


def _check_sizes(build: Build, req: Any, pieces: list[Piece]) -> None:
    """A phase too big for one IPU by its variables alone raises now (where the device's
    out-of-memory is an error; a what-if plan just reports its peak)."""
    machine = machine_for(build.options.device)
    if build.plan_only or not machine.oom_is_error:
        return
    optim = req.optimizer
    groups = optim.optimizer.param_groups
    slots = state_slots(optim.kind, groups)
    opts = build.options
    shards = opts.replication_factor if opts.replicated_tensor_sharding else 1
    check_phase_sizes(req.root, pieces, build.prefix, slots, shards, machine.bytes_per_ipu)


def _torch_names(root: torch.nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    names = {n: ("param", t) for n, t in root.named_parameters()}
    names.update({n: ("buffer", t) for n, t in root.named_buffers()})
    return names


def _lower_piece(piece: Piece, names: dict, contexts, shards: int, build: Build) -> _Lowered:
    """The piece's forward graph and variables: trainable parameters remote (sharded over
    ``shards`` replicas when more than 1), the rest on chip."""
    graphs = lower_piece(build, piece.gm, piece.examples(), contexts)
    factories = graphs.facts.to_dict()
    remote = [k for k in factories if k in names and _trainable(names[k])]
    local = {
        k: f.create_tensor(k if k in names else f"{piece.label}.{k}")
        for k, f in factories.items()
        if k not in remote and k != SEED_NAME  # one seed for all pieces: `SeedStream`
    }
    lp = _Lowered(piece, graphs, remote, local)
    if remote:
        chosen = addons.NamedVariableFactories.from_dict({k: factories[k] for k in remote})
        lp.buffers = named_variable_buffers(chosen, 1, shard_over_dict=shards)
        # (init_remote makes remote variables; the tree types its leaves as tensors)
        lp.remote_vars = cast(
            dict[str, popxl.Variable], chosen.init_remote(lp.buffers, 0).to_dict()
        )
    return lp


def _trainable(entry: tuple[str, torch.Tensor]) -> bool:
    return entry[0] == "param" and entry[1].requires_grad


def _lower_detail(lowered: list[_Lowered]) -> str:
    phases = [lp.piece.label for lp in lowered if lp.piece.phase]
    remote = sum(len(lp.remote) for lp in lowered)
    return (
        f"{len(phases)} phases ({', '.join(phases)}) and {len(lowered) - len(phases)} glue "
        f"pieces, each its own graph; {remote} parameters in Streaming Memory"
    )


def _plan_gradients(lowered: list[_Lowered], loss_node) -> None:
    """Which inputs of each piece need a gradient (they depend on a trainable parameter)
    and which outputs get one (read by a later piece that needs it, or the loss)."""
    needs: dict = {}
    for lp in lowered:
        lp.needs = [needs.get(n, False) for n in lp.piece.inputs]
        out = bool(lp.remote) or any(lp.needs)
        for n in lp.piece.outputs:
            needs[n] = out and n.meta["example_value"].is_floating_point()
    readers = {n for lp in lowered for n, w in zip(lp.piece.inputs, lp.needs) if w}
    for lp in lowered:
        lp.provided = [
            i
            for i, n in enumerate(lp.piece.outputs)
            if needs[n] and (n in readers or n is loss_node)
        ]


def _differentiate(lp: _Lowered, accumulate: bool) -> None:
    """Autodiff of the piece's forward (before any call site: it adds forward outputs); with
    ``accumulate`` (several slices) the parameters' gradients are mean-accumulated."""
    if not lp.provided:
        return
    graph = lp.forward.graph
    args = lp.forward.args.to_dict()
    inputs = [t for t in graph.inputs if t not in set(args.values())]
    required = [t for t, w in zip(inputs, lp.needs) if w] + [args[k] for k in lp.remote]
    if not required:
        lp.provided = []
        return
    provided = [graph.outputs[i] for i in lp.provided]
    params = [args[k] for k in lp.remote] if accumulate else []
    inputs_only = required[: len(required) - len(params)]
    lp.accum, _ = gradient_graph(lp.graphs, provided, inputs_only, accumulated=params)


def _load(lp: _Lowered) -> dict[str, popxl.Tensor]:
    """The piece's parameters loaded from Streaming Memory (with RTS: this replica's shards)."""
    return load_remote(lp.buffers, 0).to_dict() if lp.buffers is not None else {}


def _whole(loaded: dict[str, popxl.Tensor]) -> dict[str, popxl.Tensor]:
    """Full parameters for the forward and backward graphs: with RTS the loaded shards
    all-gathered (seed 003's shape), else the loaded tensors themselves."""
    return {
        k: addons.rts.gather_replica_sharded_tensor(t) if t.meta_shape else t
        for k, t in loaded.items()
    }


def _forward(lp: _Lowered, i: int, envs: list[dict], kept: SliceStore, seed) -> tuple:
    """Load the piece's parameters once and call its forward on every slice, each slice's
    draws from its own seed (``seed``'s); its outputs join each slice's env. Returns the
    loaded parameters and, per slice, the call's info, its inputs and what its backward
    reads (`_call_slice`)."""
    loaded = _whole(_load(lp))
    calls = []
    for j, env in enumerate(envs):
        drawn = seed.bound(j) if SEED_NAME in lp.local else {}
        named = addons.NamedTensors.from_dict({**lp.local, **loaded, **drawn})
        calls.append(_call_slice(lp, lp.forward.bind(named), f"p{i}", j, env, kept))
    return loaded, calls


def _call_slice(lp: _Lowered, graph, role: str, j: int, env: dict, kept: SliceStore) -> tuple:
    """The forward call on slice ``j``: (info, its inputs, the backward's inputs), the
    values other phases or the backward read kept by ``kept`` (on chip with one slice)."""
    ins = [kept.fetch(env[n]) for n in lp.piece.inputs]
    info = graph.call_with_info(*ins)
    where = {x: env[n] for x, n in zip(ins, lp.piece.inputs)}  # reloaded from where they came
    for i, n in enumerate(lp.piece.outputs):
        where[info.parent_output(i)] = env[n] = kept.keep(
            f"{role}.out{i}", j, info.parent_output(i)
        )
    needed = lp.backward.grad_graph_info.inputs_dict(info) if lp.backward is not None else {}
    if kept.count == 1:
        return info, ins, needed
    made = set(info.outputs)  # activations the backward reads (weights stay as they are)
    acts: dict = {}
    for b, t in needed.items():
        if t not in where and t in made:
            where[t] = kept.keep(f"{role}.act{len(acts)}", j, t)
        acts[b] = where.get(t, t)
    return info, ins, acts


def _backward_and_update(build: Build, lp: _Lowered, calls, where, optim) -> None:
    """The piece's backward on reloaded parameters, slice by slice: its inputs' gradients
    added to each slice's ``grads``, the parameters' gradients mean-accumulated over the
    slices; then the optimizer's update of its parameters, stored back."""
    if lp.backward is None:
        return
    grads, kept = where
    loaded, per_slice = calls
    reloaded = _load(lp)  # stored back after the update: shards with RTS
    whole = _whole(reloaded)
    swap = {loaded[k]: whole[k] for k in whole}
    accum = lp.accum.init_zero() if lp.accum is not None else None
    graph = lp.backward.bind(accum) if accum is not None else lp.backward
    grad_info = lp.backward.grad_graph_info
    for j, (info, ins, needed) in enumerate(per_slice):
        args = {b: kept.fetch(swap.get(t, t)) for b, t in needed.items()}
        given = [kept.fetch(grads[j][lp.piece.outputs[i]]) for i in lp.provided]
        by_input = grad_info.fwd_parent_ins_to_grad_parent_outs(
            info, graph.call_with_info(*given, args=args)
        )
        for n, x, wanted in zip(lp.piece.inputs, ins, lp.needs):
            if wanted:
                prev, g = grads[j].get(n), by_input[x]
                total = g if prev is None else ops.add(kept.fetch(prev), g)
                grads[j][n] = kept.keep(f"grad.{n.name}.{lp.piece.label}", j, total)
    if not lp.remote:
        return
    prefix = build.prefix
    short = {k: k[len(prefix) :] if k.startswith(prefix) else k for k in lp.remote}
    params = {short[k]: reloaded[k] for k in lp.remote}
    if accum is not None:
        sums = accum.to_dict()
        got = {k: sums[f"accum.{k}"] for k in lp.remote}
    else:
        got = {k: by_input[loaded[k]] for k in lp.remote}
    update_parameters(build, optim, params, {short[k]: got[k] for k in lp.remote}, record=False)
    store_remote(lp.buffers, addons.NamedTensors.from_dict(reloaded), 0)


def _slices_detail(slices: Slices) -> str:
    return (
        f"{slices.k} micro-batches x {slices.s} slices per phase: weights loaded once per "
        "phase, activations and gradients between phases in Streaming Memory per slice, "
        "parameter gradients mean-accumulated"
    )


def _replication_detail(opts) -> str:
    r = opts.replication_factor
    how = "mean all-reduced"
    if opts.replicated_tensor_sharding:
        how = "reduce-scattered (mean), optimizer state sharded ceil(n/R) per replica"
    return f"{r} replicas, each on 1/{r} of the batch; gradients {how}, per phase"
