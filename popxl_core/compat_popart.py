"""``import popart`` under `popxl_core.compat`: a stand-in, not PopART.

PopXL user code imports ``popart`` mostly out of habit or for PopART's C++ bindings, which
this simulator does not have. Provided: `PatternsLevel` (the names of PopART's pattern
levels, which ``popxl_addons.patterns.apply_pre_alias_patterns`` takes as strings),
`DataType` (the names of PopART's data types, as tests parametrize over them), the device
enums `SyncPattern`, `DeviceConnectionType`, `DeviceSelectionCriterion` and `CommGroupType`
(names only: Graphcore's test helpers take them as default arguments, and configurations
list them), `DeviceManager` (CPU and IPU Model devices of the simulator,
`popxl_core.device`; no IPU hardware is enumerated), `VirtualGraphMode` (a session option
scripts set; the simulator places ops by their ``ipu`` context whatever its value),
`popart_exception` (what PopART's C++ raised; see its comment),
`initializePoplarDebugInfo` / `closePoplarDebugInfo` (the debug-info file, written from the IR:
`popxl_core.debug_info`), `poplar_application_runtime_error`
(a device program failing at run time) and `getLogger` (PopART's logger, a standard
`logging.Logger` here). Any other name raises an AttributeError that says
so, at the line that uses it.
"""

from __future__ import annotations

import enum
import logging

from . import debug_info
from .device import DeviceManager
from .errors import OpDataError

__all__ = [
    "CommGroupType",
    "DataType",
    "DeviceConnectionType",
    "DeviceManager",
    "DeviceSelectionCriterion",
    "PatternsLevel",
    "SyncPattern",
    "popart_exception",
    "poplar_application_runtime_error",
    "getLogger",
    "initializePoplarDebugInfo",
    "closePoplarDebugInfo",
]

# PopART's C++ errors reach Python as ``popart_exception``. The checks PopART made in C++ are
# made in Python here and raise the built-in type that names the mistake, so the stand-in is
# the tuple of those types: ``except popart.popart_exception`` and
# ``pytest.raises(popart.popart_exception)`` catch the same mistakes as with PopART.
popart_exception = (RuntimeError, ValueError, TypeError, IndexError, KeyError)

# On the IPU a value a device program cannot take (a float8 log2 scale out of range, an index
# out of bounds) stops the program: Poplar's application runtime error. Here the kernel raises
# OpDataError, which Session.run names with the op and its inputs.
poplar_application_runtime_error = OpDataError


def getLogger(name: str = "all") -> logging.Logger:  # PopART's spelling
    """PopART's logger for ``name`` (a `logging.Logger` named ``popart.<name>``); user code
    calls ``popart.getLogger().setLevel("DEBUG")`` and the like."""
    return logging.getLogger(f"popart.{name}")


def initializePoplarDebugInfo(filename: str, format: str = "json") -> None:
    """Record the debug contexts of ops and tensors made from now on (PopART's name)."""
    debug_info.initialize(filename, format)


def closePoplarDebugInfo() -> None:
    """Write the recorded debug contexts to the file and stop recording."""
    debug_info.close()


class PatternsLevel(enum.Enum):
    """PopART's pattern levels; ``value`` is the string popxl.addons passes for each."""

    NoPatterns = "no"
    Minimal = "minimal"
    Default = "default"
    All = "all"


# PopART's `popart::DataType`, its enumerators in its order (values as in C++)
DataType = enum.IntEnum(
    "DataType",
    "UINT8 INT8 FLOAT8_143 FLOAT8_152 UINT16 INT16 INT32 INT64 UINT32 UINT64 BOOL FLOAT "
    "FLOAT16 BFLOAT16 DOUBLE COMPLEX64 COMPLEX128 STRING UNDEFINED",
    start=0,
)

# PopART's device enums (popart/devicemanager.hpp, commgroup.hpp), enumerators in their order.
# Nothing here reads them: the simulator has no device to attach or sync, and replica groups
# are `popxl.ReplicaGrouping`s; user code names them in signatures and configurations.
SyncPattern = enum.IntEnum("SyncPattern", "Full SinglePipeline ReplicaAndLadder", start=0)
DeviceConnectionType = enum.IntEnum("DeviceConnectionType", "Always OnDemand Never", start=0)
DeviceSelectionCriterion = enum.IntEnum("DeviceSelectionCriterion", "First Random", start=0)
# popart::VirtualGraphMode; PopXL sets Manual itself (ops go to the IPU of their `popxl.ipu`)
VirtualGraphMode = enum.IntEnum("VirtualGraphMode", "Off Manual Auto ExecutionPhases N", start=0)
CommGroupType = enum.IntEnum("CommGroupType", "All Consecutive Orthogonal Ungrouped N", start=0)


def __getattr__(name: str):
    if name.startswith("__"):  # import machinery probes (__path__, __file__, ...)
        raise AttributeError(name)
    raise AttributeError(
        f"popart.{name} is not available: `popart` here is popxl-fx's stand-in "
        f"(popxl_core.compat_popart), which provides only {', '.join(__all__)}; PopART's C++ "
        "API does not exist on the simulator."
    )
