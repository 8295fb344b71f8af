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

import os
import sys

import popxl_core.compat as core_compat
import popxl_fx  # noqa: F401 - the doctest names it

__all__ = ["child_env", "install", "main", "uninstall"]

_ALIAS, _REAL = "poptorch", "popxl_fx.poptorch"


def _target(fullname: str) -> str | None:
    if fullname == _ALIAS or fullname.startswith(_ALIAS + "."):
        return _REAL + fullname[len(_ALIAS) :]
    return None


# ``poptorch.X`` -> ``popxl_fx.poptorch.X`` (when that module exists)
_FINDER = core_compat.AliasFinder(_target)


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


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ``os.environ``) for the Python processes a PopTorch program starts:
    PYTHONPATH leads with a folder whose ``poptorch`` module installs this hook there too, and
    with this project's folder."""
    env = dict(os.environ if env is None else env)
    package = os.path.dirname(os.path.abspath(__file__))
    first = [os.path.join(package, "_child_path"), os.path.dirname(package)]  # + this popxl_fx
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in first]
    env["PYTHONPATH"] = os.pathsep.join([*first, *paths])
    return env


def _install_here_and_in_children() -> None:
    install()
    os.environ.update(child_env())
    # multiprocessing's spawn and forkserver children take this process's sys.path (not
    # PYTHONPATH) and re-run the script, whose ``import poptorch`` must find the hook there;
    # here the hook's finder comes first, so the folder changes nothing
    child_path = child_env({})["PYTHONPATH"].split(os.pathsep)[0]
    if child_path not in sys.path:
        sys.path.append(child_path)


_USAGE = (
    "usage: python -m popxl_fx.compat SCRIPT [ARGS...]\n"
    "Runs SCRIPT (code written for PopTorch, PopXL or popxl.addons) with `import poptorch`, "
    "`popxl` and `popxl_addons` resolved to this project; ARGS are passed to SCRIPT."
)


def main(argv: list[str] | None = None) -> None:
    """``python -m popxl_fx.compat SCRIPT [ARGS...]``: run SCRIPT as ``__main__``."""
    core_compat.run_script(
        sys.argv[1:] if argv is None else argv,
        "popxl_fx.compat",
        _USAGE,
        _install_here_and_in_children,
    )


if __name__ == "__main__":
    main()
