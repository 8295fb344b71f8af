"""Run a seed tutorial's python blocks, unchanged, on this project, and check its printed output.

The seeds (Graphcore's PopXL tutorials) live in ``../shared/seeds``; nothing of them is copied
into the project: this tool reads the file at run time, joins its ```python blocks in order,
runs them with ``popxl``/``popxl_addons`` resolved to this project (popxl_core.compat) and
compares stdout with the ```output blocks (object addresses, progress bars and the numbers
training produces aside).

    python tools/seed_runner.py ../shared/seeds/001_*.txt [--max-batches N] [--data-dir D]

``--max-batches`` caps every torch DataLoader (a test-suite budget, not a change to the code).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path
from typing import List, Tuple

_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
# lines whose content is produced by training (loss/accuracy/timing values)
_VOLATILE = ("it/s]", "Loss:", "Accuracy on test set", "s/it]")


def blocks(path: Path) -> List[Tuple[str, str]]:
    """The fenced blocks of a seed as (language, text), in order."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(path.read_text())]


def code_of(path: Path) -> str:
    return "\n".join(text for lang, text in blocks(path) if lang == "python")


def expected_lines(path: Path) -> List[str]:
    out: List[str] = []
    for lang, text in blocks(path):
        if lang == "output":
            out += [_normal(line) for line in text.splitlines() if _kept(line)]
    return out


def _kept(line: str) -> bool:
    return bool(line.strip()) and not any(v in line for v in _VOLATILE)


def _normal(line: str) -> str:
    return _ADDRESS.sub("0xADDR", line.rstrip())


def missing_lines(expected: List[str], stdout: str) -> List[str]:
    """Expected lines not found, in order, among the printed lines."""
    printed = [_normal(line) for line in stdout.splitlines()]
    missing, pos = [], 0
    for want in expected:
        try:
            pos = printed.index(want, pos) + 1
        except ValueError:
            missing.append(want)
    return missing


def cap_data_loaders(max_batches: int) -> None:
    """Make every torch DataLoader yield at most ``max_batches`` batches."""
    import itertools

    import torch.utils.data as tud

    orig_iter, orig_len = tud.DataLoader.__iter__, tud.DataLoader.__len__
    tud.DataLoader.__iter__ = lambda self: itertools.islice(orig_iter(self), max_batches)
    tud.DataLoader.__len__ = lambda self: min(orig_len(self), max_batches)


def run(path: Path, max_batches: int = 0) -> str:
    """Run the seed's code under the compat hook; return what it printed to stdout."""
    from popxl_core import compat

    compat.install()
    if max_batches:
        cap_data_loaders(max_batches)
    buf = io.StringIO()
    namespace = {"__name__": "__main__", "__file__": str(path)}
    with contextlib.redirect_stdout(_Tee(buf, sys.stdout)):
        exec(compile(code_of(path), str(path), "exec"), namespace)
    return buf.getvalue()


class _Tee(io.TextIOBase):
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed", type=Path)
    ap.add_argument("--max-batches", type=int, default=0)
    args = ap.parse_args()
    from popxl_fx.data import stage_mnist_offline

    stage_mnist_offline()
    stdout = run(args.seed, args.max_batches)
    missing = missing_lines(expected_lines(args.seed), stdout)
    for line in missing:
        print(f"MISSING: {line}", file=sys.stderr)
    print(f"seed_runner: {len(missing)} expected line(s) missing", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
