"""tools/poptorch_suite.py's lists of what is left out of PopTorch's tests, each with a reason."""

import importlib.util
from pathlib import Path

import pytest

_TOOL = Path(__file__).resolve().parents[1] / "tools" / "poptorch_suite.py"


def _tool():
    spec = importlib.util.spec_from_file_location("poptorch_suite", _TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_lists_give_every_entry_a_reason():
    entries = _tool().left_out()
    assert "custom_ops_test.py" in entries
    assert all(reason for reason in entries.values())


def test_a_list_names_files_and_tests(tmp_path):
    (tmp_path / "a.txt").write_text("# comment\n\nx_test.py | why\nx_test.py::t[1] | other\n")
    assert _tool().left_out(tmp_path) == {"x_test.py": "why", "x_test.py::t[1]": "other"}


def test_a_line_without_a_reason_is_refused_naming_it(tmp_path):
    (tmp_path / "b.txt").write_text("y_test.py::t\n")
    with pytest.raises(ValueError, match=r"b.txt:1: expected 'NODEID \| WHY'"):
        _tool().left_out(tmp_path)


def test_the_tests_subprocesses_get_the_hook_and_this_python(monkeypatch):
    import os
    import sys

    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    saved = _tool()._children_get_the_hook()
    assert saved["PATH"] == "/usr/bin"
    assert os.environ["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    paths = os.environ["PYTHONPATH"].split(os.pathsep)
    assert paths[0].endswith("_child_path") and paths[-1] == "/somewhere"


def test_an_overlay_pytest_leads_here_and_in_the_tests_subprocesses(tmp_path):
    """``--overlay DIR``: PopTorch's pinned pytest in DIR is the one imported, and the one its
    tests' own ``python -m pytest`` children import, with no autoloaded plugins of this env."""
    import os
    import subprocess
    import sys

    (tmp_path / "pytest").mkdir()
    (tmp_path / "pytest" / "__init__.py").write_text("__version__ = 'pinned'\n")
    script = (
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('suite', {str(_TOOL)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"print(m.pytest_from({str(tmp_path)!r}).__version__)\n"
        "print(os.environ['PYTHONPATH'].split(os.pathsep)[0])\n"
        "print(sorted(m.pytest_plugins_loadable()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:3] == ["pinned", str(tmp_path), "[]"]


def test_an_overlay_after_pytest_was_imported_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="imported before the overlay"):
        _tool().pytest_from(str(tmp_path))


@pytest.mark.parametrize("legacy", [False, True])
def test_legacy_torch_load_lets_a_whole_module_load_as_under_poptorchs_torch(legacy, monkeypatch):
    """The installed torch refuses ``torch.load`` of a whole module (eager, no hook), as
    PopTorch's pinned torch 2.0.1 did not; ``--legacy-torch-load`` gives its default back.
    In this process: the hook only sets an environment variable, which ``torch.load`` reads
    at each call, and monkeypatch puts it back after (a fresh interpreter per case cost
    ~2 s of CPU each, for torch's import)."""
    import io
    import pickle

    import torch

    for name in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        monkeypatch.delenv(name, raising=False)
    if legacy:
        _tool().legacy_torch_load()
    saved = io.BytesIO()
    torch.save(torch.nn.Sequential(torch.nn.ReLU()), saved)
    saved.seek(0)
    if legacy:
        with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected"):
            assert type(torch.load(saved)).__name__ == "Sequential"
    else:
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            torch.load(saved)
