"""conftest.py: the xdist controller rebuilds the warnings its workers report without importing
the modules that define their classes (no torch import in a process that runs no test, and no
two reader threads importing one package at once); the test modules that import a large optional
package run in one worker (`SHARED_IMPORTS`)."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

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


def _importers(package: str) -> set[str]:
    """The test modules whose text imports ``package`` (or a module of it)."""
    imports = re.compile(rf"^\s*(import|from) {package}\b|importorskip\(\"{package}\b", re.M)
    tests = Path(__file__).parent.glob("test_*.py")
    return {p.name for p in tests if imports.search(p.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("package", ["transformers", "matplotlib"])
def test_every_module_importing_a_shared_package_is_in_its_group(package):
    """Else both workers may import it (transformers: ~1 s of CPU each)."""
    grouped = {name for name, group in conftest.SHARED_IMPORTS.items() if group == package}
    assert _importers(package) <= grouped, _importers(package) - grouped
    assert len(_importers(package)) >= 2  # the pattern finds them


def test_the_modules_sharing_the_unfolded_runs_are_one_unit():
    # one line, or a parenthesised list up to its closing line
    imports = re.compile(r"^from tests\.test_replica_folding import (\(.*?^\)|.*?$)", re.M | re.S)
    tests = {p.name: p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_*.py")}
    names = {name: " ".join(imports.findall(text)) for name, text in tests.items()}
    sharing = {name for name, imported in names.items() if re.search(r"\b_off\b", imported)}
    grouped = {n for n, g in conftest.SHARED_IMPORTS.items() if g.endswith("folding._off")}
    assert len(sharing) >= 2 and sharing | {"test_replica_folding.py"} == grouped, sharing
