"""Words per sentence in the built book's prose: what a newcomer meets, measured the way issue #69 measured it (a
glued value counts as one word; code, tables, captions and equations left out).

    python benchmarks/readability.py                      # every page of _build/html (make book first)
    python benchmarks/readability.py intro studies/nodes  # some pages

Prints, per page, its sentences, their mean length in words, and how many run over 40 words.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

from ddp_core.paths import REPO_ROOT

SITE = REPO_ROOT / "_build" / "html"
LONG = 40  # words: a sentence a reader has to read twice
ARTICLE = re.compile(r'<article class="bd-article".*?</article>', re.S)
LEFT_OUT = re.compile(r"<(table|pre|figcaption|script|style|math|nav)\b.*?</\1>|\\\(.*?\\\)|\$\$.*?\$\$", re.S)
GLUED = re.compile(r'<span class="pasted-text">.*?</span>', re.S)
PARAGRAPH = re.compile(r"<(p|li)\b([^>]*)>(.*?)</\1>", re.S)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*])")


def sentences(page: Path) -> list[str]:
    """The prose sentences of one built page, each glued value as the word "VALUE"."""
    article = ARTICLE.search(page.read_text())
    text = LEFT_OUT.sub(" ", article.group(0) if article else "")
    text = GLUED.sub(" VALUE ", text)
    found = []
    for _, attributes, paragraph in PARAGRAPH.findall(text):
        if "toctree" in attributes:  # the list of chapters, not prose
            continue
        prose = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", paragraph)).split())
        found += [sentence for sentence in SENTENCE_END.split(prose) if len(sentence.split()) > 2]
    return found


def lengths(page: Path) -> list[int]:
    return [len(sentence.split()) for sentence in sentences(page)]


def main(argv: list[str]) -> int:
    pages = [SITE / f"{name}.html" for name in argv] or sorted(SITE.rglob("*.html"))
    missing = [page for page in pages if not page.is_file()]
    if missing:
        print(f"readability.py: no built page {missing[0]} (make book first)", file=sys.stderr)
        return 2
    print(f"{'page':40} sentences  words/sentence  over {LONG}")
    for page in pages:
        counts = lengths(page)
        if counts:
            print(f"{str(page.relative_to(SITE)):40} {len(counts):9}  {sum(counts) / len(counts):14.1f}  "
                  f"{sum(n > LONG for n in counts):7}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
