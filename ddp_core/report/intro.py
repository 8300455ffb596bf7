"""The book's first page: what was measured on what, the speedups, and when DDP pays. Reads an `Experiment`;
offers `findings` for the page's glue, the headline of the chapters that derive each number."""

from __future__ import annotations

from ddp_core.report.discussion import payoff_findings, verdict_sentence
from ddp_core.report.results import Experiment
from ddp_core.report.scaling import scaling_table
from ddp_core.report.tables import in_words


def findings(experiment: Experiment) -> dict:
    table = scaling_table(experiment)
    one = experiment.baseline
    payoff = payoff_findings(experiment)
    return {
        "preset": one.config["preset"], "parameters": one.parameters, "dataset": in_words(one.config["dataset"]),
        "global_batch": one.global_batch_size, "device": one.device_name, "cpu_count": one.cpu_count,
        "backend": one.backend,
        "efficiencies": " and ".join(f"{table.loc[n, 'efficiency']:.0%} at {n} ranks" for n in table.index if n > 1),
        "verdict": verdict_sentence(experiment),
        "shared": "every rank ran on a GPU of its own" if one.on_gpu else
        f"all ranks shared the same {one.cpu_count} CPU cores, so adding ranks added no compute",
    } | {key: payoff[key] for key in ("ideal_consequence", "ratio_n_model", "break_even_ratio", "n_model")}
