"""Where and how the runs were made, for the set-up and methods chapters, and each run page's own summary.

Records such as `Whose` and `StudySetup` feed the pages' findings, and the `*_markdown` functions their tables.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.engine.config import load_profile
from ddp_core.analysis.comparisons import WARMUP_STEPS, median_step, out_of_line, study_floor_power
from ddp_core.analysis.results import (
    NOT_SETTINGS,
    Experiment,
    book_results_folder,
    disturbed,
    load_study,
    machine_use,
    read_run,
    read_steps,
)
from ddp_core.analysis.figures import chance_line
from ddp_core.analysis.tables import commit_text, counted, day, in_words, machine_text, markdown_table, quantity_table
from ddp_core.launch.plan import WIND_TUNNEL_FOLDER

# run.json's provenance in the reader's words (settings keep their command-line names); the platform string
# and the end time are left out: they would not fit a page (the run order table gives the start times).
PROVENANCE = {
    "world_size": "Ranks",
    "backend": "Backend",
    "device": "Device",
    "device_name": "Processor",
    "cpu_extensions": "Vector and matrix extensions",
    "cpu_count": "Cores on the machine",
    "threads_per_rank": "Threads per rank",
    "hostname": "Host",
    "python": "Python",
    "torch": "PyTorch",
    "cuda": "CUDA",
    "nccl": "NCCL",
    "gpu_driver": "GPU driver",
    "git_commit": "Code commit",
    "parameters": "Model parameters",
    "start_time": "Started (UTC)",
}


def shown_folder(experiment: Experiment) -> tuple[str, str]:
    """Where the shown runs are, relative to the project when they lie in it, and what they are."""
    folder = experiment.folder.resolve()
    try:
        folder = folder.relative_to(book_results_folder().parents[1])
    except ValueError:
        return str(folder), "runs made outside this project"
    return str(folder), (
        "the reference results shipped with the report, made by the project's study runner (make reference)"
        if folder.parts[0] == "reference"
        else "runs made in this project, by make report or by hand"
    )


def origin(folder: Path) -> str:
    """Whose results a folder of book/results links to: "the shipped reference" (reference/) or "yours"."""
    return "the shipped reference" if "reference" in folder.resolve().parts else "yours"


@dataclass(frozen=True)
class Whose:
    """Whose runs a page shows, when and on what, for the page's first line."""

    whose: str  # "yours" or "the shipped reference"
    made_when: str
    made_on: str  # "4 NVIDIA A100 GPUs", or a CPU with its cores


def runs_shown(*experiments: Experiment) -> Whose:
    """`Whose` of every run of `experiments`."""
    runs = [run for experiment in experiments for run in experiment.all_runs]
    origins = sorted({origin(experiment.folder) for experiment in experiments})
    days = sorted({day(run.raw["start_time"]) for run in runs})
    largest = max(run.world_size for run in runs)
    machines = sorted(
        {
            f"{counted(largest, run.device_name + ' GPU')}"
            if run.on_gpu
            else f"{machine_text(run.raw)}, {counted(run.cpu_count, 'core')}"
            for run in runs
        }
    )
    return Whose(
        whose=" and ".join(origins),
        made_when=days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}",
        made_on="; ".join(machines),
    )


@dataclass(frozen=True)
class Made:
    """When and on what every result the book shows was made: the days, first to last, and each machine."""

    days: str
    machines: str


def made(results: Path) -> Made:
    """`Made` of each run's run.json and each benchmark's device.json in `results`.

    Each machine is named with its cores, since the studies and the benchmarks need not share one.
    """
    infos = [
        json.loads(path.read_text())
        for pattern in ("*/*/run.json", "*/*/*/run.json", "*/*/device.json")
        for path in results.glob(pattern)
    ]  # a device's folder of a benchmark is a link, which ** does not follow
    days = sorted({day(info.get("start_time") or info["measured_on"]) for info in infos})  # a profile: measured_on
    machines = sorted(
        {
            machine_text(info)
            if str(info.get("device")).startswith("cuda")
            else f"{machine_text(info)}, {counted(info['cpu_count'], 'core')}"
            for info in infos
        }
    )
    return Made(days=days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}", machines="; ".join(machines))


def _shown(key: str, value, on_gpu: bool = False) -> str:
    if value is None:  # a GPU run whose driver was not recorded (made before it was, or without nvidia-smi)
        return "unknown" if key == "gpu_driver" and on_gpu else "none"
    if key == "git_commit":
        return commit_text(value)
    if key == "cpu_extensions":
        return ", ".join(f"`{name}`" for name in value) or "none of AVX2, AVX-512, AMX"
    if key.endswith("_time"):
        return value[:19].replace("T", " ")
    return f"{value:,}" if key == "parameters" else str(value)


def _resolved(run, key: str, value):
    """A setting as the run resolved it: its dropout from the preset, its batch sizes from the world size."""
    if key == "dropout" and value is None:
        return run.model["dropout"]
    if key in ("global_batch_size", "per_rank_batch_size"):
        return run.raw[key]
    return value


def _by_run(experiment: Experiment) -> dict[str, dict[str, str]]:
    """Every run's provenance in words and its settings under their command-line names: run name -> {label: value}."""
    return {
        run.name: {label: _shown(key, run.raw.get(key), run.on_gpu) for key, label in PROVENANCE.items()}
        | {
            f"`--{key.replace('_', '-')}`": _shown(key, _resolved(run, key, value))
            for key, value in run.config.items()
            if key not in NOT_SETTINGS and key not in PROVENANCE
        }
        for run in experiment.all_runs
    }


def shared_markdown(experiment: Experiment) -> str:
    """What every run had in common, hardware, software and settings alike, one row each."""
    records = pd.DataFrame(_by_run(experiment))  # a row per label, a column per run
    shared = records[records.nunique(axis=1, dropna=False) == 1].iloc[:, 0]
    return markdown_table(shared.rename("every run").to_frame(), "")


def per_run_markdown(experiment: Experiment) -> str:
    """What differed between the runs, one row per run: a table that fits however many runs."""
    records = pd.DataFrame(_by_run(experiment)).T
    return markdown_table(records.loc[:, records.nunique() > 1], "run")


def run_markdown(info: dict) -> str:
    """What one run was, from its run.json, a row per item, with what else the machine did where recorded."""
    use = machine_use(info)
    items = {
        "Ranks": counted(info["world_size"], "rank"),
        "Backend": info["backend"],
        "Device": info["device_name"],
        "PyTorch": info["torch"],
        "Parameters": f"{info['parameters']:,}",
        "Started (UTC)": info["start_time"][:19].replace("T", " "),
    }
    if use:
        items |= {
            "Other processes while it trained (cores)": f"{use['other_cores']:.2f} of {use['cores']}",
            "Taken by the hypervisor (% of the cores)": f"{use['stolen']:.1%}",
        }
    return markdown_table(pd.Series(items, name="this run").to_frame(), "")


RUN_EPOCH_COLUMNS = {
    "epoch_time_s": ("Epoch time (s)", "{:.2f}"),
    "samples_per_s": ("Throughput (samples/s)", "{:.1f}"),
    "train_loss": ("Training loss", "{:.4f}"),
    "val_loss": ("Validation loss", "{:.4f}"),
    "val_accuracy": ("Validation accuracy", "{:.4f}"),
    "peak_memory_mb": ("Peak memory (MiB)", "{:,.0f}"),
}


def run_epochs_markdown(metrics: pd.DataFrame) -> str:
    """One run's epochs, a row each, with headers in words and units."""
    return quantity_table(metrics.set_index("epoch"), RUN_EPOCH_COLUMNS, "Epoch")


def learning_curves_figure(metrics: pd.DataFrame, num_classes: int):
    """One run's loss and validation accuracy per epoch, the accuracy beside chance."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9, 3.2))
    loss_ax.plot(metrics["epoch"], metrics["train_loss"], "o-", label="train")
    loss_ax.plot(metrics["epoch"], metrics["val_loss"], "s-", label="validation")
    loss_ax.set(xlabel="epoch", ylabel="cross-entropy loss", title="Loss")
    acc_ax.plot(metrics["epoch"], metrics["val_accuracy"], "s-", color="C2", label="validation")
    chance_line(acc_ax, num_classes)
    acc_ax.set(xlabel="epoch", ylabel="accuracy", title="Validation accuracy")
    for ax in (loss_ax, acc_ax):
        ax.legend()
        ax.set_xticks(metrics["epoch"])
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class StudySetup:
    """Where a study's runs ran and what they are, for the sentence in which every study page states its limits."""

    runs: str
    repeats: str
    epochs: str
    device: str
    cores: int
    backend: str
    torch: str
    shown: str
    whose: str
    made_when: str
    made_on: str


def study_setup(*experiments: Experiment) -> StudySetup:
    """`StudySetup` of every run of `experiments`."""
    runs = [run for experiment in experiments for run in experiment.all_runs]
    first = runs[0].raw
    epochs = sorted({int(epoch) for e in experiments for epoch in e.metrics.groupby("run")["epoch"].max()})
    repeats = sorted({len(runs) for experiment in experiments for runs in experiment.repeats.values()})
    return StudySetup(
        runs=counted(len(runs), "run"),
        repeats=" to ".join(map(str, repeats)),
        epochs=" to ".join(map(str, epochs)) + (" epoch" if epochs == [1] else " epochs"),
        device=first["device_name"],
        cores=first["cpu_count"],
        backend=first["backend"],
        torch=first["torch"],
        shown=" and ".join(sorted({shown_folder(experiment)[1] for experiment in experiments})),
        **asdict(runs_shown(*experiments)),
    )


def _span(values) -> str:
    """'256' or '256 to 768' (a setting over a study's variants); 'all' for a setting left at the whole split."""
    values = list(values)
    if any(v is None for v in values):
        return "all"
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"


# What the benchmarks' results are, as their pages title them (book/_ext's MEASUREMENTS and BENCHMARK_RUNS).
BENCHMARK_TITLES = {
    "cpu_period": "the CPU quota period (emulated nodes)",
    "gpu_trainer": "the trainer on a GPU",
    "gpu_timeline": "a GPU's step timeline",
    "single_device": "throughput on one device",
    "peers": "DDP against other loops",
    "step_profile": "a step by operator",
}


@dataclass(frozen=True)
class ResultsFrom:
    """The results the book shows, by whether they were made here or shipped in `reference/`.

    Each is a list of titles, or "none".
    """

    here: str
    reference: str


def results_shown(results: Path, studies: dict) -> ResultsFrom:
    """`ResultsFrom` of every folder of `results`, by title."""
    # book/results holds a study, a benchmark's runs, or a folder of measured devices, one link each.
    shown = {"here": [], "reference": []}
    order = {name: i for i, name in enumerate(studies)}  # the studies as the study list gives them, then by name
    for entry in sorted(results.iterdir(), key=lambda e: (order.get(e.name, len(order)), e.name)):
        title = studies[entry.name].title if entry.name in studies else BENCHMARK_TITLES.get(entry.name, entry.name)
        for part in [entry] if entry.is_symlink() else sorted(entry.iterdir()):
            name = title if part == entry else f"{title} ({in_words(part.name)})"
            shown["reference" if "reference" in part.resolve().parts else "here"].append(name)
    return ResultsFrom(**{origin: ", ".join(names) or "none" for origin, names in shown.items()})


def studies_overview_markdown(studies: dict) -> str:
    """One row per study of the list: what it varies, over which ranks and how many runs."""
    rows = []
    for study in studies.values():
        varies = (
            ", ".join(in_words(v.name) for v in study.variants)
            or ", ".join(
                f"{k.replace('_', ' ')} {v}"
                for k, v in study.variants[0].settings.items()
                if v is not None and k not in ("train_samples", "epochs")
            )
            or "ranks only"
        )
        ranks = sorted({n for v in study.variants for n in v.world_sizes})
        settings = [load_profile(study.profile) | v.settings for v in study.variants]
        rows.append(
            {
                "Study": study.title,
                "Variants or settings": varies,
                "Ranks": ", ".join(map(str, ranks)),
                "Runs": len(study.runs()),
                "Training samples": _span(s.get("train_samples") for s in settings),
                "Epochs": _span(s.get("epochs", 1) for s in settings),
            }
        )
    return markdown_table(pd.DataFrame(rows))


def quiet_machine_table(results: Path, studies: dict) -> pd.DataFrame:
    """Per study, what else the machine did while its runs trained, and which runs that disturbed.

    It also names the runs their own repeats call out of line, with their step over the repeats' median.
    """
    rows = []
    for name, study in studies.items():
        uses = []
        for run_dir in sorted(
            path.parent
            for path in (results / name).glob("**/run.json")
            if WIND_TUNNEL_FOLDER not in path.relative_to(results).parts
        ):  # the nodes page's
            _, info = read_run(run_dir)
            use, run = machine_use(info), run_dir.relative_to(results / name)
            if use is not None:
                uses.append(
                    use
                    | {
                        "run": run.as_posix(),
                        # On an emulated cluster the kernel's work for the links counts as other processes, so the
                        # limit is higher; the nodes study also checks each node's CPU share.
                        "disturbed": disturbed(info),
                        "configuration": f"{run.parent}/{info['world_size']}",
                        "step_time_s": median_step(read_steps(run_dir)["step_time_s"]),
                    }
                )
        if not uses:
            continue
        table = pd.DataFrame(uses)
        table["out_of_line"] = out_of_line(table["step_time_s"], table["configuration"])
        rows.append(
            {
                "study": study.title + (" (emulated nodes)" if study.ranks_per_node else ""),
                "runs": len(table),
                "other_median": table["other_cores"].median(),
                "other_most": table["other_cores"].max(),
                "stolen_most": table["stolen"].max(),
                "disturbed": ", ".join(f"`{run}`" for run in table.loc[table["disturbed"], "run"]) or "none",
                "out_of_line": ", ".join(
                    f"`{row.run}` ({row.out_of_line:.2f}×)" for row in table.dropna(subset=["out_of_line"]).itertuples()
                )
                or "none",
            }
        )
    return pd.DataFrame(rows).set_index("study")


QUIET_MACHINE_COLUMNS = {
    "runs": ("Runs", "{:.0f}"),
    "other_median": ("Cores other processes used, median of the runs", "{:.2f}"),
    "other_most": ("Cores other processes used, most", "{:.2f}"),
    "stolen_most": ("Share of the cores the hypervisor took, most", "{:.1%}"),
    "disturbed": ("Runs counted as disturbed", "{}"),
    "out_of_line": ("Runs out of line with their repeats (their step over the repeats' median)", "{}"),
}


def quiet_machine_markdown(results: Path, studies: dict) -> str:
    return quantity_table(quiet_machine_table(results, studies), QUIET_MACHINE_COLUMNS, "Study")


FLOOR_POWER_COLUMNS = {
    "steps": (f"Steps a run, median (its time: the median of those after the first {WARMUP_STEPS})", "{:.0f}"),
    "degrees": ("Degrees of freedom", "{:.0f}"),
    "floor": ("Noise floor of the time per sample", "{:.1%}"),
    "identical_called": ("Identical configurations called different", "{:.1%}"),
    "found_10": ("A 10% effect found", "{:.0%}"),
    "found_20": ("A 20% effect found", "{:.0%}"),
}


def floor_power_markdown(results: Path, studies: dict) -> str:
    """Per study, the steps its runs time, its time floor, and what the rule can tell against it."""
    rows = {}
    for name, study in studies.items():
        experiments = load_study(results / name)
        steps = pd.concat([e.metrics.groupby("run")["steps"].sum() for e in experiments.values()])
        rows[study.title] = {"steps": steps.median(), **study_floor_power(experiments)}
    return quantity_table(pd.DataFrame(rows).T, FLOOR_POWER_COLUMNS, "Study")
