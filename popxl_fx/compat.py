"""Make ``import poptorch`` (and ``popxl`` / ``popxl_addons``) resolve to this project.

`install()` adds an import hook: ``poptorch`` and ``poptorch.X`` load ``popxl_fx.poptorch``
and its modules (the same module objects under both names), and `popxl_core.compat` is
installed beside it, so scripts written for PopTorch (or PopXL) run unchanged on the
simulator. ``python -m popxl_fx.compat SCRIPT [ARGS...]`` runs a script with the hook.

>>> install()
>>> import poptorch
>>> poptorch.trainingModel is popxl_fx.poptorch.trainingModel
True
>>> uninstall()
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

import popxl_core.compat as core_compat
import popxl_fx  # noqa: F401 - the doctest names it

__all__ = ["install", "main", "uninstall"]

_ALIAS, _REAL = "poptorch", "popxl_fx.poptorch"


def _target(fullname: str) -> str | None:
    if fullname == _ALIAS or fullname.startswith(_ALIAS + "."):
        return _REAL + fullname[len(_ALIAS) :]
    return None


class _Loader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target
        self.real_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.real_spec  # the import system set the alias's spec


class _Finder(importlib.abc.MetaPathFinder):
    """``poptorch.X`` -> ``popxl_fx.poptorch.X`` (when that module exists)."""

    def find_spec(self, fullname: str, path=None, target=None):
        real = _target(fullname)
        try:
            if real is None or importlib.util.find_spec(real) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.util.spec_from_loader(fullname, _Loader(real))


_FINDER = _Finder()


def install() -> None:
    """Install the ``poptorch`` hook and popxl_core's ``popxl`` hook (idempotent)."""
    core_compat.install()
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Remove the ``poptorch`` hook and its aliases (popxl_core's hook too)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == _ALIAS or n.startswith(_ALIAS + ".")]:
        del sys.modules[name]
    core_compat.uninstall()


_USAGE = (
    "usage: python -m popxl_fx.compat SCRIPT [ARGS...]\n"
    "Runs SCRIPT (code written for PopTorch, PopXL or popxl.addons) with `import poptorch`, "
    "`popxl` and `popxl_addons` resolved to this project; ARGS are passed to SCRIPT."
)


def main(argv: list[str] | None = None) -> None:
    """``python -m popxl_fx.compat SCRIPT [ARGS...]``: run SCRIPT as ``__main__``."""
    core_compat.run_script(
        sys.argv[1:] if argv is None else argv, "popxl_fx.compat", _USAGE, install
    )


if __name__ == "__main__":
    main()
