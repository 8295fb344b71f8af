"""conftest.py: the xdist controller rebuilds the warnings its workers report without importing
the modules that define their classes (no torch import in a process that runs no test, and no
two reader threads importing one package at once)."""

from __future__ import annotations

import sys
import warnings

import pytest
from _pytest.warnings import warning_record_to_str
from xdist import workermanage
from xdist.remote import serialize_warning_message

import conftest

_MODULE = "conftest_fake_product_warnings"
_SOURCE = '''
class OddWarning(UserWarning):
    """A message class whose text is not its arguments (rebuilt from them, it would differ)."""

    def __init__(self, n):
        super().__init__(f"{n} things")

    def __str__(self):
        return "odd: " + self.args[0]
'''


@pytest.fixture
def reported(tmp_path, monkeypatch):
    """What a worker sends for an OddWarning (serialized), the text it prints, and its module
    made unloaded again (as in the controller, which never imported it)."""
    (tmp_path / f"{_MODULE}.py").write_text(_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(_MODULE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn(module.OddWarning(3), stacklevel=1)
    monkeypatch.delitem(sys.modules, _MODULE)
    return serialize_warning_message(caught[0]), warning_record_to_str(caught[0])


def test_xdists_own_rebuild_imports_the_module(reported):
    """The premise: xdist's rebuild imports the warning's module."""
    data, _ = reported
    workermanage.unserialize_warning_message(data)
    assert _MODULE in sys.modules


def test_a_warning_of_an_unloaded_module_prints_as_in_the_worker(reported):
    data, text = reported
    rebuilt = conftest.unserialize_warning(data, workermanage.unserialize_warning_message)
    assert _MODULE not in sys.modules  # nothing imported
    assert warning_record_to_str(rebuilt) == text
    assert "OddWarning: odd: 3 things" in text
    assert rebuilt.category.__module__ == _MODULE and issubclass(rebuilt.category, UserWarning)


def test_a_loaded_class_is_the_class_itself():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("plain", DeprecationWarning, stacklevel=1)
    data = serialize_warning_message(caught[0])
    rebuilt = conftest.unserialize_warning(data, workermanage.unserialize_warning_message)
    assert rebuilt.category is DeprecationWarning and rebuilt.message.args == ("plain",)
    assert warning_record_to_str(rebuilt) == warning_record_to_str(caught[0])


def test_the_controller_rebuilds_through_it(reported, monkeypatch):
    monkeypatch.setattr(workermanage, "unserialize_warning_message", lambda data: data)
    conftest._rebuild_warnings_without_imports()  # pytest_configure's, in the controller
    passed_on = workermanage.unserialize_warning_message(reported[0])
    assert passed_on["category_module"] == conftest._STAND_INS.__name__
