"""Every command line refuses a bad argument with argparse's one-line error, not a traceback.

The scripts run in this process (`runpy`, as ``python SCRIPT ARGS``: ``__main__``, their argv,
their folder first on sys.path): argparse stops them before any work, so a separate Python per
script would only add its start-up time. An exception other than argparse's ``SystemExit``
fails the test, as a traceback would.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import pytest

from popxl_fx import cli

ROOT = Path(__file__).resolve().parents[1]

# (script and arguments, the option named in the error, the offending value in the error)
BAD = {
    "mnist_popxl": (["examples/mnist_popxl.py", "--batch-size", "0"], "--batch-size", "got 0"),
    "addons_basics": (
        ["examples/addons_basics.py", "--max-batches", "-1"],
        "--max-batches",
        "got -1",
    ),
    "addons_custom_optimizer": (
        ["examples/addons_custom_optimizer.py", "--epochs", "0"],
        "--epochs",
        "got 0",
    ),
    "fx_transforms": (
        ["examples/fx_transforms.py", "--batch-size", "30"],
        "--batch-size",
        "got 30",
    ),
    "bench_mnist_step": (["benchmarks/bench_mnist_step.py", "--rounds", "0"], "--rounds", "got 0"),
    "seed_accuracy": (["benchmarks/seed_accuracy.py", "--repeats", "-5"], "--repeats", "got -5"),
    "seed_runner": (
        ["tools/seed_runner.py", "001", "--seeds-dir", "/nonexistent/seeds"],
        "seed '001'",
        "/nonexistent/seeds",
    ),
}


def _run(args: list[str], monkeypatch, capsys, module: bool = False) -> tuple[int, str, str]:
    """``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) in this process: its exit code,
    stdout and stderr."""
    target = args[0] if module else str(ROOT / args[0])
    monkeypatch.setattr(sys, "argv", [target, *args[1:]])
    monkeypatch.chdir(ROOT)
    if not module:
        monkeypatch.syspath_prepend(str(Path(target).parent))
    with pytest.raises(SystemExit) as stop:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    out, err = capsys.readouterr()
    code = stop.value.code
    if isinstance(code, str):  # SystemExit("message"): Python prints it and exits with 1
        code, err = 1, err + code + "\n"
    return 0 if code is None else code, out, err


@pytest.mark.parametrize("tool", sorted(BAD))
def test_bad_argument_is_a_one_line_error(tool, monkeypatch, capsys):
    args, option, value = BAD[tool]
    code, _, err = _run(args, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert "error:" in last and option in last and value in last, last


def test_missing_data_dir_is_refused_and_not_created(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nonexistent"
    code, _, err = _run(
        ["examples/mnist_popxl.py", "--data-dir", str(missing)], monkeypatch, capsys
    )
    assert code == 2 and "is not an existing folder" in err
    assert not missing.exists()


def test_compat_help_is_usage_not_a_script(monkeypatch, capsys):
    code, out, _ = _run(["popxl_core.compat", "--help"], monkeypatch, capsys, module=True)
    assert code == 0 and out.startswith("usage: python -m popxl_core.compat")
    code, _, err = _run(["popxl_core.compat", "no_such_script.py"], monkeypatch, capsys, True)
    assert code == 1 and "no such script 'no_such_script.py'" in err


# the argparse types, in process --------------------------------------------------------------
@pytest.mark.parametrize("text", ["0", "-5", "x"])
def test_positive_int_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text) if text == "x" else text):
        cli.positive_int(text)


def test_non_negative_int():
    assert cli.non_negative_int("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="got -1"):
        cli.non_negative_int("-1")


def test_data_dir_without_idx_files_says_what_it_looked_for(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match=r"holds no IDX files.*train-images"):
        cli.existing_data_dir(str(tmp_path))
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte.gz",
    ):
        (raw / name).write_bytes(b"")
    assert cli.existing_data_dir(str(tmp_path)) == tmp_path


def test_help_shows_defaults():
    parser = cli.make_parser("x")
    parser.add_argument("--batch-size", type=cli.positive_int, default=80)
    assert "(default: 80)" in parser.format_help()


def test_seeds_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cli.SEEDS_ENV, str(tmp_path))
    assert cli.default_seeds_dir() == tmp_path
    monkeypatch.delenv(cli.SEEDS_ENV)
    beside = ROOT.parent / "shared" / "seeds"
    main = cli._main_checkout(ROOT)  # a git worktree: also beside its main checkout
    found = [p for p in (beside, main and main.parent / "shared" / "seeds") if p and p.is_dir()]
    assert cli.default_seeds_dir() == (found[0] if found else beside)


def test_seeds_dir_beside_a_worktrees_main_checkout(tmp_path):
    main, tree = tmp_path / "repos" / "main", tmp_path / "trees" / "wt"
    (main / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (main / ".git" / "worktrees" / "wt" / "commondir").write_text("../..\n")
    tree.mkdir(parents=True)
    (tree / ".git").write_text(f"gitdir: {main / '.git' / 'worktrees' / 'wt'}\n")
    assert cli._main_checkout(tree) == main
    assert cli._main_checkout(main) is None  # a plain checkout (its .git is a folder)
