"""`poptorch.Options` from text: a JSON object of setter calls (`from_json`, also read from
``POPTORCH_DEFAULT_OPTIONS``) and a file of setter calls, one a line (`load_from_file`)."""

from __future__ import annotations

import importlib
import json
import os

from . import enums

__all__ = ["ConfigFileError", "from_json", "load_from_file"]


class ConfigFileError(Exception):
    """A line of an options file that is not Python (``poptorch.options.ConfigFileError``)."""


def from_json(options, string: str) -> None:
    """Call ``options``' setters as ``{"Group.setter": value}`` names them; a list is spread
    into the arguments and ``"EnumName.Member"`` strings become PopTorch's enums."""
    for name, value in json.loads(string).items():
        setter = options
        for part in name.split("."):
            setter = getattr(setter, part)
        if isinstance(value, str):
            value = _enum(value)
        if isinstance(value, list):
            setter(*value)
        else:
            setter(value)


def _enum(text: str):
    """``"ConnectionType.OnDemand"`` -> the enum member; any other string stays as it is."""
    kind, dot, member = text.partition(".")
    found = getattr(getattr(enums, kind, None), member, None) if dot else None
    return text if found is None else found


def load_from_file(options, filepath: str) -> None:
    """Run each non-empty, non-comment line of ``filepath`` as ``options.<line>``."""
    with open(filepath) as f:
        lines = [line.strip() for line in f]
    code = "\n".join(f"options.{line}" for line in lines if line and not line.startswith("#"))
    poptorch = importlib.import_module(__package__)  # what the file's lines call poptorch

    try:
        exec(code, {}, {"poptorch": poptorch, "options": options})
    except SyntaxError as err:
        name = os.path.basename(filepath)
        raise ConfigFileError(
            f"{type(err).__name__} at line {err.lineno} of {name}: {err.args[0]}\n> {err.text}"
        ) from None
