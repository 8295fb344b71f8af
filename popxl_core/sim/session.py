"""`Session`: owns an Ir, plans and compiles it once, then runs it on the simulator."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, cast

import numpy as np
import torch

from ..device import DeviceInfo
from ..distributed import placement_for
from ..dot_checks import dot_checkpoint
from ..errors import OpDataError
from ..host_data import is_fill
from ..schedule import verify
from ..streams import DeviceToHostStream, HostToDeviceStream
from ..tensor import Constant, Tensor, Variable
from . import checks
from .ambiguity import check_inplace_ambiguity
from .auto_report import auto_report
from .batching import ReplicaRuns, ReplicaSchedule
from .compile import Program
from .host_malloc import keep_freed_memory
from .machine import machine_for
from .options import DEFAULT, CompileOptions
from .plan import build_plan
from .planned import plan_only, planned
from .prepared_run import PreparedRun
from .reference import ReferenceProgram
from .remote_state import RemoteState, group_value
from .runtime import Runtime, run_replicas
from .session_streams import SessionStreams
from .session_weights import SessionWeights, is_file

__all__ = ["Session", "d2hStreamBufferMaps", "h2dStreamBufferMaps"]

# PopXL's names for the host buffers `Session.run` takes and returns
h2dStreamBufferMaps = Mapping[HostToDeviceStream, np.ndarray]  # PopXL's name
d2hStreamBufferMaps = Mapping[DeviceToHostStream, np.ndarray]

_NOT_ATTACHED = (
    "Must be attached to device before calling a runtime function. Put the call "
    "inside a `Session` context, for example `with session: session.{}(...)`."
)


class Session(SessionStreams, SessionWeights):
    """Runs an Ir on the simulated IPU ("ipu_hw", "ipu_hw:bow", "ipu_model", "cpu" or a
    `popxl_core.sim.machine.target(...)` with overridden tiles, IPUs, memory or clock).

    Building the Session verifies the IR, plans memory and cycles and compiles every graph
    once; `run` then only feeds streams and calls the compiled kernels. ``compile_options``
    (`popxl_core.sim.options.CompileOptions`) switches the compiler's passes, or runs the
    reference interpreter instead (tests).
    """

    def __init__(
        self,
        ir,
        device_desc: str = "cpu",
        weights_to_host_on_exit: bool = True,
        compile_options: Optional[CompileOptions] = None,
    ) -> None:
        # PopXL also takes a device (popxl_core.device.DeviceInfo): built for its kind, run on it
        self._device_info = device_desc if isinstance(device_desc, DeviceInfo) else None
        device_desc = getattr(device_desc, "device_desc", device_desc)
        self.machine = machine_for(device_desc)
        self._built_at = checks.built_at()
        _check_unowned(ir)
        check_inplace_ambiguity(ir)  # PopART refuses unordered in-place writes
        self._ir = ir
        self.device_desc = device_desc
        self.weights_to_host_on_exit = weights_to_host_on_exit
        # in a torch.distributed job this process runs only its share of the replicas
        self._placement = placement_for(ir, {v: v._data for v in ir.main_graph.variables})
        self._runtime = Runtime(ir.replication_factor, self._placement)
        self._fix_streams(ir)
        # plan first: an out-of-memory program fails before anything is compiled or copied
        self.plan = planned(ir, self.machine) if ir.planning else build_plan(ir, self.machine)
        auto_report(self)  # POPXL_SIM_REPORT, as Poplar's autoReport: before a build can fail
        if ir.planning:  # weightless: a plan and a report, nothing to compile or run
            return plan_only(self)
        keep_freed_memory()  # a step's temporaries reuse the last step's pages (host_malloc.py)
        self._program = _program(ir, self._runtime, compile_options or DEFAULT)
        # how the replicas run: uniform work once, folded, in lock step (batching.py)
        self._replicas = ReplicaRuns(ir, self._program, self._runtime)
        ir._session = self
        dot_checkpoint(ir, "FINAL")  # PopART's last dot check: the program as compiled
        self._init_state(ir)

    def _init_state(self, ir) -> None:
        """The variables' host buffers (and per-replica copies), remote state, and the
        detached, in-sync starting state."""
        self._variables: List[Variable] = self._program.variables
        self._variable_index = {v: i for i, v in enumerate(self._variables)}
        self._remote = RemoteState(ir, self._runtime, self._variables)
        self._remote_set = frozenset(self._remote.variables)
        # each variable's host buffer; until first written (or handed out) it is the
        # variable's own data, read in place: a large model's weights are not copied here
        self._host: Dict[Variable, np.ndarray] = {
            v: v._data for v in (*self._variables, *self._remote.variables)
        }
        self._borrowed: Set[Variable] = {v for v in self._host if not is_file(v)}
        # retrieval_mode='all_replicas': what get_tensor_data returns, one row per replica
        self._per_replica: Dict[Variable, np.ndarray] = {
            v: self._replica_rows(v)
            for v in self._host
            if v.retrieval_mode == "all_replicas" and ir.replication_factor > 1
        }
        # replica -> its variables' device values, for the replicas this process runs
        self._device: Optional[Dict[int, List[Any]]] = None  # (`SessionWeights._device`)
        self._shared: Dict[Variable, torch.Tensor] = {}  # `share_variable_storage`
        # with replicas: (indices, shared tensors, their versions after the Session's last
        # write), `_note_shared_versions`
        self._shared_versions: tuple = ()
        self._pending: Set[int] = set()  # device values not copied in yet (weights_from_host)
        self._synced: Set[Variable] = set()  # host == device since the last run (`_sync`)
        self._shards_stored_for: Optional[Set[Variable]] = None  # (`_store_shards`)
        self._attached = False
        self._host_in_sync = True
        self._context_stack: List[bool] = []
        self._whole_inputs: Dict[str, np.ndarray] = {}

    def _replica_rows(self, v: Variable) -> np.ndarray:
        replicas = range(self._ir.replication_factor)
        # each replica's whole value (a sharded variable's, not its shard)
        return np.stack([np.array(group_value(v, self._host[v], r)) for r in replicas])

    def __repr__(self) -> str:
        return f"Session[{self._ir!r} {self.device_desc!r} built at {self._built_at}]"

    # properties --------------------------------------------------------------------
    @property
    def ir(self):
        return self._ir

    @property
    def is_attached(self) -> bool:
        return self._attached

    @property
    def report(self):
        """The simulator's `SimReport` of memory and cycle estimates (planned once, when the
        Session was built); ``session.report.summary()`` prints it."""
        return self.plan.report()

    # context -----------------------------------------------------------------------
    def _set_device(self, device) -> None:
        """PopXL's: run on ``device`` (a `popxl_core.device.DeviceInfo`); checked on attach."""
        self._device_info = device

    def __enter__(self) -> "Session":
        did_attach = not self._attached
        if did_attach and self._device_info is not None:
            checks.check_device(self, self._device_info)
        if did_attach:
            self._attached = True
            self.weights_from_host()
        self._context_stack.append(did_attach)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        did_attach = self._context_stack.pop()
        if not did_attach:
            return
        # elided when the host already has the device's values, as PopXL's lazy weights
        if exc_type is None and self.weights_to_host_on_exit and not self._host_in_sync:
            self.weights_to_host()
        self._attached = False

    def _require_attached(self, what: str) -> None:
        if not self._attached:
            raise ValueError(_NOT_ATTACHED.format(what))

    # reading and writing tensors ------------------------------------------------------
    def get_tensor_data(self, tensor: Tensor) -> np.ndarray:
        """The host value of a variable or constant (a view: `.copy()` it to keep it)."""
        return self.get_tensors_data([tensor])[tensor]

    def get_tensors_data(self, tensors: Iterable[Tensor]) -> Dict[Tensor, np.ndarray]:
        tensors = list(tensors)
        checks.check_tensors_of(self, tensors, "get_tensor_data")
        for t in tensors:
            if t in self._remote.shards:
                raise TypeError(
                    f"get_tensor_data: {t.id!r} is the on-chip shard of replica-sharded "
                    f"variable {t._shard_of.id!r}; read that variable for the full value."
                )
            if not isinstance(t, (Variable, Constant)):
                # PopXL's wording (its tests match on it), then what to do instead
                raise TypeError(
                    f"Tensor {getattr(t, 'id', t)} is not of type Constant or Variable ({t!r}); "
                    "get_tensor_data reads only those: stream intermediate tensors out with "
                    "host_store instead."
                )
        if self._attached and not self._host_in_sync:
            self._sync([t for t in tensors if isinstance(t, Variable)])
        return {
            t: self._per_replica[t]
            if t in self._per_replica
            else self._owned(t)
            if isinstance(t, Variable)
            else cast(Constant, t)._data  # (checked above: a variable or a constant)
            for t in tensors
        }

    def write_variable_data(self, tensor: Variable, data) -> None:
        self.write_variables_data({tensor: data})

    def write_variables_data(self, tensors: Mapping[Variable, object]) -> None:
        """Write host values; all are checked first, so a bad one changes nothing."""
        checks.check_tensors_of(self, tensors, "write_variables_data")
        checked = {v: self._checked_value(v, d) for v, d in tensors.items()}
        for v, arr in checked.items():
            if is_fill(arr):  # one value: kept as a fresh broadcast, copied when written
                self._host[v] = np.broadcast_to(np.array(arr.flat[0]), arr.shape)
                self._borrowed.add(v)
            elif v in self._borrowed:  # the Session's own buffer: a copy of the new value
                self._host[v] = np.array(arr, copy=True)
                self._borrowed.discard(v)
            else:
                self._host[v][...] = arr
            if v in self._per_replica:
                self._per_replica[v][...] = self._replica_rows(v)
        if self._attached:
            if self._shared_versions:  # writes into shared tensors first: noted after
                self._spread_shared_writes()
            self._replicas.unshare(self._device)  # the next run checks the replicas agree
            for v in checked:
                if v in self._remote.variables:
                    if v not in self._remote.pending:  # else made from the new host value
                        self._remote.write(v, self._host[v])
                    continue
                index = self._variable_index[v]
                for r, rep in self._device_now().items():
                    if rep[index] is not None:  # a pending copy takes the new host value
                        rep[index].copy_(self._host_tensor(v, r))
            self._remote.load_shards(self._device_now(), only=set(checked))
            self._note_shared_versions()

    def _checked_value(self, v: Variable, data) -> np.ndarray:
        if not isinstance(v, Variable):
            raise TypeError(
                f"Tensor {getattr(v, 'id', v)} is not of type Variable ({v!r}); "
                "write_variable_data writes only variables."
            )
        if v not in self._host or v in self._remote.shards:
            raise ValueError(f"write_variable_data: {v!r} is not a variable of this Session's Ir.")
        if v.retrieval_mode == "all_replicas":
            # as PopXL: data holds one value per group, and no per-replica write path exists
            raise NotImplementedError(
                f"write_variable_data: variable {v.id!r} has retrieval_mode='all_replicas'; "
                "writing is only supported for retrieval_mode='one_per_group'."
            )
        want = v.dtype.as_numpy()
        if np.isscalar(data) or isinstance(data, (int, float, bool)):
            data = np.asarray(data, dtype=want)
        if isinstance(data, torch.Tensor):
            data = data.detach().numpy()
        arr = np.asarray(data)
        if arr.dtype != want:
            raise TypeError(
                f"write_variable_data: {v.id!r} is {v.dtype.name}, data is {arr.dtype}."
            )
        if arr.shape != self._host[v].shape:
            raise ValueError(
                f"write_variable_data: {v.id!r} has host shape {self._host[v].shape}, "
                f"data has shape {arr.shape}."
            )
        return arr

    # running --------------------------------------------------------------------------
    def run(
        self,
        inputs: Optional[Mapping[HostToDeviceStream, object]] = None,
        downcast_inputs: bool = True,
    ) -> Dict[DeviceToHostStream, np.ndarray]:
        """Run the main graph once per replica; returns one array per device-to-host stream."""
        outputs = checks.StreamOutputs(self.create_host_outputs())
        self._require_attached("run")
        self._run(self._checked_inputs(inputs or {}, downcast_inputs), outputs)
        return outputs

    def run_with_outputs(self, inputs, outputs, downcast_inputs: bool = True) -> None:
        self._require_attached("run")
        feeds = self._checked_inputs(inputs or {}, downcast_inputs)
        checks.check_output_buffers(self, outputs, self._d2h)
        self._run(feeds, outputs)

    def prepared_run(self, streams: Iterable[HostToDeviceStream]) -> PreparedRun:
        """`run` bound to ``streams`` (every one the Ir loads from) for a loop that feeds the
        same streams on every run: the returned `PreparedRun` takes the arrays as a list in
        that order and writes the outputs into buffers of its own (`prepared_run.py`)."""
        return PreparedRun(self, list(streams))

    def _run(self, feeds: Dict[object, np.ndarray], outputs) -> None:
        """The run itself, on checked inputs and output buffers of the right shapes."""
        spec = self._stream_spec
        full = {s: a.reshape(spec[s][2]) for s, a in outputs.items()}
        whole = self._placement.exchange is None
        local = full if whole else {s: np.zeros(spec[s][4], spec[s][0]) for s in outputs}
        getattr(self._program, "deferred", []).clear()  # the last run's gradients (defer.py)
        self._runtime.start(feeds, local)
        device = self._devices()
        self._remote.materialise()  # the remote buffers not made yet (RemoteState.allocate)
        if self._shared_versions:  # written between runs: to every replica
            self._spread_shared_writes()
        schedule = self._replicas.prepare(device, feeds, bool(self._data_dependent))
        # torch.no_grad() without its context-manager objects (1.5 us -> 0.2 us a run)
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            if schedule is ReplicaSchedule.FOLDED:
                self._replicas.run_folded(device, feeds, local)
            else:
                run_replicas(self._runtime, self._replica_body, schedule)
        finally:
            torch._C._set_grad_enabled(grad)
            self._note_shared_versions()
        if not whole:  # every process returns all replicas' outputs
            self._placement.gather_outputs(local, full, self._whole_inputs)
        self._host_in_sync = False
        self._synced = set()

    def _replica_body(self, r: int) -> None:
        """One replica's run of the main graph, with the failing op named on a data error."""
        device = self._device
        assert device is not None  # `_run` made the device values
        main = self._replicas.main_of(r) or self._program.main.fn
        try:
            main(device[r])
        except (OpDataError, IndexError) as e:
            raise checks.with_op_context(self._program, e) from None
        if self._data_dependent:
            checks.check_run_counts(self, self._runtime, self._data_dependent)


def _check_unowned(ir) -> None:
    """A Session owns its Ir (verified here, before anything is built). As in PopXL a second
    Session may be built on the same Ir once the first is detached: it compiles the same
    program and starts from the variables' data in the Ir (each Session keeps its own host
    copies); two Sessions attached at once are refused."""
    if ir._session is not None and ir._session.is_attached:
        raise RuntimeError(
            f"{ir!r} is owned by {ir._session!r}, which is attached; leave its `with` block "
            "(or call detach()) before building a second Session on the Ir."
        )
    for g in ir._graphs.values():
        verify(g)


def _program(ir, runtime: Runtime, options: CompileOptions):
    """The compiled program, or the reference interpreter (``options.interpret``: tests
    compare the compiled passes with it)."""
    if options.interpret and options.inductor:
        raise ValueError(
            "CompileOptions(interpret=True, inductor=True): interpret runs no kernels to compile."
        )
    if options.interpret:
        return ReferenceProgram(ir, runtime, check_specs=options.check_specs)
    return Program(ir, runtime, options)
