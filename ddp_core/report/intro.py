"""The book's first page: what was measured on what, the speedups, and when DDP pays. Reads an `Experiment`;
offers `findings` for the page's glue, the headline of the chapters that derive each number."""

from __future__ import annotations

from pathlib import Path

from ddp_core.report import gpu, time_to_accuracy
from ddp_core.report.single_device import ratio_findings
from ddp_core.report.nodes import configurations_markdown, headline_findings, nodes_figure
from ddp_core.report.comparisons import speedup_comparisons, speedup_glue
from ddp_core.report.discussion import payoff_findings
from ddp_core.report.results import Experiment, Measurement, load_experiment, load_measurements, load_study
from ddp_core.report.scaling import scaling_table
from ddp_core.report.tables import in_words
from ddp_core.studies.study_list import load_study_list


def key_findings(results: Path) -> dict:
    """The main result of each chapter the first page leads with, from the studies in `results`: the results
    chapter's runs, the emulated nodes (`nodes_`), the GPU (`gpu_`), time to accuracy (`tta_`), the One device
    chapter's ratios (`device_`) and the list of studies."""
    scaling, nodes = load_experiment(results / "scaling"), load_study(results / "nodes")
    return (findings(scaling) | headline_findings(nodes) | gpu.headline_findings(results, nodes)
            | studies_findings(load_study_list()) | time_to_accuracy.findings(load_study(results / "time_to_accuracy"))
            | one_device_findings(load_measurements(results / "single_device"), scaling))


def one_device_findings(measurements: list[Measurement], scaling: Experiment) -> dict:
    """The One device chapter's ratios on the device the results chapter's runs had, or on the first one measured."""
    same = [m for m in measurements if m.info["device_name"] == scaling.baseline.device_name]
    return ratio_findings((same or measurements)[0])


def headline_figure(results: Path):
    """The emulated nodes' figure, also saved as a file of its own for the README: each build of the book writes
    it into the project's `_build/`, and `make reference` keeps it beside the reference results."""
    figure = nodes_figure(load_study(results / "nodes"))
    path = results.parents[1] / "_build" / "headline.png"
    path.parent.mkdir(exist_ok=True)
    figure.savefig(path, dpi=100)
    return figure


def configurations_table(results: Path) -> str:
    """Each configuration the emulated nodes modelled, with the efficiency they measured."""
    return configurations_markdown(load_study(results / "nodes"))


def findings(experiment: Experiment) -> dict:
    table = scaling_table(experiment)
    one = experiment.baseline
    payoff = payoff_findings(experiment)
    return {
        "preset": one.config["preset"], "parameters": one.parameters, "dataset": in_words(one.config["dataset"]),
        "global_batch": one.global_batch_size, "device": one.device_name, "cpu_count": one.cpu_count,
        "backend": one.backend,
        "efficiencies": " and ".join(f"{table.loc[n, 'efficiency']:.0%} at {n} ranks" for n in table.index if n > 1),
        "largest": experiment.largest,
        **speedup_glue("speedup_nmax", speedup_comparisons(experiment)[experiment.largest]),
        "shared": "every rank ran on a GPU of its own" if one.on_gpu else
        f"all ranks shared the same {one.cpu_count} CPU cores, so adding ranks added no compute",
    } | {key: payoff[key] for key in ("ideal_consequence", "ratio_n_model", "break_even_ratio", "n_model")}


def studies_findings(studies: dict) -> dict:
    """The studies beyond the results chapter's (`scaling`), from the study list itself: the overview the first page
    gives can then never leave one out."""
    titles = [study.title for name, study in studies.items() if name != "scaling"]
    return {"study_count": len(titles), "study_titles": "; ".join(titles)}
