"""One answer to "is this the same program?": `same_key`.

A built program is picked by its key: what the input signature holds (shapes and dtypes,
every module's mode, the keyword binding) and the model's and optimizer's `Structure`. Three
places ask whether a key (or a part of one) is the one of a program they hold:

- `pipeline.Programs.get`, the program cache of every entry point: is the active program
  the one for this signature?
- `step_repeat.RepeatStep.holds`, the trainer's repeat path: is this step's key (its inputs'
  torch shapes and dtypes and the modes) the last full-path step's? (It also asks for the
  very `Structure` object: an equal one is the same program, but storage may have moved.)
- `structure_watch.StructureWatch`, before each step: are the tensors' fields and the
  optimizer groups' options (parts of the `Structure`) those of the last walk?

Both compare with `same_key`: the very object first, then by value (tuples part by part, each
part again the very object first: CPython's tuple comparison). The `Structure` part is cheap
because `structure_watch.StructureWatch` returns the very object while nothing it covers
changed.
"""

from __future__ import annotations

__all__ = ["same_key"]


def same_key(a: object, b: object) -> bool:
    """``a`` and ``b`` are keys of the same program: the same object, or equal values."""
    return a is b or bool(a == b)
