"""What the book's accuracy plots draw beside the runs: the accuracy of guessing, against which a run's is read."""

from __future__ import annotations


def chance_line(ax, num_classes: int) -> None:
    """A dotted line at 1 / classes, the accuracy of a uniform guess on balanced classes, and its legend entry."""
    ax.axhline(1 / num_classes, color="gray", linestyle=":", linewidth=1, label=f"chance (1/{num_classes})")
