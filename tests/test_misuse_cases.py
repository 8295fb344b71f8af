"""Misuse of popxl_core and addons, as a user would err: every case raises, where it happens.

Each case is a function that does the correct set-up, then returns ``(misuse, exc, patterns)``:
``misuse()`` is the one user statement that is wrong. The test runs the set-up (which must not
raise), then the statement, and checks the error type and that the message names the user's
tensor / stream / graph / Session and the offending shape, dtype or value. The stage a case
belongs to (op creation, factory, Session build, run) is in its name; the set-up of a
"run" case has already built the Session, so the error cannot come from building it.
"""

from __future__ import annotations

import re

import pytest

from . import misuse_cases_build, misuse_cases_run, misuse_cases_streams  # noqa: F401
from .misuse_cases_common import CASES


# the driver -------------------------------------------------------------------------------------
def test_at_least_sixty_cases():
    assert len(CASES) >= 60, len(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_misuse_raises_where_it_happens(name):
    misuse, exc, patterns = CASES[name]()  # the correct set-up must not raise
    with pytest.raises(exc) as info:
        misuse()
    message = str(info.value)
    missing = [p for p in patterns if not re.search(p, message)]
    assert not missing, f"{name}: {missing} not in the message: {message}"
