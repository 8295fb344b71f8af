"""Command-line helpers shared by the examples, benchmarks and tools.

Bad values fail in argparse with a one-line error (``error: argument --batch-size: ...``)
instead of a traceback from torch, and `--help` shows every default.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .data import DATASETS, IDX_FILES, raw_dir

__all__ = [
    "SEEDS_ENV",
    "add_data_args",
    "data_kwargs",
    "default_seeds_dir",
    "existing_data_dir",
    "make_parser",
    "non_negative_int",
    "positive_int",
]

SEEDS_ENV = "POPXL_FX_SEEDS_DIR"
_REPO = Path(__file__).resolve().parent.parent


class _Parser(argparse.ArgumentParser):
    def add_argument(self, *args, **kwargs):
        # argparse prints no line (so no default) for an option without help text
        kwargs.setdefault("help", "(default: %(default)s)")
        return super().add_argument(*args, **kwargs)


def make_parser(description: str) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help shows the default of every option."""
    return _Parser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0 (0 usually means 'no cap')."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive integer, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def existing_data_dir(text: str) -> Path:
    """argparse type: a folder that exists and holds the four IDX files, directly (plain or
    .gz) or in torchvision's ``<Class>/raw`` layout. Nothing is ever created for it."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not an existing folder")
    places = [path] + [raw_dir(path, d) for d in DATASETS]
    if not any(_has_idx(p) for p in places):
        names = ", ".join(f"{n}[.gz]" for n in IDX_FILES)
        raise argparse.ArgumentTypeError(
            f"{text!r} holds no IDX files: looked for {names} in it and in "
            f"{', '.join(str(p.relative_to(path)) for p in places[1:])}"
        )
    return path


def _has_idx(folder: Path) -> bool:
    return all((folder / n).is_file() or (folder / f"{n}.gz").is_file() for n in IDX_FILES)


def add_data_args(parser: argparse.ArgumentParser) -> None:
    """--data-dir, --dataset and --fashion-as-mnist."""
    parser.add_argument(
        "--data-dir",
        type=existing_data_dir,
        default=None,
        help="a folder holding the four (Fashion-)MNIST IDX files; default: staged under "
        "$POPXL_FX_DATA_DIR or ~/.cache/popxl_fx/data",
    )
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="fashion-mnist")
    parser.add_argument(
        "--fashion-as-mnist",
        action="store_true",
        help="with --dataset mnist and no MNIST files: use Fashion-MNIST under MNIST's names",
    )


def data_kwargs(args: argparse.Namespace) -> dict:
    """The data options of ``args`` as keyword arguments of `popxl_fx.data.get_data_loaders`."""
    return {
        "data_dir": args.data_dir,
        "dataset": args.dataset,
        "allow_fashion_as_mnist": args.fashion_as_mnist,
    }


def _main_checkout(repo: Path) -> Path | None:
    """The main checkout of ``repo`` when it is a git worktree (its ``.git`` is a file naming
    ``<main>/.git/worktrees/<name>``), else None."""
    dot_git = repo / ".git"
    if not dot_git.is_file():
        return None
    text = dot_git.read_text().strip()
    if not text.startswith("gitdir:"):
        return None
    gitdir = (repo / text[len("gitdir:") :].strip()).resolve()
    common = gitdir / "commondir"
    if not common.is_file():
        return None
    return (gitdir / common.read_text().strip()).resolve().parent


def default_seeds_dir() -> Path:
    """$POPXL_FX_SEEDS_DIR, else ../shared/seeds beside this repository, or beside its main
    checkout when this is a git worktree (the first that exists; the first if none does)."""
    env = os.environ.get(SEEDS_ENV)
    if env:
        return Path(env).expanduser()
    candidates = [_REPO.parent / "shared" / "seeds"]
    main = _main_checkout(_REPO)
    if main is not None:
        candidates.append(main.parent / "shared" / "seeds")
    return next((c for c in candidates if c.is_dir()), candidates[0])
