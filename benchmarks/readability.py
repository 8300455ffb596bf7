"""Words per sentence in the built book's prose: what a newcomer meets, measured the way issue #69 measured it.

    python benchmarks/readability.py                      # every page of _build/html (make book first)
    python benchmarks/readability.py intro studies/nodes  # some pages

Prints per page its sentences, their mean length, how many run over 40 words, and the opening answer's mean.
Then it prints the PDF's page count, where `make pdf` made it.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

from ddp_core.paths import REPO_ROOT

SITE = REPO_ROOT / "_build" / "html"
PDF_LOG = REPO_ROOT / "_build" / "latex" / "book.log"
LONG = 40  # words: a sentence a reader has to read twice
ARTICLE = re.compile(r'<article class="bd-article".*?</article>', re.S)
# As issue #69 counted: code, tables, captions and equations left out, a glued value one word.
LEFT_OUT = re.compile(r"<(table|pre|figcaption|script|style|math|nav)\b.*?</\1>|\\\(.*?\\\)|\$\$.*?\$\$", re.S)
GLUED = re.compile(r'<span class="pasted-text">.*?</span>', re.S)
PARAGRAPH = re.compile(r"<(p|li)\b([^>]*)>(.*?)</\1>", re.S)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*])")


def paragraphs(page: Path) -> list[list[str]]:
    """The prose of one built page, paragraph by paragraph and sentence by sentence, each glued value as "VALUE"."""
    article = ARTICLE.search(page.read_text())
    text = LEFT_OUT.sub(" ", article.group(0) if article else "")
    text = GLUED.sub(" VALUE ", text)
    found = []
    for _, attributes, paragraph in PARAGRAPH.findall(text):
        if "toctree" in attributes:  # the list of chapters, not prose
            continue
        prose = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", paragraph)).split())
        found.append(SENTENCE_END.split(prose))
    return found


def words(paragraph: list[str]) -> list[int]:
    """Each sentence's words; a label such as "In short." is not a sentence."""
    return [len(sentence.split()) for sentence in paragraph if len(sentence.split()) > 2]


def lengths(page: Path) -> list[int]:
    return [n for paragraph in paragraphs(page) for n in words(paragraph)]


def opening_lengths(page: Path) -> list[int]:
    """The words of each sentence of the page's answer, the paragraph that opens with "In short."."""
    return next((words(p) for p in paragraphs(page) if p and p[0].startswith("In short.")), [])


def main(argv: list[str]) -> int:
    pages = [SITE / f"{name}.html" for name in argv] or sorted(SITE.rglob("*.html"))
    missing = [page for page in pages if not page.is_file()]
    if missing:
        print(f"readability.py: no built page {missing[0]} (make book first)", file=sys.stderr)
        return 2
    print(f"{'page':40} sentences  words/sentence  over {LONG}  opening")
    for page in pages:
        counts, opening = lengths(page), opening_lengths(page)
        if counts:
            answer = f"{sum(opening) / len(opening):7.1f}" if opening else f"{'-':>7}"
            print(
                f"{str(page.relative_to(SITE)):40} {len(counts):9}  {sum(counts) / len(counts):14.1f}  "
                f"{sum(n > LONG for n in counts):7}  {answer}"
            )
    log = PDF_LOG.read_text(errors="replace") if PDF_LOG.is_file() else ""
    printed = re.search(r"Output written on book\.pdf \((\d+) pages", log)
    if printed:
        print(f"PDF: {printed[1]} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
