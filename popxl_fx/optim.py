"""A torch.optim optimizer as var-update ops in the IR, reproducing torch's arithmetic.

`OptimizerProgram` reads a `torch.optim.SGD`, `Adam` or `AdamW` (param groups included) and
builds each parameter's update from popxl ops, in the order and rounding of torch's CPU
single-tensor implementation. Hyper-parameters are not baked into the program: each param group
gets one float32 scalar stream per hyper-parameter, and `feeds()` reads the torch optimizer's
``param_groups`` before every step, so a ``torch.optim.lr_scheduler`` changes the simulated
learning rate without recompiling. Scalars that torch computes in double precision on the host
(bias corrections, ``lr / (1 - beta1**step)``) are computed the same way here and fed.

State (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ``step``) lives in variables, starts
from the optimizer's state when it has one, and `state_to_torch` writes it back in
``optimizer.state_dict()`` format.

SGD and Adam(W) match torch bit for bit: each update is torch's single-tensor (CPU default,
``foreach=False``) sequence op for op, with torch's fused kernels (``lerp_``, ``addcmul_``,
``addcdiv_``) as var-update ops of their own. A ``fused=True`` group is built by
`optim_fused` from torch's multi-tensor fused kernels instead (amsgrad included there). What a
param group means (its kind, refused options, structure and fed hyper-parameters) is in
`optim_groups`. With outlined blocks, each block's updates are one graph per block shape,
called per block (`optim_outline`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_core.context import module_origin

from . import optim_clip, optim_storage
from .optim_fused import FusedBuilder, fused_feeds
from .optim_groups import (
    ADAM_HYPER,
    LOWERINGS,
    SGD_HYPER,
    UnsupportedOptimizerError,
    adam_hyper,
    check_group,
    decoupled,
    group_structure,
    hyper_source,
    optimizer_kind,
    sgd_hyper,
)
from .optim_outline import OutlinedUpdates, block_chunks
from .optim_remote import RemoteState
from .optim_replicated import Replication

__all__ = ["OptimizerProgram", "UnsupportedOptimizerError", "group_structure"]


@dataclass
class _Group:
    """One param group: its parameter names and its hyper-parameter streams."""

    index: int
    names: list[str]
    streams: dict[str, popxl.HostToDeviceStream] = field(default_factory=dict)
    step: int = 0  # steps taken (Adam's `step`; SGD: 0 until a momentum buffer exists)
    structure: tuple = ()  # `OptimizerProgram._structure` of the group the program was built for
    fed: tuple = ((), {})  # (what the last feeds were computed from, those feeds)


class OptimizerProgram:
    """``optimizer``'s update of the variables named in ``names`` (torch param -> var name).

    Example (inside ``with ir.main_graph:``; ``params``/``grads`` map names to tensors)::

        prog = OptimizerProgram(opt, {p: n for n, p in model.named_parameters()})
        prog.build(params, grads)
        session.run({**prog.feeds(), ...})
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        names: Mapping[torch.Tensor, str],
        replication: Replication | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.replication = replication or Replication()
        self._shapes: dict[str, tuple] = {}  # each parameter's full shape (state is made so)
        self.kind = optimizer_kind(optimizer)
        by_id = {id(p): n for p, n in names.items()}
        self.groups: list[_Group] = []
        for i, group in enumerate(optimizer.param_groups):
            check_group(optimizer, self.kind, i, group)
            missing = [tuple(p.shape) for p in group["params"] if id(p) not in by_id]
            if missing:
                raise UnsupportedOptimizerError(
                    f"param group {i} holds tensors that are not parameters of the model "
                    f"(shapes {missing}); optimise the traced model's own parameters."
                )
            self.groups.append(_Group(i, [by_id[id(p)] for p in group["params"]]))
        self.params = {by_id[id(p)]: p for g in optimizer.param_groups for p in g["params"]}
        self.state: dict[str, dict[str, popxl.Variable]] = {}
        self._local: Callable[[popxl.Tensor], popxl.Tensor] | None = None
        # phased: state in remote buffers (`optim_remote`), built phase by phase; the
        # hyper-parameter scalars are loaded once per step and shared by the phases' updates
        self.remote: RemoteState | None = None
        self._hyper_loaded: dict[int, dict] = {}
        self.blocks: list[Sequence[str]] = []  # `build`'s outlined blocks
        self._outlined = OutlinedUpdates(self)
        for g in self.groups:
            g.step = self._initial_step(g)

    # structure -----------------------------------------------------------------------
    def key(self) -> tuple:
        """What the built program depends on besides the hyper-parameter values."""
        return (
            self.kind,
            tuple(
                (tuple(g.names), self._structure(pg))
                for g, pg in zip(self.groups, self.optimizer.param_groups)
            ),
        )

    def _structure(self, pg: Mapping) -> tuple:
        return group_structure(type(self.optimizer), pg)

    def _initial_step(self, g: _Group) -> int:
        """The step count of the optimizer's existing state (0 when it has none)."""
        states = [self.optimizer.state.get(self.params[n], {}) for n in g.names]
        key = "momentum_buffer" if self.kind == "sgd" else "step"
        steps = {
            int(float(s["step"])) if key == "step" else 1 for s in states if s.get(key) is not None
        }
        if len(steps) > 1 or (
            steps and len([s for s in states if s.get(key) is not None]) != len(states)
        ):
            raise UnsupportedOptimizerError(
                f"param group {g.index}: its parameters have different optimizer state "
                "(step counts or missing buffers); the simulated optimizer steps a group as one."
            )
        return steps.pop() if steps else 0

    # building ------------------------------------------------------------------------
    def build(
        self,
        params: Mapping[str, popxl.Tensor],
        grads: Mapping[str, popxl.Tensor],
        local: Callable[[popxl.Tensor], popxl.Tensor] | None = None,
        blocks: Sequence[Sequence[str]] = (),
    ) -> None:
        """Add the update of every parameter that has a gradient (in the current graph); with
        replication ``grads`` are already reduced over the replicas
        (`pipeline.reduce_gradients`), with RTS into shards (`optim_replicated`).

        ``local``: when the current graph is a subgraph (a step repeated per device
        iteration), state variables are made in the main graph and ``local(variable)`` is the
        subgraph's input that stands for it.

        ``blocks``: the outlined blocks' module paths, per group of blocks of one structure
        (``[["blocks.0", "blocks.1", ...]]``): each block's parameters are updated by one
        update graph per block shape, called once per block (`optim_outline`).

        Phased (``self.remote`` set): called once per phase with that phase's (loaded)
        parameters; each state tensor is loaded from its remote buffer at first use and
        stored back once the phase's updates are built.
        """
        self._local = local
        self.blocks = list(blocks)
        with popxl.in_sequence():
            grads = optim_clip.clipped(self, grads)
            for g, pg in zip(self.groups, self.optimizer.param_groups):
                g.structure = self._structure(pg)
                names = [n for n in g.names if n in grads]
                if names:
                    self._build_group(g, pg, names, params, grads)
            if self.remote is not None:
                self.remote.store()

    def _build_group(self, g: _Group, pg: Mapping, names: list, params, grads) -> None:
        # full shapes (phased with RTS the parameters are loaded shards: their meta shape)
        self._shapes.update({n: tuple(params[n].meta_shape or params[n].shape) for n in names})
        # with RTS the gradients are shards (`pipeline.reduce_gradients`): so are the weights
        if getattr(LOWERINGS.get(self.kind), "WHOLE_TENSORS", False) and self.replication.sharded:
            raise UnsupportedOptimizerError(
                f"param group {g.index}: {type(self.optimizer).__name__} takes norms of whole "
                "weights, but replicated tensor sharding updates each replica's shard."
            )
        targets = {n: self.replication.target(params[n]) for n in names}
        if pg.get("fused") and self.remote is not None:
            raise UnsupportedOptimizerError(
                f"param group {g.index}: fused=True updates all parameters of a group in one "
                "kernel, but phased_execution updates them phase by phase; use fused=False."
            )
        if pg.get("fused"):
            fused = FusedBuilder(self.kind, self._state_var)
            g.streams = fused.streams(g.index)
            fused.build(g.streams, names, targets, grads, pg)
        else:
            loaded = self._hyper_loaded.setdefault(g.index, {})
            # a PopTorch group's float16 weights update in float32 (`optim_storage`)
            dtype = lambda n: optim_storage.compute_dtype(pg, params[n].dtype)
            hyper = lambda n: self._hyper(g, dtype(n), loaded)
            blocks = self.blocks if self.remote is None else []  # phased: a graph per phase
            for block, chunk in block_chunks(names, blocks):
                if block:  # one update graph per block shape, called per block
                    self._outlined.call(block, chunk, targets, grads, hyper, (g.index, pg))
                    continue
                # the update's ops name the parameter's module (reports, OOM tables)
                n = chunk[0]
                with module_origin(f"optimizer.{n.rsplit('.', 1)[0] if '.' in n else '<root>'}"):
                    self._update(self._state_var)(n, targets[n], grads[n], hyper(n), pg)
        for n in names:
            self.replication.write_back(params[n], targets[n])

    def _hyper(self, g: _Group, dtype: popxl.dtype, loaded: dict) -> dict[str, popxl.Tensor]:
        """The group's hyper-parameter scalars in ``dtype`` (one stream each, made once)."""
        if dtype.name not in loaded:
            suffix = "" if dtype == popxl.float32 else f".{dtype.name}"
            hyper = {"sgd": SGD_HYPER, "adam": ADAM_HYPER}.get(self.kind)
            hyper = hyper or LOWERINGS[self.kind].HYPER
            streams = {
                h + suffix: popxl.h2d_stream((), dtype, f"optimizer.group{g.index}.{h}{suffix}")
                for h in hyper
            }
            g.streams.update(streams)
            loaded[dtype.name] = {h: ops.host_load(streams[h + suffix], h + suffix) for h in hyper}
        return loaded[dtype.name]

    def _initial(self, name: str, key: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """The torch optimizer's state value (zeros where it has none)."""
        value = self.optimizer.state.get(self.params[name], {}).get(key)
        if value is None:  # a fill: no host memory until a Session attaches (planning)
            return np.broadcast_to(np.full((), self.initial_fill(name, key), dtype), shape)
        return value.detach().cpu().numpy().astype(dtype).reshape(shape)

    def initial(self, name: str, key: str) -> np.ndarray:
        """A state tensor's value before this program's first step (full shape)."""
        var = self.state[name][key]
        shape = () if key == "step" else self._shapes[name]
        return np.array(self._initial(name, key, shape, var.dtype.as_numpy()))

    def initial_fill(self, name: str, key: str) -> float:
        """A state tensor's value before the first step (0 but where its kind says)."""
        fill = getattr(LOWERINGS.get(self.kind), "initial_fill", None)
        if fill is None:
            return 0.0
        p = self.params[name]
        return fill(next(pg for pg in self.optimizer.param_groups if _holds(pg, p)), key)

    def _state_var(
        self, name: str, key: str, like: popxl.Tensor, dtype: popxl.dtype | None = None
    ) -> popxl.Tensor:
        """A state variable for the update of ``like`` (the weight, or its RTS shard): the
        tensor the update works on (with RTS this replica's shard of it)."""
        # torch keeps `step` as a float32 scalar and the rest in the parameter's dtype
        step = key == "step"
        shape, dtype = ((), popxl.float32) if step else (self._shapes[name], dtype or like.dtype)
        data = self._initial(name, key, shape, dtype.as_numpy())
        made = f"optimizer.{name}.{key}", step
        if self.remote is not None:
            var, used = self.remote.state_variable(data, dtype, *made)
        elif self._local is None:
            var, used = self.replication.state_variable(data, dtype, *made)
        else:
            with popxl.gcg().ir.main_graph:  # variables live in the main graph only
                var, used = self.replication.state_variable(data, dtype, *made)
            used = self._local(used)
        self.state.setdefault(name, {})[key] = var
        return used

    def _update(self, state: Callable) -> Callable:
        """The update of one parameter: ``(name, weight, grad, hyper, group)``, its state
        tensors made by ``state(name, key, like, dtype=None)`` (`_state_var`, or an outlined
        update graph's inputs)."""
        update = {"sgd": self._sgd, "adam": self._adam}.get(self.kind, self._lowered)
        stored = optim_storage.with_storage(self.kind, update)  # PopTorch's accum dtypes
        return lambda *args: stored(*args, state=state)

    def _sgd(self, name: str, p, grad, hp, pg, state: Callable) -> None:
        if pg["maximize"]:
            grad = ops.negate(grad)
        if pg["weight_decay"] != 0:
            grad = ops.scaled_add(grad, p, b=hp["weight_decay"])
        if pg["momentum"] != 0:
            buf = state(name, "momentum_buffer", p)
            # torch clones the gradient on the first step: 0 * 0 + 1 * grad is the same bits
            ops.scaled_add_(buf, grad, a=hp["buf_scale"], b=hp["damp_alpha"])
            grad = ops.scaled_add(grad, buf, b=hp["momentum"]) if pg["nesterov"] else buf
        ops.scaled_add_(p, grad, b=hp["neg_lr"])

    def _adam(self, name: str, p, grad, hp, pg, state: Callable) -> None:
        # torch's _single_tensor_adam, op for op (lerp_, addcmul_ and addcdiv_ are its kernels)
        if pg["maximize"]:
            grad = ops.negate(grad)
        step = state(name, "step", p)
        ops.var_updates.accumulate_(step, popxl.constant(1.0, popxl.float32))
        if pg["weight_decay"] != 0:
            if decoupled(pg):
                ops.var_updates.accumulator_scale_(p, hp["decay"])
            else:
                grad = ops.scaled_add(grad, p, b=hp["weight_decay"])
        m = state(name, "exp_avg", p)
        v = state(name, "exp_avg_sq", p)
        ops.var_updates.lerp_(m, grad, hp["w1"])
        ops.var_updates.accumulator_scale_(v, hp["beta2"])
        ops.var_updates.addcmul_(v, grad, grad, hp["c2"])
        denom = ops.sqrt(v) / hp["bc2_sqrt"] + hp["eps"]
        ops.var_updates.addcdiv_(p, m, denom, hp["neg_step_size"])

    def _lowered(self, name: str, p, grad, hp, pg, state: Callable) -> None:
        LOWERINGS[self.kind].build_update(state, name, p, grad, hp, pg)

    # per step ------------------------------------------------------------------------
    def feeds(self) -> dict[popxl.HostToDeviceStream, np.ndarray]:
        """The hyper-parameters of the next step, read from the torch optimizer now."""
        out: dict[popxl.HostToDeviceStream, np.ndarray] = {}
        for g, pg in zip(self.groups, self.optimizer.param_groups):
            if not g.streams:
                continue
            self._check_unchanged(g, pg)
            g.step += 1
            if pg.get("fused"):
                out.update(fused_feeds(self.kind, g.streams, pg, g.step))
                continue
            # the arrays are made again only when what they are computed from changed (SGD:
            # after its first step, only when a scheduler changes lr; Adam: every step)
            source = hyper_source(self.kind, pg, g.step)
            if source != g.fed[0]:
                g.fed = (source, self._hyper_arrays(g, pg))
            out.update(g.fed[1])
        return out

    def feeds_for(self, steps: int) -> dict[popxl.HostToDeviceStream, np.ndarray]:
        """The hyper-parameters of the next ``steps`` steps, stacked (one row per step, for a
        program that repeats its step ``steps`` times per run): read from the torch optimizer
        now, so an lr scheduler's change applies from the next call."""
        if steps == 1:
            return self.feeds()
        rows = [self.feeds() for _ in range(steps)]
        return {s: np.stack([row[s] for row in rows]) for s in rows[0]}

    def _hyper_arrays(self, g: _Group, pg: Mapping) -> dict:
        if self.kind in LOWERINGS:
            values = LOWERINGS[self.kind].hyper_values(pg, g.step)
        else:
            values = sgd_hyper(pg, g.step) if self.kind == "sgd" else adam_hyper(pg, g.step)
        return {
            s: np.asarray(values[h.split(".")[0]], s.dtype.as_numpy()) for h, s in g.streams.items()
        }

    def _check_unchanged(self, g: _Group, pg: Mapping) -> None:
        if self._structure(pg) != g.structure:
            raise UnsupportedOptimizerError(
                f"param group {g.index} changed an option the program was built with "
                "(momentum/weight_decay on or off, nesterov, maximize, decoupled weight decay, "
                "fused, amsgrad); "
                "build a new trainer."
            )

    def state_to_torch(self, values: Mapping[popxl.Variable, np.ndarray]) -> None:
        """Write the state variables' ``values`` into the torch optimizer's ``state``."""
        for name, vars_ in self.state.items():
            p = self.params[name]
            state = self.optimizer.state[p]
            for key, var in vars_.items():
                t = torch.from_numpy(np.array(values[var]))
                state[key] = t.reshape(()) if key == "step" else t.reshape(p.shape)

    def state_from_torch(self) -> dict[popxl.Variable, np.ndarray]:
        """The state variables' values from the torch optimizer now (for
        ``session.write_variables_data``); the step counts restart from its state too."""
        for g in self.groups:
            g.step = self._initial_step(g)
        return {
            var: self._initial(name, key, tuple(var.shape), var.dtype.as_numpy())
            for name, vars_ in self.state.items()
            for key, var in vars_.items()
        }

    def variables(self) -> list[popxl.Variable]:
        return [v for vs in self.state.values() for v in vs.values()]


def _holds(pg: Mapping, p: torch.Tensor) -> bool:
    return any(q is p for q in pg["params"])
