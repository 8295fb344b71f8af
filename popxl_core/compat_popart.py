"""``import popart`` under `popxl_core.compat`: a stand-in, not PopART.

PopXL user code imports ``popart`` mostly out of habit or for PopART's C++ bindings, which
this simulator does not have. Only `PatternsLevel` (the names of PopART's pattern levels,
which ``popxl_addons.patterns.apply_pre_alias_patterns`` takes as strings) is provided;
any other name raises an AttributeError that says so, at the line that uses it.
"""

from __future__ import annotations

import enum

__all__ = ["PatternsLevel"]


class PatternsLevel(enum.Enum):
    """PopART's pattern levels; ``value`` is the string popxl.addons passes for each."""

    NoPatterns = "no"
    Minimal = "minimal"
    Default = "default"
    All = "all"


def __getattr__(name: str):
    if name.startswith("__"):  # import machinery probes (__path__, __file__, ...)
        raise AttributeError(name)
    raise AttributeError(
        f"popart.{name} is not available: `popart` here is popxl-fx's stand-in "
        f"(popxl_core.compat_popart), which provides only {', '.join(__all__)}; PopART's C++ "
        "API does not exist on the simulator."
    )
