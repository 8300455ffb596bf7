"""Tables as a reader sees them: one column per configuration, one row per quantity named in words with its unit."""

from __future__ import annotations

import math
import re

import pandas as pd


def commit_text(commit: str | None) -> str:
    """A run's code commit as the book shows it: short, with `-dirty` kept, since it marks uncommitted changes."""
    return "unknown" if commit is None else commit[:10] + ("-dirty" if commit.endswith("-dirty") else "")


def day(stamp: str) -> str:
    """The date of an ISO time as run.json and device.json write it: '2026-11-26'."""
    return stamp[:10]


def measured_by(info: dict, stamp: str = "start_time") -> dict:
    """When and from which commit a run or benchmark was measured, under the same keys on every page."""
    return {"measured_on": day(info[stamp]), "commit": commit_text(info.get("git_commit"))}


def machine_text(info: dict) -> str:
    """The device of a run.json or device.json as the book names it: 'AMD EPYC (avx2)', or a GPU's name.

    A CPU is named with its vector extensions, since they set its speed.
    """
    if str(info.get("device")).startswith("cuda"):
        return info["device_name"]
    return f"{info['device_name']} ({', '.join(info.get('cpu_extensions') or ['extensions not recorded'])})"


def cpu_relation(info: dict, other: dict) -> str:
    """Whether two run.json or device.json describe "the same CPU" or "two different CPUs", by `machine_text`."""
    return "the same CPU" if machine_text(info) == machine_text(other) else "two different CPUs"


def range_text(low: float, high: float, fmt: str = "{:.2f}", between: str = "–") -> str:
    """A range as the tables give it, '1.20–1.59', or as the prose does with `between=" to "`.

    Where both ends read the same in `fmt`, it gives the one value, never '1.41 to 1.41'.
    """
    low_text, high_text = fmt.format(low), fmt.format(high)
    return low_text if low_text == high_text else f"{low_text}{between}{high_text}"


def median_range(median: float, low: float, high: float, fmt: str = "{:.2f}", between: str = "–") -> str:
    """A median with the range it lies in, as the tables give it: '1.35 (1.20–1.59)'.

    Where the range reads as one value, the median stands alone.
    """
    median_text, spread = fmt.format(median), range_text(low, high, fmt, between)
    return median_text if spread == median_text else f"{median_text} ({spread})"


def noise_format(value: float, floor: float) -> str:
    """The format that writes `value` to the digit its noise floor allows, so no digit claims more than the noise.

    It shows two decimals at most, and where the floor is unknown.
    """
    # The last digit shown is the first a relative spread of `floor` can move: 2.66 at 7 % is '2.7', 0.80 at 4 % '0.80'.
    if not floor > 0 or not value:
        return "{:.2f}"
    return f"{{:.{min(2, max(0, -math.floor(math.log10(abs(value) * floor))))}f}}"


def difference_text(value: float, bound: str = "") -> str:
    """A difference as a reader reads it: '0', two significant figures, or the power of ten it lies within.

    Below four decimals a difference's digits are float rounding: what it says is how small it is.
    """
    size = abs(value)
    if size == 0:
        return "0"
    if size >= 1e-4:  # two significant figures show within four decimals: '0.0032', '0.15'
        return f"{value:,.{max(1 - math.floor(math.log10(size)), 0)}f}"
    # '1e-7' for 3.2e-08, after `bound`: 'below ' in a table's cell, where a number would be read as the value
    exponent = math.floor(math.log10(size))
    return f"{bound}1e{exponent if 10.0**exponent >= size else exponent + 1}"


def counted(n: int, noun: str) -> str:
    """ "1 thread", "2 threads": a count with its noun, never "thread(s)"."""
    return f"{n} {noun}{'s' if n != 1 else ''}"


WORDS = {
    "ddp": "DDP",
    "lr": "LR",
    "warmup": "warm-up",
    "ag": "AG",
    "news": "News",
    "imdb": "IMDB",
    "mib": "MiB",
    "powersgd": "PowerSGD",
}


def in_words(name: str) -> str:
    """A variant or dataset as a reader names it: "ag_news" -> "AG News", "300mbit" -> "300 Mbit/s"."""
    rate = re.fullmatch(r"(\d+)([kmg])bit", str(name))
    if rate:
        return f"{rate[1]} {rate[2].upper()}bit/s"
    return " ".join(WORDS.get(word, word) for word in str(name).split("_"))


# The headers several tables share, each defined once: a quantity in words with its unit.
STEP_MEDIAN_MS = "Step time, median of the repeats' medians (ms)"
LOWEST, HIGHEST = "lowest, over repeats", "highest, over repeats"  # a median's range, in the rows below it
FINAL_ACCURACY = "Final validation accuracy, median of the repeats"
MEAN_STEP_MS = "Step time, mean over the steady epochs (ms)"
ALLREDUCE_IN_FLIGHT_MS = "All-reduce in flight per step, mean (ms)"
# The rows several tables share: the median step with its range over the repeats, and (`step_part_rows`) the mean
# step with its parts in the rows below it.
STEP_RANGE_MS = {
    "step_time_s": (STEP_MEDIAN_MS, "{:.0f}", 1e3),
    "step_low_s": (f"{LOWEST} (ms)", "{:.0f}", 1e3),
    "step_high_s": (f"{HIGHEST} (ms)", "{:.0f}", 1e3),
}


def range_rows(quantity: str, fmt: str) -> dict[str, tuple]:
    """The rows below a median that give its range over the repeats: columns `<quantity>_low` and `_high`."""
    return {f"{quantity}_low": (LOWEST, fmt), f"{quantity}_high": (HIGHEST, fmt)}


def step_part_rows(fmt: str = "{:.0f}") -> dict[str, tuple]:
    """The mean step over the steady epochs and its parts (`comparisons.steady_phases`), in ms, in format `fmt`."""
    return {
        "mean_step_s": (MEAN_STEP_MS, fmt, 1e3),
        "compute_per_step_s": ("of which compute (ms)", fmt, 1e3),
        "comm_exposed_per_step_s": ("of which exposed all-reduce (ms)", fmt, 1e3),
    }


NUMBER = re.compile(r"(below )?[-+–]?\d|–$")  # a formatted number, a bound (`difference_text`), "–" for none


def markdown_table(cells: pd.DataFrame, index_name: str | None = None) -> str:
    """The one way the book's tables are written: formatted cells as Markdown, the first column naming each row.

    Columns of numbers are right-aligned, as numbers are read. Words stay left-aligned.
    """
    # The first column is the index, headed `index_name`, or else the first column of `cells`.
    if index_name is not None:
        cells = cells.rename_axis(index_name).reset_index()
    numbers = [i > 0 and all(NUMBER.match(str(cell)) for cell in cells[column]) for i, column in enumerate(cells)]
    return cells.to_markdown(
        index=False, disable_numparse=True, colalign=["right" if number else "left" for number in numbers]
    )


SIGNED_ZERO = re.compile(r"^[+-](0(?:\.0+)?%?)$")  # "-0%", "+0.00": a sign on a number that rounds to nothing


def _formatted(value, fmt: str, scale: float = 1) -> str:
    """A cell: the value in its format, "–" where there is none, and a zero without a sign ("-0%" reads "0%")."""
    return SIGNED_ZERO.sub(r"\1", fmt.format(value * scale)) if pd.notna(value) else "–"


# A table's quantities, the one spec of every table of numbers: each column of the DataFrame it shows -> (its header
# in words with its unit, its format, and a factor where the column's unit is not the header's, 1e3 for s to ms).
Quantities = dict[str, tuple]


def quantity_table(
    table: pd.DataFrame,
    quantities: Quantities,
    index_name: str | None = None,
    *,
    turned: bool = False,
    column_names: list[str] | None = None,
) -> str:
    """The one way a table of quantities is written: a row per row of `table` and a column per quantity.

    Turned, a wide table has a row per quantity, so it fits a page however many quantities it shows. An empty value,
    such as R_N of a run without an all-reduce, reads "–".
    """
    if table.empty:  # no rows, no table: LaTeX has no table of no rows
        return ""
    turned_cells = pd.DataFrame(
        [[_formatted(value, *spec[1:]) for value in table[column]] for column, spec in quantities.items()],
        index=[spec[0] for spec in quantities.values()],
        columns=table.index,
    )
    if not turned:
        return markdown_table(turned_cells.T, index_name)
    turned_cells.columns = column_names or [in_words(name) for name in table.index]  # a study's variants, in words
    return markdown_table(turned_cells, "")
