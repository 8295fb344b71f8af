"""Make ``import popxl`` and ``import popxl_addons`` resolve to this project.

`install()` adds an import hook: ``popxl.X.Y`` loads ``popxl_core``'s module for that path
(after the renames in `_RENAMES`) and registers it under both names, so user code written for
PopXL and popxl.addons runs unchanged on the simulator. ``python -m popxl_core.compat SCRIPT
[ARGS...]`` runs a script with the hook in place.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import runpy
import sys
from typing import Dict, List, Optional

__all__ = ["install", "uninstall", "main"]

# Paths whose module lives elsewhere in this project than the same dotted path would say.
_RENAMES: Dict[str, str] = {
    "popxl": "popxl_core",
    "popxl.session": "popxl_core.sim.session",
    "popxl.ops.negative_log_likelihood": "popxl_core.ops.losses",
    "popxl.ops.conv": "popxl_core.ops.nn",
    "popxl.ops.utils": "popxl_core.ops.registry",
    "popxl_addons": "addons",
}
_ROOTS = {"popxl": "popxl_core", "popxl_addons": "addons"}


def _target(fullname: str) -> Optional[str]:
    if fullname in _RENAMES:
        return _RENAMES[fullname]
    root, _, rest = fullname.partition(".")
    if root not in _ROOTS:
        return None
    parent, _, leaf = fullname.rpartition(".")
    base = _target(parent) if parent else None
    return f"{base}.{leaf}" if base else f"{_ROOTS[root]}.{rest}"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:
        pass  # the target module is already executed


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves popxl / popxl_addons module paths to this project's modules."""

    def find_spec(self, fullname: str, path=None, target=None):
        real = _target(fullname)
        if real is None or importlib.util.find_spec(real) is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, _AliasLoader(real))
        return spec


_FINDER = _AliasFinder()


def install() -> None:
    """Install the import hook (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Remove the hook and every alias it registered."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n.split(".")[0] in _ROOTS]:
        del sys.modules[name]


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m popxl_core.compat SCRIPT [ARGS...]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise SystemExit("usage: python -m popxl_core.compat SCRIPT [ARGS...]")
    install()
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
