"""What a book page does with a chapter's findings: glue each one under its name for the prose to quote."""

from __future__ import annotations

from myst_nb import glue


def glue_all(findings: dict) -> None:
    for name, value in findings.items():
        glue(name, value, display=False)
