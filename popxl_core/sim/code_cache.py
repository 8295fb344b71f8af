"""Code objects of the generated Python the simulator runs, kept by source text.

Compiling the generated source is a large part of building a Session of a small program, and
programs are often built again unchanged (the same model trained twice, a reference and its
variant that share graphs, a test's many builds). A code object is immutable and runs in
whatever namespace `exec` is given, so one compiled source serves every build of it.
"""

from __future__ import annotations

import functools
from types import CodeType

__all__ = ["compiled"]


@functools.lru_cache(maxsize=2048)
def compiled(source: str, filename: str) -> CodeType:
    """``compile(source, filename, "exec")``, once per (source, filename)."""
    return compile(source, filename, "exec")
