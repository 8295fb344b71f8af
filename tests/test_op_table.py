"""The op table drives these tests: every registered op is run from its samples."""

from __future__ import annotations

import pathlib

import pytest

import addons  # noqa: F401 - registers the addons ops (ReplicatedAllReduceTP) in the table
from popxl_core.ops.gather import GatherIndexWarning
from popxl_core.ops.registry import all_opdefs

from .op_harness import run_sample

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _cases():
    for name, opdef in sorted(all_opdefs().items()):
        for i, sample in enumerate(opdef.samples() if opdef.samples else []):
            yield pytest.param(opdef, sample, id=f"{name}-{sample.name or i}")


@pytest.mark.parametrize("opdef,sample", list(_cases()))
def test_op_against_torch(opdef, sample):
    if sample.name != "oor_no_error":
        run_sample(opdef, sample)
        return
    # Gather's out-of-range indices, on purpose: the op warns (test_misuse_gather says what).
    # Caught here, the warning also stays in this process: reported, pytest-xdist's controller
    # would import its category's module, popxl_core and torch with it (2 s, while the
    # worker waits to send its next reports).
    with pytest.warns(GatherIndexWarning, match="outside the valid range"):
        run_sample(opdef, sample)


@pytest.mark.parametrize("name", sorted(all_opdefs()))
def test_every_op_has_samples(name):
    opdef = all_opdefs()[name]
    tested_by = opdef.tested_by
    if tested_by:
        path, func = tested_by.split("::")
        assert f"def {func}(" in (_ROOT / path).read_text(), f"{name}: {tested_by} does not exist"
        return
    assert opdef.samples is not None and opdef.samples(), f"op {name} has no test samples"
