"""Once-only notes for PopTorch settings that have no meaning on the simulator.

A script written for PopTorch sets many options that tune Poplar, PopART or the IPU link; here
they are accepted (PopTorch accepts them) and each says once, as a warning, that it changes
nothing, so nobody believes it did.
"""

from __future__ import annotations

import warnings

__all__ = ["PopTorchCompatWarning", "note", "reset"]

_SAID: set[str] = set()


class PopTorchCompatWarning(UserWarning):
    """A PopTorch setting accepted by popxl_fx's PopTorch layer that changes nothing here."""


def note(
    setting: str, why: str = "it tunes Poplar/PopART, which the simulator does not run"
) -> None:
    """Warn once per process that ``setting`` is accepted and has no effect, and why."""
    if setting in _SAID:
        return
    _SAID.add(setting)
    warnings.warn(
        f"poptorch on popxl_fx: {setting} is accepted and has no effect here: {why}.",
        PopTorchCompatWarning,
        stacklevel=3,
    )


def reset() -> None:
    """Forget which notes were given (tests)."""
    _SAID.clear()
