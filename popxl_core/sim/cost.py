"""Cycle and code-size estimates of ops on a simulated IPU: the BSP model of ipu_model.md §2.

Every op that does work is one BSP superstep: a global sync, an exchange of the operands that
must move between tiles, then compute on the tiles the op is spread over. Host, IPU-Link and
Streaming-Memory transfers cost latency + bytes / bandwidth. Control flow walks into the called
graphs: a Call costs its callee, a Loop ``repeat_count`` times its body, an If its dearer
branch. Ops recorded as one concurrent step (`transforms.ipu_concurrency`, e.g. a pipeline's
time step) run on their IPUs at once: the step costs its busiest IPU's cycles plus its
inter-IPU copies. All numbers are estimates, like the IPU Model's own cycle counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from math import ceil, prod
from operator import add

from ..graph import Graph, Op
from ..ops.call import CALL, REPEAT
from ..ops.conditional import CONDITIONAL
from ..ops.io import HOST_LOAD, HOST_STORE, IO_TILE_COPY, IPU_COPY
from ..ops.remote import REMOTE_LOAD, REMOTE_LOAD_INPLACE, REMOTE_STORE
from ..schedule import schedule
from ..transforms.ipu_concurrency import concurrent_runs
from .machine import Machine
from .remote_plan import pays_exchange_sync
from .ring import IPU_LINKS, RING_FACTOR, Exchanges

__all__ = [
    "CODE_BYTES_PER_OP",
    "CODE_BYTES_PER_TILE",
    "CONTROL_CYCLES",
    "GRAIN_BYTES",
    "CostModel",
    "Cycles",
    "Work",
    "nbytes_of",
    "rts_shard",
    "sync_cycles",
]

# Assumed, not measured: the program, compute-set and copy descriptors of one op instance...
CODE_BYTES_PER_OP = 512
# ...plus, on every tile the op uses, its vertex state and exchange code.
CODE_BYTES_PER_TILE = 48
# Poplar spreads a tensor over tiles in grains; a small tensor lands on few tiles.
GRAIN_BYTES = 256
# Control-flow cost of entering a call, one loop iteration or a branch.
CONTROL_CYCLES = 10


# tables of op rows (the objects, not their type names)
_CONTROL_OPS = frozenset((CALL, REPEAT, CONDITIONAL))
_REMOTE = frozenset((REMOTE_LOAD, REMOTE_LOAD_INPLACE, REMOTE_STORE))


@dataclass(slots=True)  # not frozen: frozen dataclasses are slow to build
class Cycles:
    """Estimated cycles split like PopVision's BSP trace, plus transfers and control flow."""

    compute: int = 0
    exchange: int = 0
    sync: int = 0
    host: int = 0
    link: int = 0
    remote: int = 0
    control: int = 0
    launch: int = 0  # the fixed cost of one Session.run (Machine.run_overhead_s)

    @property
    def total(self) -> int:
        return sum(self._values())

    def _values(self) -> tuple[int, ...]:
        # explicit (not dataclasses.fields): planning adds these once per op
        return (
            self.compute,
            self.exchange,
            self.sync,
            self.host,
            self.link,
            self.remote,
            self.control,
            self.launch,
        )

    def __add__(self, other: Cycles) -> Cycles:
        return Cycles(*map(add, self._values(), other._values()))

    def scaled(self, n: int) -> Cycles:
        return Cycles(*(v * n for v in self._values()))

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"total": self.total}


@dataclass(slots=True)  # not frozen: frozen dataclasses are slow to build
class Work:
    """What one execution (of an op or a whole graph) costs: cycles, FLOPs and traffic."""

    cycles: Cycles = field(default_factory=Cycles)
    flops: int = 0
    host_bytes_in: int = 0
    host_bytes_out: int = 0
    link_bytes: int = 0
    remote_bytes_loaded: int = 0
    remote_bytes_stored: int = 0

    def _values(self) -> tuple[int, ...]:
        return (
            self.flops,
            self.host_bytes_in,
            self.host_bytes_out,
            self.link_bytes,
            self.remote_bytes_loaded,
            self.remote_bytes_stored,
        )

    def __add__(self, other: Work) -> Work:
        return Work(self.cycles + other.cycles, *map(add, self._values(), other._values()))

    def scaled(self, n: int) -> Work:
        return Work(self.cycles.scaled(n), *(v * n for v in self._values()))

    @staticmethod
    def total_of(works: list[Work]) -> Work:
        """The sum of many Works, field by field."""
        cycles = Cycles(*map(sum, zip(*(w.cycles._values() for w in works))))
        return Work(cycles, *map(sum, zip(*(w._values() for w in works))))


def nbytes_of(t) -> int:
    """Bytes of a tensor or stream (plain ints: much cheaper than numpy for planning)."""
    spec = getattr(t, "_spec", None)  # a Tensor: its spec holds the count (hot in planning)
    if spec is not None:
        return spec.nbytes
    return prod(t.shape) * t.dtype.itemsize


def rts_shard(numel: int, replicas: int) -> int:
    """Elements each replica holds of a replica-sharded tensor: ``ceil(numel / R)``; the last
    replicas' shards are zero-padded (30 elements over 4: 8, 8, 7 + 1 pad, 7 + 1 pad)."""
    if replicas < 1:
        raise ValueError(f"rts_shard: replicas must be >= 1, got {replicas}.")
    return -(-numel // replicas)


def sync_cycles(machine: Machine, num_ipus: int) -> int:
    """One global BSP sync: 2 x 15 ns per hop, one hop more per 4 IPUs (poplibs IPUModel)."""
    hops = 1 + num_ipus // 4
    return ceil(2 * machine.sync_ns_per_hop * 1e-9 * hops * machine.clock_hz)


def _cdiv(a: float, b: float) -> int:
    return ceil(a / b) if a > 0 else 0


class CostModel:
    """Estimates ops and graphs on ``machine``; results per graph are cached.

    Args:
        machine: the target's constants.
        num_ipus: IPUs taking part in a global sync (IPUs per replica x replicas).
        io_tiles: tiles reserved for IO (``SessionOptions.numIOTiles``).
        replicas: replication factor, for the ring collectives.
    """

    def __init__(
        self, machine: Machine, num_ipus: int = 1, io_tiles: int = 0, replicas: int = 1
    ) -> None:
        self.machine = machine
        self.replicas = replicas
        self.sync = sync_cycles(machine, num_ipus)
        self.io_tiles = min(max(io_tiles, 0), machine.tiles_per_ipu)
        self.compute_tiles = max(1, machine.tiles_per_ipu - self.io_tiles)
        self._graphs: dict[Graph, Work] = {}
        self._runs: dict[Graph, dict[Graph, int]] = {}
        self._leaves: dict[Op, Work] = {}
        self._tiles: dict[Op, int] = {}

    # placement and code -------------------------------------------------------------
    def tiles_used(self, op: Op) -> int:
        """Tiles an op is spread over: its largest tensor in grains, capped by its tile set."""
        if op not in self._tiles:
            avail = self.io_tiles if op.tile_set == "io" and self.io_tiles else self.compute_tiles
            largest = max((nbytes_of(t) for t in (*op.inputs, *op.outputs)), default=0)
            self._tiles[op] = max(1, min(avail, _cdiv(largest, GRAIN_BYTES)))
        return self._tiles[op]

    def code_bytes(self, op: Op) -> int:
        """Code of one op instance; a called graph's code is counted with that graph."""
        if op.opdef in _CONTROL_OPS:
            return CODE_BYTES_PER_OP
        return CODE_BYTES_PER_OP + CODE_BYTES_PER_TILE * self.tiles_used(op)

    # cycles ------------------------------------------------------------------------
    def graph_work(self, graph: Graph) -> Work:
        """One execution of ``graph``, walking into the graphs it calls."""
        if graph not in self._graphs:
            works = [self._run_work(run) for run in concurrent_runs(schedule(graph))]
            self._graphs[graph] = Work.total_of(works) if works else Work()
        return self._graphs[graph]

    def _run_work(self, run: list[Op]) -> Work:
        """One op, or one concurrent step: its busiest IPU's cycles, then its IPU copies
        (the copies' exchange follows the compute); FLOPs and traffic of every op."""
        if len(run) == 1:
            return self.op_work(run[0])
        works = [self.op_work(op) for op in run]
        per_ipu: dict[int, list[Work]] = {}
        copies: list[Work] = []
        for op, work in zip(run, works):
            (copies if op.opdef is IPU_COPY else per_ipu.setdefault(op.ipu, [])).append(work)
        busiest = max((Work.total_of(ws) for ws in per_ipu.values()), key=_total_cycles)
        cycles = Work.total_of([Work(busiest.cycles), *(Work(w.cycles) for w in copies)]).cycles
        return Work(cycles, *Work.total_of(works)._values())

    def op_work(self, op: Op) -> Work:
        """One execution of ``op``, including the graphs it calls."""
        if op.opdef in _CONTROL_OPS:
            return self._control(op)
        return self.leaf_work(op)

    def _control(self, op: Op) -> Work:
        step = Work(Cycles(control=CONTROL_CYCLES))
        if op.opdef is REPEAT:
            return (self.graph_work(op.called_graphs[0]) + step).scaled(op.attrs["repeat_count"])
        branches = [self.graph_work(g) for g in op.called_graphs]
        return step + max(branches, key=lambda w: w.cycles.total, default=Work())

    def leaf_work(self, op: Op) -> Work:
        """One execution of an op that calls no graph."""
        if op not in self._leaves:
            self._leaves[op] = self._leaf_work(op)
        return self._leaves[op]

    def _leaf_work(self, op: Op) -> Work:
        special = self._transfer(op)
        if special is not None:
            return special
        rule = RING_FACTOR.get(op.opdef)
        if isinstance(rule, Exchanges):  # compute with all-reduces of partial results inside
            return self._compute_work(op) + self._exchanges(op, rule)
        links = IPU_LINKS.get(op.opdef)
        if links is not None:  # compute spanning a replica's IPUs, exchanging between them
            ins, outs = [t.spec for t in op.inputs], [t.spec for t in op.outputs]
            return self._compute_work(op) + self._link(links(ins, outs, op.attrs))
        return self._compute_work(op)

    def _exchanges(self, op: Op, rule: Exchanges) -> Work:
        """The ring all-reduces an `Exchanges` row lists, one after another."""
        ins, outs = [t.spec for t in op.inputs], [t.spec for t in op.outputs]
        sizes = rule.sizes(ins, outs, op.attrs)
        return Work.total_of([self.ring_work(n, 2.0, _group_size(op)) for n in sizes])

    def _compute_work(self, op: Op) -> Work:
        """An op's compute set: its row's FLOPs and bytes over the tiles it uses."""
        ins = [t.spec for t in op.inputs]
        outs = [t.spec for t in op.outputs]
        cost = op.opdef.cost(ins, outs, op.attrs)
        if cost.flops == 0 and cost.bytes == 0:
            return Work()  # no compute set (e.g. an undefined Init, a print)
        m, tiles = self.machine, self.tiles_used(op)
        compute = max(
            _cdiv(cost.flops, tiles * self.flops_per_cycle(op)),
            _cdiv(cost.bytes, tiles * m.sram_bytes_per_cycle_per_tile),
        )
        exchange = _cdiv(_exchanged_bytes(op), tiles * m.exchange_bytes_per_cycle_per_tile)
        cycles = Cycles(
            compute=compute + m.compute_set_overhead_cycles, exchange=exchange, sync=self.sync
        )
        return Work(cycles, flops=int(cost.flops))  # int: op tables may hand back numpy ints

    def flops_per_cycle(self, op: Op) -> int:
        """Per tile: the FP16 AMP rate when an operand is 16-bit or narrower float, else FP32."""
        narrow = any(
            t.dtype.is_floating_point and t.dtype.itemsize <= 2 for t in (*op.inputs, *op.outputs)
        )
        m = self.machine
        return m.fp16_flops_per_cycle_per_tile if narrow else m.fp32_flops_per_cycle_per_tile

    def _transfer(self, op: Op) -> Work | None:
        """Host, Streaming-Memory, IPU-Link and tile-set copies: latency + bytes / bandwidth."""
        m, d = self.machine, op.opdef
        if d is HOST_LOAD or d is HOST_STORE:
            nbytes = nbytes_of((op.outputs if d is HOST_LOAD else op.inputs)[0])
            host = ceil((m.host_latency_s + nbytes / m.host_bytes_per_s) * m.clock_hz)
            sync = self.sync if pays_exchange_sync(op) else 0
            return Work(
                Cycles(sync=sync, host=host),
                host_bytes_in=nbytes * (d is HOST_LOAD),
                host_bytes_out=nbytes * (d is HOST_STORE),
            )
        if d in _REMOTE:
            nbytes = max(nbytes_of(x) for x in (*op.inputs[:1], *op.outputs[:1]))
            # merge_exchange: the second and later ops of one merged exchange share its sync
            return self.remote_work(nbytes, stored=d is REMOTE_STORE, sync=pays_exchange_sync(op))
        if d is IO_TILE_COPY:
            nbytes = nbytes_of(op.inputs[0])
            tiles = self.tiles_used(op)
            exchange = _cdiv(nbytes, tiles * m.exchange_bytes_per_cycle_per_tile)
            return Work(Cycles(sync=self.sync, exchange=exchange))
        if d is IPU_COPY:
            return self._link(nbytes_of(op.inputs[0]))
        factor = RING_FACTOR.get(d)
        if isinstance(factor, Exchanges):  # a computing op: `_leaf_work` adds its all-reduces
            return None
        if callable(factor):  # the traffic depends on the op's attributes (sim/ring.py)
            factor = factor(op.attrs)
        if factor and op.attrs.get("op") != "local":  # local or factor 0: no exchange
            big = max(nbytes_of(x) for x in (*op.inputs[:1], *op.outputs[:1]))
            return self.ring_work(big, factor, _group_size(op))
        return None

    def remote_work(self, nbytes: int, stored: bool, sync: bool = True) -> Work:
        """One Streaming-Memory load or store of ``nbytes``: a sync (unless it shares a merged
        exchange's), then bytes / bandwidth."""
        m = self.machine
        remote = _cdiv(nbytes * m.clock_hz, m.streaming_bytes_per_s)
        return Work(
            Cycles(sync=self.sync if sync else 0, remote=remote),
            remote_bytes_loaded=0 if stored else nbytes,
            remote_bytes_stored=nbytes if stored else 0,
        )

    def ring_work(self, nbytes: int, factor: float, group_size: int | None = None) -> Work:
        """A ring collective over the replicas (of one group) on a tensor of ``nbytes``: each
        replica sends ``factor x (n-1)/n x nbytes`` (all-reduce 2, reduce-scatter and
        all-gather 1)."""
        n = group_size or self.replicas
        return self._link(ceil(factor * (n - 1) / n * nbytes))

    def _link(self, nbytes: int) -> Work:
        m = self.machine
        link = _cdiv(nbytes * m.clock_hz, m.ipu_link_bytes_per_s)
        return Work(Cycles(sync=self.sync, link=link), link_bytes=nbytes)

    # executions -------------------------------------------------------------------
    def graph_runs(self, graph: Graph) -> dict[Graph, int]:
        """How often each graph runs in one execution of ``graph`` (both If branches count)."""
        if graph not in self._runs:
            runs: dict[Graph, int] = {graph: 1}
            for op in graph._ops:
                times = op.attrs.get("repeat_count", 1) if op.opdef is REPEAT else 1
                for callee in op.called_graphs:
                    for g, n in self.graph_runs(callee).items():
                        runs[g] = runs.get(g, 0) + n * times
            self._runs[graph] = runs
        return self._runs[graph]


def _total_cycles(work: Work) -> int:
    return work.cycles.total


def _group_size(op: Op) -> int | None:
    """Replicas in each group of a collective (None: all replicas)."""
    group = op.attrs.get("group")
    return op.attrs.get("group_size") or (group.group_size if group is not None else None)


def _exchanged_bytes(op: Op) -> int:
    """Operands shaped like the output are assumed co-located with it (Poplar maps elementwise
    operands alike); the others (matmul operands, broadcasts, reductions) are exchanged."""
    shape = op.outputs[0].shape if op.outputs else None
    return sum(nbytes_of(t) for t in op.inputs if t.shape != shape)
