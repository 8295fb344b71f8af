"""The README and the user guide read as a guide: median sentence under 25 words, none over 60.

`tools/doc_sentences.py` measures the sentences (its docstring says how it splits them); this
runs it over README.md and docs/*.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import doc_sentences

ROOT = Path(__file__).resolve().parent.parent
MEDIAN_BELOW = 25
LONGEST = 60

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_splitting():
    text = (
        "First one, e.g. with `a.b` and 1.2x. Second [a link](x.md)!\n\n"
        "```python\nnot. counted. here.\n```\n| a | table. |\n# A heading.\n- an item\n"
    )
    assert doc_sentences.sentences(text) == [
        "First one, e.g. with `a.b` and 1.2x.",
        "Second [a link](x.md)!",
        "an item",
    ]
    assert [doc_sentences.words(s) for s in doc_sentences.sentences(text)] == [7, 3, 2]


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_sentence_lengths(page):
    stats = doc_sentences.stats(page.read_text(), LONGEST)
    assert stats.median < MEDIAN_BELOW, f"{_page_id(page)}: median sentence {stats.median} words"
    assert stats.over == 0, (
        f"{_page_id(page)}: {stats.over} sentence(s) over {LONGEST} words, the longest "
        f"{stats.longest}: {stats.longest_text[:200]}"
    )
