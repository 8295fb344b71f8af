"""Make ``import popxl`` and ``import popxl_addons`` resolve to this project.

`install()` adds an import hook: ``popxl.X.Y`` loads ``popxl_core``'s module for that path
(after the renames in `_RENAMES`) and registers the same module object under both names, so
user code written for PopXL and popxl.addons runs unchanged on the simulator.
``python -m popxl_core.compat SCRIPT [ARGS...]`` runs a script with the hook in place.

>>> install()
>>> import popxl, popxl.ops
>>> popxl.ops.add is popxl_core.ops.add, repr(popxl.float32)
(True, 'popxl.dtypes.float32')
>>> uninstall()
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import runpy
import sys
from typing import Callable, Dict, List, Optional

import popxl_core  # noqa: F401 - the doctest names it

__all__ = ["AliasFinder", "install", "main", "run_script", "uninstall"]

# popxl paths whose module lives elsewhere in this project than the same dotted path says.
_RENAMES: Dict[str, str] = {
    "popxl": "popxl_core",
    "popxl.session": "popxl_core.sim.session",
    "popxl.ops.negative_log_likelihood": "popxl_core.ops.losses",
    "popxl_addons": "addons",
    # popxl.addons module paths whose code lives in a differently named module here
    "popxl_addons.transforms.recomputation": "addons.transforms.recompute",
    "popxl_addons.ops.streams": "addons.ops.host",
    "popxl_addons.seed_variable": "addons.graph_utils",
    "popxl_addons.route_tensor": "addons.graph_utils",
    "popxl_addons.transforms.use_fc_pass": "addons.transforms.fc_pass",
    "popart": "popxl_core.compat_popart",  # a stand-in: see that module
}
_ROOTS = {"popxl": "popxl_core", "popxl_addons": "addons", "popart": "popxl_core.compat_popart"}
_ALIAS_OF = {real: alias for alias, real in _RENAMES.items()}


def _target(fullname: str) -> Optional[str]:
    """The project module behind a popxl / popxl_addons path (None for other paths)."""
    if fullname in _RENAMES:
        return _RENAMES[fullname]
    root, _, rest = fullname.partition(".")
    if root not in _ROOTS:
        return None
    parent, _, leaf = fullname.rpartition(".")
    base = _target(parent) if parent else None
    return f"{base}.{leaf}" if base else f"{_ROOTS[root]}.{rest}"


def _alias(real: str) -> Optional[str]:
    """The popxl path of a project module: the inverse of `_target`."""
    if real in _ALIAS_OF:
        return _ALIAS_OF[real]
    parent, _, leaf = real.rpartition(".")
    base = _alias(parent) if parent else None
    return f"{base}.{leaf}" if base else None


def _register_loaded() -> None:
    """Put every loaded project module into sys.modules under its popxl path too.

    Otherwise importing ``popxl.ops.call`` for the first time would make the import system
    set the attribute ``call`` of ``popxl.ops`` to the module, hiding the op function
    ``popxl.ops.call`` (popxl has both, like here; a registered alias is never re-imported).
    """
    for name, module in list(sys.modules.items()):
        alias = _alias(name) if name.split(".")[0] in _ALIAS_OF else None
        if alias is not None and module is not None:
            sys.modules.setdefault(alias, module)
    # Several paths may rename to one module (popxl_addons.seed_variable and .route_tensor
    # are both addons.graph_utils); `_alias` names one of them, so register each: otherwise
    # importing popxl_addons.seed_variable would set ``addons.seed_variable`` to the module,
    # hiding the function for the rest of the process.
    for alias, real in _RENAMES.items():
        if sys.modules.get(real) is not None and alias.partition(".")[2]:
            sys.modules.setdefault(alias, sys.modules[real])


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str, on_load: Callable[[], None]) -> None:
        self.target = target
        self.on_load = on_load
        self.real_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        self.on_load()
        return module

    def exec_module(self, module) -> None:
        # The module is already executed; the import system has just overwritten its
        # __spec__ with the alias spec, which would confuse relative imports and reloads.
        module.__spec__ = self.real_spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves module paths under another name to this project's modules: ``target(name)``
    is the real module's path (None: not an alias); ``on_load()`` runs after each load."""

    def __init__(
        self, target: Callable[[str], Optional[str]], on_load: Callable[[], None] = lambda: None
    ) -> None:
        self.target = target
        self.on_load = on_load

    def find_spec(self, fullname: str, path=None, target=None):
        real = self.target(fullname)
        try:
            if real is None or importlib.util.find_spec(real) is None:
                return None
        except ModuleNotFoundError:  # e.g. popart._internal: its parent is not a package
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real, self.on_load))


# popxl / popxl_addons paths -> this project's modules
_FINDER = AliasFinder(_target, _register_loaded)


def install() -> None:
    """Install the import hook (idempotent).

    Called at the top level of a ``conftest.py`` (as the conformance runner's conftest does),
    it also gives that conftest the pytest hook that skips the few Graphcore tests listed in
    `popxl_core.compat_skips`, each with its reason.
    """
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _offer_skip_hook(sys._getframe(1).f_globals)


def _offer_skip_hook(caller_globals: dict) -> None:
    """Put the skip hook into the calling module if it is a conftest being imported by pytest
    (pytest collects a conftest's hooks from its attributes right after importing it)."""
    if os.path.basename(caller_globals.get("__file__") or "") != "conftest.py":
        return
    from .compat_skips import pytest_collection_modifyitems

    caller_globals.setdefault("pytest_collection_modifyitems", pytest_collection_modifyitems)


def uninstall() -> None:
    """Remove the hook and every alias it registered."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n.split(".")[0] in _ROOTS]:
        del sys.modules[name]


_USAGE = (
    "usage: python -m popxl_core.compat SCRIPT [ARGS...]\n"
    "Runs SCRIPT (code written for Graphcore's popxl / popxl_addons) with those imports "
    "resolved to this project; ARGS are passed to SCRIPT."
)


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m popxl_core.compat SCRIPT [ARGS...]``: run SCRIPT as ``__main__``."""
    run_script(sys.argv[1:] if argv is None else argv, "popxl_core.compat", _USAGE, install)


def run_script(argv: List[str], prog: str, usage: str, install_hook: Callable[[], None]) -> None:
    """Run ``argv[0]`` as ``__main__`` after ``install_hook()`` (the ``python -m PROG SCRIPT
    [ARGS...]`` entry points of the compatibility hooks).

    ``sys.argv`` becomes ``[SCRIPT, ARGS...]`` and the script's directory goes first on
    ``sys.path``, as when running ``python SCRIPT ARGS...``.
    """
    argv = list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        raise SystemExit(0)
    if not argv:
        raise SystemExit(usage)
    if not os.path.isfile(argv[0]):
        raise SystemExit(f"{prog}: error: no such script {argv[0]!r}\n{usage}")
    install_hook()
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
