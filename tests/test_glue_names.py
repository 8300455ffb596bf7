"""Every name a page quotes is a field of its page's findings record, and every field is quoted: a misspelt name or a
dead finding fails here, in a second, not at the end of a book build."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from ddp_core.report.page import glue_names, names_by_field

REPO = Path(__file__).resolve().parents[1]
QUOTED = re.compile(r"\{glue(?::\w*)?\}`([A-Za-z0-9_]+)|```\{glue(?::\w*)?\}\s+([A-Za-z0-9_]+)")
PAGES = sorted([*(REPO / "book").glob("**/*.md"), REPO / "notebooks" / "scaling_analysis.md"])


def quoted(page: Path) -> set[str]:
    return {a or b for a, b in QUOTED.findall(page.read_text())}


QUOTING = [page for page in PAGES if quoted(page)]


@pytest.mark.parametrize("page", QUOTING, ids=lambda page: str(page.relative_to(REPO)))
def test_a_page_quotes_only_its_records_fields_and_every_one_of_them(page):
    record = importlib.import_module(f"ddp_core.report.{page.stem}").Findings
    names = glue_names(record)
    assert sorted(quoted(page) - set(names)) == [], "quoted, but no field of the page's record"
    unquoted = [field for field, its_names in names_by_field(record).items() if not quoted(page) & set(its_names)]
    assert unquoted == [], "fields the page never quotes"


def test_the_names_are_read_from_the_records_types():
    from ddp_core.report.precision import Findings

    names = glue_names(Findings)
    assert {"precision_speed_value", "precision_speed_verdict", "setup_made_on", "crossref_cpu"} <= set(names)
    assert len(names) == len(set(names))
