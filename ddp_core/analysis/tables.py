"""Tables as a reader sees them: one column per configuration, one row per quantity named in words with its unit."""

from __future__ import annotations

import re

import pandas as pd


def rank_label(n: int) -> str:
    """A world size in words, "1 rank" or "4 ranks": how tables, legends and axes name it."""
    return f"{n} rank{'s' if n > 1 else ''}"


def commit_text(commit: str | None) -> str:
    """A run's code commit as the book shows it: short, `-dirty` kept (its tree had uncommitted changes)."""
    return "unknown" if commit is None else commit[:10] + ("-dirty" if commit.endswith("-dirty") else "")


def day(stamp: str) -> str:
    """The date of an ISO time as run.json and device.json write it: '2026-11-26'."""
    return stamp[:10]


def measured_by(info: dict, stamp: str = "start_time") -> dict:
    """What ran, as every page says it of a run or a benchmark: the day it was measured (its `stamp` field) and the
    code commit (`commit_text`), under the same keys everywhere."""
    return {"measured_on": day(info[stamp]), "commit": commit_text(info.get("git_commit"))}


def counted(n: int, noun: str) -> str:
    """"1 thread", "2 threads": a count with its noun, never "thread(s)"."""
    return f"{n} {noun}{'s' if n != 1 else ''}"


WORDS = {"ddp": "DDP", "lr": "LR", "warmup": "warm-up", "ag": "AG", "news": "News", "imdb": "IMDB", "mib": "MiB",
         "powersgd": "PowerSGD"}


def in_words(name: str) -> str:
    """A variant or dataset as a reader names it: "linear_lr_warmup" -> "linear LR warm-up", "ag_news" -> "AG News",
    "300mbit" -> "300 Mbit/s"."""
    rate = re.fullmatch(r"(\d+)([kmg])bit", str(name))
    if rate:
        return f"{rate[1]} {rate[2].upper()}bit/s"
    return " ".join(WORDS.get(word, word) for word in str(name).split("_"))


def with_article(name: str) -> str:
    """"an AMD EPYC", "an Intel Xeon", "a Graviton": a name with the indefinite article it is read with."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


# The headers several tables share, each defined once: a quantity in words with its unit.
STEP_MEDIAN_MS = "Step time, median of the repeats' medians (ms)"
LOWEST, HIGHEST = "lowest, over repeats", "highest, over repeats"  # a median's range, in the rows below it
FINAL_ACCURACY = "Final validation accuracy, median of the repeats"

NUMBER = re.compile(r"[-+–]?\d|–$")  # a formatted number, or "–" for none


def markdown_table(cells: pd.DataFrame, index_name: str | None = None) -> str:
    """The one way the book's tables are written: cells already in words or formatted, as Markdown whose first
    column (the index, headed `index_name`, or else the first column of `cells`) names each row, and whose
    columns of numbers are right-aligned, as numbers are read; words stay left-aligned."""
    if index_name is not None:
        cells = cells.rename_axis(index_name).reset_index()
    numbers = [i > 0 and all(NUMBER.match(str(cell)) for cell in cells[column]) for i, column in enumerate(cells)]
    return cells.to_markdown(index=False, disable_numparse=True,
                             colalign=["right" if number else "left" for number in numbers])


def _formatted(value, fmt: str, scale: float = 1) -> str:
    return fmt.format(value * scale) if pd.notna(value) else "–"


def quantities_by_column(table: pd.DataFrame, rows: list[tuple[str, str, float, str]], column_names: list[str]) -> str:
    """Markdown with a column per row of `table` (named by `column_names`) and a row per (label, column of
    `table`, scale, format): a wide table turned so that it fits a page however many quantities it shows."""
    cells = pd.DataFrame([[_formatted(value, fmt, scale) for value in table[column]] for _, column, scale, fmt in rows],
                         index=[label for label, *_ in rows], columns=column_names)
    return markdown_table(cells, "")


def configurations_as_columns(table: pd.DataFrame, rows: list[tuple[str, str, float, str]]) -> str:
    """`quantities_by_column` for a table indexed by configuration (a study's variants): a column each, named in
    words ("linear LR warm-up", `in_words`), and a row per (label with unit, column of `table`, scale, format)."""
    return quantities_by_column(table, rows, [in_words(name) for name in table.index])


def one_row_each(table: pd.DataFrame, columns: dict[str, tuple[str, str]], index_name: str | None = None) -> str:
    """Markdown with a row per row of `table` and a column per (column of `table` -> (header in words with its
    unit, format)): for tables with few quantities and one row per configuration. An empty value (nothing to
    measure there, e.g. R_N of a run without an all-reduce) reads "–". No rows: no table (LaTeX has none of no rows)."""
    if table.empty:
        return ""
    shown = pd.DataFrame({label: [_formatted(v, fmt) for v in table[column]] for column, (label, fmt) in columns.items()},
                         index=table.index)
    return markdown_table(shown, index_name)
