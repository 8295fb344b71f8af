"""Run a seed tutorial's python blocks, unchanged, on this project, and check its printed output.

The seeds (Graphcore's PopXL tutorials) live in ``../shared/seeds``; nothing of them is copied
into the project: this tool reads the file at run time, runs its ```python blocks one after
another in one namespace with ``popxl``/``popxl_addons`` resolved to this project
(popxl_core.compat), and compares stdout with the ```output blocks (object addresses, progress
bars and the numbers training produces aside).

    python tools/seed_runner.py ../shared/seeds/001_*.txt [--max-batches N] [--data-dir D]
    python tools/seed_runner.py 001 000 003 --max-batches 12   # several, one after another
    python tools/seed_runner.py ../shared/seeds/001_*.txt --extract /tmp/seed001.py
    python -m popxl_core.compat /tmp/seed001.py     # the same code as one plain script

``--max-batches`` caps every torch DataLoader (a test-suite budget, not a change to the code).

Illustrative blocks. Some tutorials show fragments that are not meant to run, e.g. a bare
``call(graph, x, ...)`` describing what a method does. The rule for skipping one is precise:
a block is skipped when running it raises NameError for a name that no python block of the
seed binds at module level and that is not a builtin, i.e. a name defined nowhere in the
tutorial, so the block cannot run on any PopXL. Every skipped block is reported (seed line,
the undefined name, its first line). Any other error stops the run.

Data. The seeds read MNIST through ``torchvision.datasets.MNIST("~/.torch/datasets",
download=True)``. The runner first stages MNIST's raw files there (`popxl_fx.data.prepare`
with ``allow_fashion_as_mnist=True``): real MNIST when torchvision can download it, else
Fashion-MNIST's IDX files (Debian's ``dataset-fashion-mnist``) under MNIST's file names, with a
notice; the accuracies are then Fashion-MNIST accuracies.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import re
import shutil
import symtable
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Set, Tuple

_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
# A notebook cell runs to the next cell or markdown heading of level 2+ (a level-1 heading
# reads as a python comment, while "# comment" lines at column 0 are common in cells).
_CELL = re.compile(r"^In \[[^\]\n]*\]:\n(.*?)(?=^In \[|^#{2,6} |\Z)", re.S | re.M)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
# lines whose content is produced by training (loss/accuracy/timing values)
_VOLATILE = ("it/s]", "Loss:", "Accuracy on test set", "s/it]")
_ACCURACY = re.compile(r"Accuracy on test set: ([0-9.]+)%")
SEED_DATA_ROOT = "~/.torch/datasets"  # the root the seeds pass to torchvision


@dataclass
class Block:
    lang: str
    text: str
    line: int  # line of the seed file where the block's first line is


@dataclass
class Skipped:
    line: int
    name: str
    first_line: str

    def __str__(self) -> str:
        return (
            f"line {self.line}: `{self.first_line}` - NameError: {self.name!r} is "
            "defined nowhere in the seed (illustrative fragment)"
        )


@dataclass
class SeedRun:
    stdout: str
    skipped: List[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    namespace: dict = field(default_factory=dict, repr=False)  # the seed's globals at the end

    @property
    def accuracy(self) -> Optional[float]:
        """The last 'Accuracy on test set' the seed printed, in percent."""
        hits = _ACCURACY.findall(self.stdout)
        return float(hits[-1]) if hits else None


def blocks(path: Path) -> List[Block]:
    """The fenced blocks of a seed, in order."""
    text = path.read_text()
    return [
        Block(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1)
        for m in _BLOCK.finditer(text)
    ]


def notebook_cells(path: Path) -> List[Block]:
    """The code cells of a seed rendered from a notebook: each ``In [..]:`` line starts one,
    which runs to the next cell, the next markdown heading (## and deeper) or the end."""
    text = path.read_text()
    return [
        Block("python", m.group(1), text.count("\n", 0, m.start(1)) + 1)
        for m in _CELL.finditer(text)
    ]


def python_blocks(path: Path) -> List[Block]:
    """The seed's code: its notebook cells if it has any (its fenced blocks are then prose
    examples, some not even valid Python, such as bare signatures), else its fenced python
    blocks."""
    return notebook_cells(path) or [b for b in blocks(path) if b.lang == "python"]


def code_of(path: Path) -> str:
    """All python blocks joined (for reading; `run` executes them one by one)."""
    return "\n".join(b.text for b in python_blocks(path))


def expected_lines(path: Path) -> List[str]:
    out: List[str] = []
    for b in blocks(path):
        if b.lang == "output":
            out += [_normal(line) for line in b.text.splitlines() if _kept(line)]
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


# Which names a seed defines ---------------------------------------------------------------
def _tables(source: str) -> symtable.SymbolTable:
    return symtable.symtable(source, "<seed block>", "exec")


def module_bindings(sources: List[str]) -> Set[str]:
    """Names bound at module level (assigned, imported, def, class, for/with targets)."""
    bound: Set[str] = set()
    for src in sources:
        for sym in _tables(src).get_symbols():
            if sym.is_assigned() or sym.is_imported():
                bound.add(sym.get_name())
    return bound


def global_reads(source: str, nested: bool = True) -> Set[str]:
    """Names a block reads from the module namespace: at top level and, with ``nested``, as
    globals inside its functions and classes (resolved when they run)."""
    reads: Set[str] = set()

    def visit(table: symtable.SymbolTable, top: bool) -> None:
        for sym in table.get_symbols():
            if sym.is_referenced() and (top or sym.is_global()):
                reads.add(sym.get_name())
        for child in table.get_children() if nested else ():
            visit(child, False)

    visit(_tables(source), True)
    return reads


def names_defined_nowhere(path: Path) -> Set[str]:
    """Names the seed's python blocks read that no block binds at module level (nor builtins)."""
    pys = python_blocks(path)
    bound = module_bindings([b.text for b in pys]) | set(dir(builtins))
    return set().union(*(global_reads(b.text) for b in pys)) - bound


# Running ------------------------------------------------------------------------------------
def cap_data_loaders(max_batches: int) -> None:
    """Make every torch DataLoader yield at most ``max_batches`` batches."""
    import itertools

    import torch.utils.data as tud

    if getattr(tud.DataLoader, "_seed_runner_cap", None) == max_batches:
        return  # already capped (several seeds in one process)
    orig_iter, orig_len = tud.DataLoader.__iter__, tud.DataLoader.__len__
    tud.DataLoader._seed_runner_cap = max_batches
    tud.DataLoader.__iter__ = lambda self: itertools.islice(orig_iter(self), max_batches)
    tud.DataLoader.__len__ = lambda self: min(orig_len(self), max_batches)


@contextlib.contextmanager
def undone_after():
    """Seeds run inside leave this process as they found it: the DataLoader cap
    (`cap_data_loaders`) and the compat import hook (`run`) are undone on exit."""
    import torch.utils.data as tud

    from popxl_core import compat

    saved = {k: tud.DataLoader.__dict__.get(k) for k in ("__iter__", "__len__")}
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(tud.DataLoader, k, v)
        if hasattr(tud.DataLoader, "_seed_runner_cap"):
            del tud.DataLoader._seed_runner_cap
        compat.uninstall()


def run(path: Path, max_batches: int = 0, echo: bool = True) -> SeedRun:
    """Run the seed's python blocks in order under the compat hook (``popxl`` and
    ``popxl_addons`` are this project); ``max_batches`` caps every DataLoader."""
    from popxl_core import compat

    compat.install()
    if max_batches:
        cap_data_loaders(max_batches)
    return execute(path, echo)


def execute(path: Path, echo: bool = True, namespace: Optional[dict] = None) -> SeedRun:
    """Run the python blocks one by one in one namespace (``namespace``, or a new dict),
    capturing stdout; a block is skipped only by the rule of the module docstring (NameError
    for a name defined nowhere)."""
    undefined = names_defined_nowhere(path)
    buf = io.StringIO()
    namespace = {} if namespace is None else namespace
    namespace.update({"__name__": "__main__", "__file__": str(path)})
    result = SeedRun("", namespace=namespace)
    streams = (buf, sys.stdout) if echo else (buf,)
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(_Tee(*streams)):
            for block in python_blocks(path):
                skip = _run_block(path, block, namespace, undefined)
                if skip is not None:
                    result.skipped.append(skip)
    finally:
        result.seconds = time.perf_counter() - start
        result.stdout = buf.getvalue()
    return result


def _run_block(path: Path, block: Block, namespace: dict, undefined: Set[str]):
    # Padding keeps the seed's own line numbers in tracebacks.
    code = compile("\n" * (block.line - 1) + block.text, str(path), "exec")
    try:
        exec(code, namespace)
    except NameError as err:
        if err.name not in undefined:
            raise
        first = block.text.strip().splitlines()[0]
        return Skipped(block.line, err.name, first)
    return None


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


def stage_data(data_dir: Optional[str] = None) -> Path:
    """Make ``torchvision.datasets.MNIST(SEED_DATA_ROOT, download=True)`` work offline.

    MNIST's raw files are staged in SEED_DATA_ROOT (expanded) by `popxl_fx.data.prepare`: real
    MNIST if a source has it, else Fashion-MNIST under MNIST's names (it prints a notice).
    ``data_dir`` is an extra folder of IDX files; what it yields is copied into the root.
    """
    from popxl_fx.data import STAND_IN_MARKER, prepare, raw_dir

    root = Path(SEED_DATA_ROOT).expanduser()
    if data_dir is None:
        return prepare("mnist", data_dir=root, allow_fashion_as_mnist=True)
    src = raw_dir(prepare("mnist", data_dir=data_dir, allow_fashion_as_mnist=True), "mnist")
    dest = raw_dir(root, "mnist")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / STAND_IN_MARKER).unlink(missing_ok=True)  # src brings its own marker, if any
    for f in src.iterdir():
        shutil.copyfile(f, dest / f.name)
    return root


def check(path: Path, max_batches: int = 0, echo: bool = True) -> Tuple[SeedRun, List[str]]:
    """Run a seed and return the run and the expected output lines it did not print."""
    res = run(path, max_batches, echo)
    return res, missing_lines(expected_lines(path), res.stdout)


def extract(path: Path) -> str:
    """The seed's python blocks as one script for ``python -m popxl_core.compat``.

    A block whose top-level code reads a name defined nowhere in the seed would stop the
    script with NameError; it is left out, with a comment saying why (the static form of the
    skipping rule). Write the script outside the project: it is the seed's code.
    """
    undefined = names_defined_nowhere(path)
    parts = []
    for b in python_blocks(path):
        names = sorted(global_reads(b.text, nested=False) & undefined)
        if names:
            parts.append(
                f"# seed_runner: block at line {b.line} left out: {names} defined "
                "nowhere in the seed (illustrative fragment)\n"
            )
        else:
            parts.append(f"# seed line {b.line}\n{b.text}")
    return "\n".join(parts)


def resolve_seed(ap: argparse.ArgumentParser, text: str, seeds_dir: Path) -> Path:
    """A seed given as a path, or as a number looked up as ``NNN_*.txt`` in ``seeds_dir``."""
    path = Path(text)
    if path.is_file():
        return path
    hits = sorted(seeds_dir.glob(f"{text}_*.txt")) if seeds_dir.is_dir() else []
    if len(hits) == 1:
        return hits[0]
    where = f"{seeds_dir} (from --seeds-dir or $POPXL_FX_SEEDS_DIR)"
    ap.error(
        f"seed {text!r} is neither a file nor a single NNN_*.txt in {where}"
        + ("" if seeds_dir.is_dir() else "; that folder does not exist")
    )


def main() -> int:
    from popxl_fx.cli import (
        SEEDS_ENV,
        default_seeds_dir,
        existing_data_dir,
        make_parser,
        non_negative_int,
    )

    ap = make_parser(__doc__.splitlines()[0])
    ap.add_argument(
        "seed",
        nargs="+",
        help="a seed file, or its number (e.g. 001) in --seeds-dir; several run one after "
        "another in this process, each in a namespace of its own",
    )
    ap.add_argument(
        "--seeds-dir",
        type=Path,
        default=default_seeds_dir(),
        help=f"where the seed tutorials are (env {SEEDS_ENV})",
    )
    ap.add_argument(
        "--max-batches",
        type=non_negative_int,
        default=0,
        help="cap every DataLoader at N batches (0: no cap)",
    )
    ap.add_argument(
        "--data-dir",
        type=existing_data_dir,
        default=None,
        help="folder with the four (Fashion-)MNIST IDX files, if not in the "
        "usual places (Debian's dataset-fashion-mnist)",
    )
    ap.add_argument(
        "--torch-seed",
        type=int,
        default=None,
        metavar="N",
        help="torch.manual_seed(N) before the seed runs (its DataLoaders shuffle with torch's "
        "generator: the processes of a torchrun job must draw the same batches)",
    )
    ap.add_argument(
        "--extract",
        type=Path,
        default=None,
        metavar="SCRIPT",
        help="only write the runnable blocks to SCRIPT (to run with "
        "`python -m popxl_core.compat SCRIPT`), and stage the data",
    )
    args = ap.parse_args()
    seeds = [resolve_seed(ap, text, args.seeds_dir) for text in args.seed]
    if args.extract is not None and len(seeds) > 1:
        ap.error("--extract writes one seed's script: give one seed")
    stage_data(args.data_dir)
    if args.extract is not None:
        args.extract.write_text(extract(seeds[0]))
        print(f"seed_runner: wrote {args.extract}", file=sys.stderr)
        return 0
    if args.torch_seed is not None:  # the DataLoaders shuffle with torch's generator
        import torch

        torch.manual_seed(args.torch_seed)
    missing = [_check_and_log(seed, args.max_batches, len(seeds) > 1) for seed in seeds]
    return 1 if any(missing) else 0


def _check_and_log(seed: Path, max_batches: int, several: bool) -> int:
    """Run one seed, log what was skipped or missing to stderr; the count of missing lines.
    With several seeds, a line on stdout and on stderr names the seed its output follows."""
    if several:
        print(f"seed_runner: seed {seed.name}", flush=True)
        print(f"seed_runner: seed {seed.name}", file=sys.stderr)
    res, missing = check(seed, max_batches)
    log = sys.stderr
    for skip in res.skipped:
        print(f"seed_runner: skipped block at {skip}", file=log)
    for line in missing:
        print(f"MISSING: {line}", file=log)
    print(
        f"seed_runner: {len(missing)} expected line(s) missing; "
        f"{len(res.skipped)} illustrative block(s) skipped; accuracy {res.accuracy}; "
        f"{res.seconds:.1f} s",
        file=log,
    )
    return len(missing)


if __name__ == "__main__":
    sys.exit(main())
