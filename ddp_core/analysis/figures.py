"""What the book's accuracy plots draw beside the runs: the accuracy of guessing, to read a run's against."""

from __future__ import annotations


def chance_line(ax, num_classes: int) -> None:
    """A dotted line at the accuracy of a uniform guess on balanced classes, with its legend entry."""
    ax.axhline(1 / num_classes, color="gray", linestyle=":", linewidth=1, label=f"chance (1/{num_classes})")
