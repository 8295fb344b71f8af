"""The PopART IR handle (``ir._pb_ir``) and its session options, as far as PopXL code uses them.

PopXL scripts and popxl.addons reach PopART's C++ IR for a handful of calls (session options,
remote buffer records, the graphs); this project has no PopART, so these stand in for them.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Set

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir

__all__ = ["SessionOptions"]


class SessionOptions:
    """The session options user code sets through ``ir._pb_ir.getSessionOptions()``."""

    def __init__(self) -> None:
        self.numIOTiles = 0
        self.engineOptions: Dict[str, str] = {}
        self.partialsTypeMatMuls = ""
        # {"partialsType": "float" | "half"}: what convs without their own type accumulate in
        # (popxl_core.ops._conv_partials); other poplin options are recorded
        self.convolutionOptions: Dict[str, str] = {}
        self.enableStochasticRounding = False
        self.aliasZeroCopy = True
        self.cachePath = os.environ.get("POPXL_CACHE_DIR", "")
        # PopXL turns engine caching on for every new Ir when POPXL_CACHE_DIR is set (the
        # simulator compiles in process: the options are recorded, no engine is cached)
        self.enableEngineCaching = bool(os.environ.get("POPXL_CACHE_DIR"))
        self.availableMemoryProportions: Dict[str, float] = {}
        self.constantWeights = True
        self.dotChecks: Set[str] = set()
        self.logDir = ""
        self.globalReplicaOffset = 0
        self.virtualGraphMode = "Manual"
        self.useHostCopyOps = True
        self.enableExplicitMainLoops = True
        self.explicitRecomputation = True
        # PopXL turns PopART's inplacing ambiguity check on for every Ir, and so does this
        # project (sim/ambiguity.py): a program whose answer depends on the schedule is refused.
        # addons' pipelining orders the copies it makes (popxl_core/block_order.py).
        self.enableInplaceAmbiguityChecking = True
        self.decomposeGradSum = True
        # False: a float8 op's log2 scale outside [-32, 32) does not raise (popxl_core.ops.fp8)
        self.throwIfLog2ScaleTensorNotInRange = True
        self.enableReplicatedGraphs = False
        self.replicatedGraphCount = 1
        self._global = [False, 1]  # enableDistributedReplicatedGraphs, globalReplicationFactor
        self._ir = None  # set by _PbIr: the global options change the Ir's replication

    # PopDist sets these for a multi-instance program: the Ir's replication_factor is then
    # the global one (PopXL's getGlobalReplicationFactor). The simulator runs every replica,
    # in this process or split over a torch.distributed job (popxl_core.distributed).
    @property
    def enableDistributedReplicatedGraphs(self) -> bool:  # PopART's name
        return bool(self._global[0])  # always a bool (the setter's); the list also holds ints

    @enableDistributedReplicatedGraphs.setter
    def enableDistributedReplicatedGraphs(self, value: bool) -> None:
        self._global[0] = bool(value)
        self._apply_global()

    @property
    def globalReplicationFactor(self) -> int:
        return self._global[1]

    @globalReplicationFactor.setter
    def globalReplicationFactor(self, value: int) -> None:
        self._global[1] = int(value)
        self._apply_global()

    @property
    def conv_partials_type(self) -> str:
        """``convolutionOptions["partialsType"]`` ("" if unset): the value a Session's convs
        take when it compiles (`OpDef.session_options`; popxl_core.ops._conv_partials)."""
        return str(self.convolutionOptions.get("partialsType", ""))

    def getGlobalReplicationFactor(self) -> int:
        return self._global[1] if self._global[0] else self.replicatedGraphCount

    def _apply_global(self) -> None:
        if self._ir is not None and self._global[0] and self._global[1] > 1:
            self._ir.replication_factor = self._global[1]


class _PbIr:
    """The handful of PopART `_pb_ir` calls that tutorials and tests make."""

    def __init__(self, ir: "Ir") -> None:
        self._ir = weakref.proxy(ir)
        self._options = SessionOptions()
        self._options._ir = self._ir

    def getSessionOptions(self) -> SessionOptions:  # popart spelling
        return self._options

    def getAllGraphs(self) -> List[Graph]:
        return list(self._ir._graphs.values())

    def getMainGraph(self) -> Graph:
        return self._ir.main_graph

    def getRemoteBufferInfo(self, buffer_id: int):
        """The `remote_buffer.RemoteBufferInfo` of remote buffer ``buffer_id``."""
        buffers = self._ir._remote_buffers
        if buffer_id not in buffers:
            raise KeyError(
                f"No remote buffer with id {buffer_id} in this Ir (ids: {sorted(buffers)})."
            )
        return buffers[buffer_id].remote_buffer_info

    def hasRemoteBufferInfo(self, buffer_id: int) -> bool:
        return buffer_id in self._ir._remote_buffers

    def getAllRemoteBufferInfos(self) -> Dict[int, Any]:
        """Remote buffer id -> its `remote_buffer.RemoteBufferInfo`, for every buffer."""
        return {i: b.remote_buffer_info for i, b in self._ir._remote_buffers.items()}

    def logIr(self) -> None:
        from .printing import format_graph

        for g in self._ir._graphs.values():
            print(format_graph(g))
