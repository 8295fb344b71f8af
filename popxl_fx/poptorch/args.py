"""Custom argument types: ``poptorch.ICustomArgParser`` and ``registerCustomArgParser``.

A parser says which tensors an object of its type holds (``yieldTensors``) and how to build
the object again around other tensors (``reconstruct``); the executor passes those tensors to
the program and rebuilds the object inside the traced forward.
"""

from __future__ import annotations

import abc
from typing import Any

from .errors import Error

__all__ = ["ICustomArgParser", "parser_for", "registerCustomArgParser"]

_PARSERS: dict[type, ICustomArgParser] = {}


class ICustomArgParser(abc.ABC):
    """The tensors of a custom argument type, and how to rebuild it."""

    @abc.abstractmethod
    def yieldTensors(self, struct) -> Any:
        """Yield every tensor of ``struct``, in a fixed order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure, tensor_iterator) -> Any:
        """``original_structure`` rebuilt with tensors taken from ``tensor_iterator``."""


def registerCustomArgParser(arg_data_type: type, arg_parser: ICustomArgParser | None) -> None:
    """Use ``arg_parser`` for arguments of ``arg_data_type`` (None removes it)."""
    if arg_parser is None:
        _PARSERS.pop(arg_data_type, None)
        return
    if not isinstance(arg_parser, ICustomArgParser):
        raise Error("arg_parser must inherit from ICustomArgParser")
    _PARSERS[arg_data_type] = arg_parser


def parser_for(value: object) -> ICustomArgParser | None:
    return _PARSERS.get(type(value))
