"""What a book page does with its findings: one frozen record per page, each field glued under the name the prose
quotes. So a name in a page greps back to the field that makes it."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import get_type_hints

import numpy as np
from myst_nb import glue


def glued(record, prefix: str = "") -> dict[str, object]:
    """A record's values by glue name. A field that is a record itself (a verdict, a study's set-up) gives its own
    fields, each named `<field>_<its field>`."""
    values = {}
    for field in fields(record):
        name, value = prefix + field.name, getattr(record, field.name)
        values |= glued(value, name + "_") if is_dataclass(value) else {name: value}
    return values


def names_by_field(record_type: type, prefix: str = "") -> dict[str, list[str]]:
    """The names `glued` gives each field of every record of this type, read from the fields' types."""
    hints, by_field = get_type_hints(record_type), {}
    for field in fields(record_type):
        kind, name = hints[field.name], prefix + field.name
        by_field[field.name] = glue_names(kind, name + "_") if is_dataclass(kind) else [name]
    return by_field


def glue_names(record_type: type, prefix: str = "") -> list[str]:
    """The names `glued` gives every record of this type: what its page may quote."""
    return [name for names in names_by_field(record_type, prefix).values() for name in names]


def glue_findings(record) -> None:
    """Glue each of a page's findings; a numpy number as the Python number it is, which the prose's formats take."""
    for name, value in glued(record).items():
        glue(name, value.item() if isinstance(value, np.generic) else value, display=False)
