"""Sentence statistics of Markdown pages: median and longest sentence, and how many run over 60.

How a page is split into sentences:

1. Fenced code blocks (```` ``` ```` ... ```` ``` ````), table rows (lines that start with ``|``),
   headings (lines that start with ``#``) and HTML comments are dropped.
2. What is left is cut into blocks at blank lines and at list items (a line that starts with
   ``-``, ``*``, ``+`` or ``1.``): a block never continues across either, so a list item without a
   full stop is still a sentence of its own.
3. Inline code spans count as one word each (a dot inside ``a.b`` ends nothing), and a link
   ``[text](target)`` counts as its text.
4. A block is cut after ``.``, ``!`` or ``?`` (optionally followed by a closing bracket or quote)
   where whitespace follows and the next word starts with a capital letter, a digit, a backtick,
   an opening bracket or quote, or emphasis; so "e.g. the" and "1.2x" do not end a sentence.
   Nor does the dot of an abbreviation (``e.g.``, ``i.e.``, ``etc.``, ``vs.``, ``cf.``), whatever
   follows it.
5. A word is a whitespace-separated token with at least one letter or digit in it.

Run it as ``python tools/doc_sentences.py README.md docs/*.md``; ``--limit`` changes the 60.

Example:
    >>> stats("Short. Another, `a.b` here!\\n\\n- an item\\n")
    Stats(count=3, median=2.0, longest=3, over=0, longest_text='Another, `a.b` here!')
"""

from __future__ import annotations

import argparse
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Stats", "sentences", "stats", "main"]

LIMIT = 60
_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_CODE = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_END = re.compile(r"(?<=[.!?])([)\"'*_]*)\s+(?=[A-Z0-9`(\[\"'*_])")
_WORD = re.compile(r"[A-Za-z0-9]")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


@dataclass(frozen=True)
class Stats:
    """One page's sentence statistics (words per sentence)."""

    count: int
    median: float
    longest: int
    over: int
    longest_text: str


def _blocks(text: str) -> list[str]:
    """The page's prose, one string per paragraph or list item."""
    text = _COMMENT.sub("", _FENCE.sub("", text))
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#")):
            blocks.append([])
            continue
        if _ITEM.match(line):
            blocks.append([])
            stripped = _ITEM.sub("", line)
        blocks[-1].append(stripped)
    return [" ".join(b) for b in blocks if b]


def sentences(text: str) -> list[str]:
    """The sentences of a Markdown page's prose, as written (code spans kept)."""
    out = []
    for block in _blocks(text):
        masked = _CODE.sub(lambda m: "`" + "x" * (len(m.group()) - 2) + "`", block)
        start = 0
        for m in _END.finditer(masked):
            if masked[: m.start()].endswith(_ABBREVIATIONS):
                continue
            out.append(block[start : m.end(1)].strip())
            start = m.end()
        out.append(block[start:].strip())
    return [s for s in out if _WORD.search(s)]


def words(sentence: str) -> int:
    """The number of words in one sentence (a code span is one word, a link its text)."""
    plain = _LINK.sub(r"\1", _CODE.sub("code", sentence))
    return sum(1 for tok in plain.split() if _WORD.search(tok))


def stats(text: str, limit: int = LIMIT) -> Stats:
    """Median, longest and over-the-limit counts of a Markdown text's sentences."""
    found = sentences(text)
    if not found:
        return Stats(0, 0.0, 0, 0, "")
    lengths = [words(s) for s in found]
    longest = max(range(len(found)), key=lengths.__getitem__)
    over = sum(n > limit for n in lengths)
    return Stats(
        len(found), float(statistics.median(lengths)), lengths[longest], over, found[longest]
    )


def main(argv: list[str] | None = None) -> int:
    """Print one line per file; with ``--long``, also the sentences over the limit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument("--long", action="store_true", help="print the sentences over the limit")
    args = parser.parse_args(argv)
    print(f"{'file':32} {'count':>5} {'median':>6} {'max':>4} {'>' + str(args.limit):>4}")
    for path in args.files:
        text = path.read_text()
        s = stats(text, args.limit)
        print(f"{str(path):32} {s.count:5} {s.median:6.1f} {s.longest:4} {s.over:4}")
        if args.long:
            for sent in sentences(text):
                if words(sent) > args.limit:
                    print(f"    [{words(sent)}] {sent[:160]}...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
