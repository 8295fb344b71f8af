"""The IPU simulator under `popxl_core.Session`: targets, plan (memory, cycles), compiler, runtime
and report. A package of its own so that a non-editable install ships it too."""

from .options import CompileOptions

__all__ = ["CompileOptions"]
