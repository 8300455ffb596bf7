"""What a book page does with a chapter's findings: glue each one under its name for the prose to quote."""

from __future__ import annotations

import numpy as np
from myst_nb import glue


def glue_all(findings: dict) -> None:
    """Each finding under its name; a numpy number as the Python number it is, which the prose's formats take."""
    for name, value in findings.items():
        glue(name, value.item() if isinstance(value, np.generic) else value, display=False)
