"""The store under every `poptorch.Options` group, with PopTorch's rules.

Public names are options: only those given to the constructor (or added with `createOrSet`)
exist, `set` keeps each option's type, and they read back as attributes. Names starting with
``_`` are the object's own state. A frozen store (an executor's or data loader's options)
refuses every change; its deep copy is unfrozen. `__repr__` names every value, so two stores
print alike exactly when they hold the same options (tests compare them by their text).
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["OptionsDict"]


class OptionsDict:
    """Options kept under PopTorch's names, read back as attributes, frozen once used."""

    def __init__(self, **default_values: Any) -> None:
        self._is_frozen = False
        self._values = default_values  # last: from here on public names are options

    def set(self, **kwargs: Any) -> None:
        """Change existing options (an unknown name or another type is an AssertionError)."""
        self.checkIsFrozen()
        for option, value in kwargs.items():
            assert self.exists(option), (
                f"Invalid option {option}, valid options are {self._values.keys()}"
            )
            expected = type(self._values[option])
            assert isinstance(value, expected), (
                f"Unexpected type {type(value)} for option {option}. Expected {expected}"
            )
            self._values[option] = value

    def createOrSet(self, **kwargs: Any) -> None:
        """Set options, adding those that do not exist yet."""
        self.checkIsFrozen()
        for option, value in kwargs.items():
            if option in self._values:
                self.set(**{option: value})
            else:
                self._values[option] = value

    def _set(self, option: str, value: Any):
        """`createOrSet` of one option, returning self (the setters chain)."""
        self.createOrSet(**{option: value})
        return self

    def exists(self, option: str) -> bool:
        return option in self.__dict__.get("_values", {})

    def deleteIfExists(self, option: str) -> None:
        self.checkIsFrozen()
        self._values.pop(option, None)

    # freezing --------------------------------------------------------------------------
    def _changeFreezeState(self, frozen: bool) -> None:
        self.__dict__["_is_frozen"] = frozen
        for value in self.__dict__.values():
            if hasattr(type(value), "_changeFreezeState"):
                value._changeFreezeState(frozen)

    def _freeze(self) -> None:
        self._changeFreezeState(True)

    def _unfreeze(self) -> None:
        self._changeFreezeState(False)

    def checkIsFrozen(self, option: str | None = None) -> None:
        if option != "_is_frozen" and self.__dict__.get("_is_frozen", False):
            raise AttributeError("Can't modify frozen Options")

    def __deepcopy__(self, memo: dict) -> OptionsDict:
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        for key, value in self.__dict__.items():
            twin.__dict__[key] = False if key == "_is_frozen" else copy.deepcopy(value, memo)
        return twin

    # attributes ------------------------------------------------------------------------
    def __setattr__(self, option: str, value: Any) -> None:
        self.checkIsFrozen(option)
        if not option.startswith("_"):
            self.set(**{option: value})
        elif "_values" in self.__dict__ and option not in self.__dict__ and option != "__class__":
            raise AttributeError(
                f"Invalid private attribute {option}. Valid attributes: {list(self.__dict__)}"
            )
        else:
            super().__setattr__(option, value)

    def __getattr__(self, option: str) -> Any:
        values = self.__dict__.get("_values")
        if option.startswith("_") or values is None or option not in values:
            raise AttributeError(f"Invalid attribute {option}.")
        return values[option]

    def __getstate__(self) -> dict:
        return self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __call__(self, option: str) -> Any:
        return getattr(self, option)

    # serialisation ---------------------------------------------------------------------
    def update(self, other: dict) -> dict:
        """``other`` with this store's options added (a name in both is an error)."""
        common = set(self._values).intersection(other)
        assert not common, "Can't merge dictionaries, they have some keys in common"
        other.update(self._values)
        return other

    def toDict(self) -> dict:
        return self.update({})

    def __repr__(self) -> str:
        values = [f"{k}={v!r}" for k, v in self._values.items()]
        state = [f"{k}={v!r}" for k, v in self.__dict__.items() if k != "_values"]
        return f"{type(self).__name__}({', '.join(values + state)})"
