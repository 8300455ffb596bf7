"""Everything the report reads, and the one error it raises when it cannot: `ResultsError`.

An experiment is a folder of runs that differ in world size, with their all-reduce benchmarks. A study is an experiment
per variant. A single-device measurement is a folder per device.

    experiment = load_experiment("results/report")
    experiment.runs[4].threads_per_rank, experiment.repeats[4], experiment.metrics, experiment.allreduce[4]

Everything the book shows is computed from these. Modules with a command line read them through `run_on_folder`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from statistics import median

import pandas as pd

from ddp_core.engine.run_files import LINK_COLUMNS, METRICS_COLUMNS, NOISE_COLUMNS, STATE_COLUMNS, STEPS_COLUMNS
from ddp_core.engine.wind_tunnel_file import LinkChoice, ModelledVariant, read_wind_tunnel

# Settings that say where a run kept its files or how it was started, not what it trained.
NOT_SETTINGS = ("out", "data_dir", "cache_dir", "check", "progress", "resume")
# From run.json besides the settings: where and with what a run ran.
RUN_COLUMNS = ("backend", "device_name", "threads_per_rank", "parameters", "torch", "git_commit")


class ResultsError(Exception):
    """A results folder that cannot be analysed; the message names the file and the reason."""


@dataclass(frozen=True)
class RunInfo:
    """A run's run.json: the fields the analysis uses, and the whole file for provenance tables."""

    name: str
    world_size: int
    local_world_size: int
    backend: str
    device: str
    device_name: str
    cpu_count: int
    threads_per_rank: int
    parameters: int
    per_rank_batch_size: int
    global_batch_size: int
    model: dict
    config: dict
    raw: dict

    @classmethod
    def from_json(cls, name: str, info: dict) -> RunInfo:
        return cls(name=name, raw=info, **{f.name: info[f.name] for f in fields(cls) if f.name not in ("name", "raw")})

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def ranks_on_machine(self) -> int:
        """The ranks that share this run's machine: the node's, or every rank of an emulated cluster."""
        return self.world_size if "network" in self.raw else self.local_world_size

    @property
    def sharding(self) -> str:
        """The sharding mode: "none" (DDP) for runs made before there were others."""
        return self.config.get("sharding", "none")

    @property
    def sharded(self) -> bool:
        return self.sharding != "none"

    @property
    def tokens_per_rank(self) -> int:
        """Tokens in one forward pass of one rank, padding included."""
        return self.per_rank_batch_size * self.model["max_len"]


OTHER_CORES = 0.1  # cores that other processes used, on average, while a run on shared cores trained: more disturbs it
# On emulated nodes the kernel's link work and the launcher count as other processes. On the reference's quiet machine
# they used at most 0.45 of a core: reference/cpu_period, 4 unshaped nodes at 5 ms. The nodes study used at most 0.27.
# Two busy processes beside a cluster add about a core, which slows the nodes' work outside their quotas.
EMULATED_OTHER_CORES = 0.6
STOLEN = 0.02  # of the machine's cores taken by the hypervisor while a run trained: more, and the run is disturbed
OUT_OF_LINE = 1.5  # a run whose median step is this many times its repeats' median, or 1/this of it, is out of line


def machine_use(info: dict) -> dict | None:
    """What else the machine did while a run trained, from run.json's `machine`, or None where it was not recorded.

    It gives the cores other processes used on average, and the share of the cores the hypervisor took.
    """
    machine = info.get("machine")
    if not machine:
        return None
    return {
        "cores": machine["cores"],
        "other_cores": machine["other_cpu_s"] / machine["wall_s"],
        "stolen": machine["steal_cpu_s"] / (machine["wall_s"] * machine["cores"]),
    }


def disturbed(info: dict) -> bool:
    """Whether the machine did more beside a run than a quiet machine does; False where that was not recorded."""
    # More: the hypervisor took more than STOLEN, or other processes used more than OTHER_CORES, or on emulated nodes
    # EMULATED_OTHER_CORES.
    use = machine_use(info)
    limit = EMULATED_OTHER_CORES if "network" in info else OTHER_CORES
    return use is not None and (use["stolen"] > STOLEN or use["other_cores"] > limit)


SHARE_GOT = 0.95  # a node that computes all the time (one node alone) uses at least this much of its share


def shares_used(info: dict) -> list[float]:
    """Each emulated node's CPU use over its quota periods, against its share: 1 for a node that computed all the time.

    It is empty for a run without CPU shares.
    """
    network = info.get("network") or {}
    period_s = network.get("cpu_period_ms", 0) / 1e3
    return [
        node["cpu_s"] / (node["periods"] * period_s) / network["cpus_per_node"]
        for node in network.get("node_cpu") or []
    ]


def node_disturbed(info: dict) -> bool:
    """`disturbed`, or a one-node run whose node got less than SHARE_GOT of its CPU share and so computed less.

    Only one-node runs are checked, since with several nodes a node also waits for the network inside its periods.
    """
    used = shares_used(info)
    return disturbed(info) or (info.get("network", {}).get("nodes") == 1 and bool(used) and min(used) < SHARE_GOT)


@dataclass
class Experiment:
    folder: Path
    metrics: pd.DataFrame  # every epoch of every run; column `run` names the run
    steps: pd.DataFrame  # every optimizer step of every run, the same way
    repeats: dict[int, list[RunInfo]]  # every run by world size, ascending, each list by seed
    allreduce: dict[int, pd.DataFrame]  # all-reduce benchmarks by world size

    @property
    def runs(self) -> dict[int, RunInfo]:
        """The first run (lowest seed) of each world size: what the settings and provenance are read from."""
        return {n: runs[0] for n, runs in self.repeats.items()}

    @property
    def all_runs(self) -> list[RunInfo]:
        return [run for runs in self.repeats.values() for run in runs]

    @property
    def baseline(self) -> RunInfo:
        return self.runs[min(self.runs)]

    @property
    def largest(self) -> int:
        return max(self.runs)


def book_results_folder() -> Path:
    """The results the book shows: `book/results` in the project that holds the current directory.

    It holds a link per study to its runs, made at each build by book/_ext.
    """
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "_config.yml").is_file() and (folder / "book").is_dir():
            return folder / "book" / "results"
    raise ResultsError(f"{here}: not inside the report's project (no _config.yml with a book/ folder above it)")


def last_epochs(metrics: pd.DataFrame) -> pd.DataFrame:
    """Each run's last epoch, indexed by run: of each column, its last value."""
    return metrics.sort_values("epoch").groupby("run").last()


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: unreadable CSV ({str(exc).strip()})") from None


def read_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    # a run is a subfolder with metrics.csv, run.json and steps.csv
    metrics_path, info_path = run_dir / "metrics.csv", run_dir / "run.json"
    for path in (metrics_path, info_path):
        if not path.is_file():
            raise ResultsError(f"{path}: missing")
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{info_path}: not valid JSON ({exc})") from None
    needed = [f.name for f in fields(RunInfo) if f.name not in ("name", "raw")]
    missing = [key for key in needed if not isinstance(info, dict) or key not in info]
    if missing:
        raise ResultsError(f"{info_path}: not a run's record (missing {', '.join(missing)})")
    metrics = _read_csv(metrics_path)
    if "resumes" not in metrics.columns:  # written before epochs could resume mid-way: none did
        metrics["resumes"] = 0
    unmeasured = NOISE_COLUMNS + STATE_COLUMNS + LINK_COLUMNS  # NaN where the run could not measure them
    for column in set(unmeasured) - set(metrics.columns):  # older runs
        metrics[column] = float("nan")
    missing = [c for c in METRICS_COLUMNS if c not in metrics.columns]
    if missing:
        raise ResultsError(f"{metrics_path}: missing column(s) {', '.join(missing)}")
    if metrics.empty:
        raise ResultsError(f"{metrics_path}: no completed epoch")
    if info["world_size"] > 1 and info.get("allreduces_per_step", 0) is None:
        unmeasured += ["comm_total_s", "comm_exposed_s"]  # FSDP2's collectives, which no DDP hook times
    measured = [c for c in METRICS_COLUMNS if c not in unmeasured]
    metrics[METRICS_COLUMNS] = metrics[METRICS_COLUMNS].apply(pd.to_numeric, errors="coerce")  # a word: NaN
    if metrics[measured].isna().any().any() and info["config"].get("timers", True):
        raise ResultsError(f"{metrics_path}: empty or non-numeric values")
    network = run_dir / "network.json"  # a run on an emulated cluster: its nodes and link
    if network.is_file():
        info = info | {"network": json.loads(network.read_text())}
    return metrics.assign(run=run_dir.name), info


def read_steps(run_dir: Path) -> pd.DataFrame:
    """A run's steps.csv, with the run's name in column `run`."""
    path = run_dir / "steps.csv"
    if not path.is_file():
        raise ResultsError(f"{path}: missing (runs made before per-step times were kept: train them again)")
    steps = _read_csv(path)
    timed = [column for column in STEPS_COLUMNS if column != "comm_exposed_s"]  # empty under FSDP2, as metrics.csv's
    if list(steps.columns) != STEPS_COLUMNS or steps.empty or steps[timed].isna().any().any():
        raise ResultsError(f"{path}: not the steps of a run (columns {', '.join(STEPS_COLUMNS)}, a row per step)")
    return steps.assign(run=run_dir.name)


def read_allreduce(folder: Path) -> dict[int, pd.DataFrame]:
    """Benchmarks by world size, from `allreduce-n*/allreduce.csv` under an experiment folder."""
    found = {}
    for path in sorted(folder.glob("allreduce-n*/allreduce.csv")):
        bench = pd.read_csv(path)
        if bench.empty or not {"size_bytes", "time_s", "world_size"} <= set(bench.columns):
            raise ResultsError(f"{path}: not an all-reduce benchmark (columns or rows missing)")
        found[int(bench["world_size"].iloc[0])] = bench
    return found


def load_experiment(folder: str | Path) -> Experiment:
    """Every run under `folder`, by world size (repeats differ in seed), and the all-reduce benchmarks beside them."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such results folder")
    run_dirs = sorted(p for p in folder.iterdir() if p.is_dir() and (p / "run.json").exists())
    orphan = next((p for p in folder.iterdir() if (p / "metrics.csv").exists() and p not in run_dirs), None)
    if orphan:
        raise ResultsError(
            f"{orphan / 'run.json'}: missing (a run's metrics without its record: restore it, or move the folder away)"
        )
    if not run_dirs:
        raise ResultsError(f"{folder}: holds no run (no subfolder with run.json)")
    frames, step_frames, repeats = [], [], {}
    for run_dir in run_dirs:
        metrics, info = read_run(run_dir)
        step_frames.append(
            read_steps(run_dir).assign(world_size=info["world_size"], global_batch_size=info["global_batch_size"])
        )
        run = RunInfo.from_json(run_dir.name, info)
        same = [other for other in repeats.get(run.world_size, []) if other.config["seed"] == run.config["seed"]]
        if same:
            raise ResultsError(
                f"{folder}: runs {same[0].name} and {run.name} both have world size {run.world_size} "
                f"and seed {run.config['seed']}; repeats of a world size differ in seed"
            )
        frames.append(metrics)
        repeats.setdefault(run.world_size, []).append(run)
    return Experiment(
        folder,
        pd.concat(frames, ignore_index=True),
        pd.concat(step_frames, ignore_index=True),
        {n: sorted(runs, key=lambda r: r.config["seed"]) for n, runs in sorted(repeats.items())},
        read_allreduce(folder),
    )


def joined(*experiments: Experiment) -> Experiment:
    """Several experiments' runs as one, so that speedups can be taken against a study's 1-rank variant.

    Their world sizes must differ.
    """
    repeats = {n: runs for e in experiments for n, runs in e.repeats.items()}
    if len(repeats) < sum(len(e.repeats) for e in experiments):
        raise ResultsError("joined experiments share a world size")
    return Experiment(
        experiments[-1].folder,
        pd.concat([e.metrics for e in experiments], ignore_index=True),
        pd.concat([e.steps for e in experiments], ignore_index=True),
        dict(sorted(repeats.items())),
        {n: bench for e in experiments for n, bench in e.allreduce.items()},
    )


def only(experiment: Experiment, n: int) -> Experiment:
    """An experiment's runs at world size n alone: e.g. what a study measures at its most nodes."""
    names = {run.name for run in experiment.repeats[n]}
    return Experiment(
        experiment.folder,
        experiment.metrics[experiment.metrics["run"].isin(names)],
        experiment.steps[experiment.steps["run"].isin(names)],
        {n: experiment.repeats[n]},
        {size: bench for size, bench in experiment.allreduce.items() if size == n},
    )


def load_study(folder: str | Path) -> dict[str, Experiment]:
    """A study's experiments by variant, in the order the variants first ran, which is the study list's.

    A folder that itself holds runs is the one variant "". Else each subfolder with runs is one.
    """
    folder = Path(folder)
    if folder.is_dir() and any((p / "run.json").exists() for p in folder.iterdir() if p.is_dir()):
        return {"": load_experiment(folder)}
    # the wind tunnel's measurements beside the variants are not variants
    found = {p.name for p in folder.iterdir() if p.is_dir() and any(p.glob("*/run.json"))} if folder.is_dir() else set()
    if not found:
        raise ResultsError(f"{folder}: no runs of this study (run it: make report STUDIES={folder.name})")
    experiments = {name: load_experiment(folder / name) for name in found}
    first_ran = {name: min(run.raw["start_time"] for run in e.all_runs) for name, e in experiments.items()}
    return {name: experiments[name] for name in sorted(found, key=lambda name: (first_ran[name], name))}


def study_tables(folder: Path, studies: list[str]) -> pd.DataFrame:
    """Every run of every study under `folder` as one tidy table, the study and variant first."""
    tables = [
        tidy_runs(experiment).assign(study=name, variant=variant)
        for name in studies
        for variant, experiment in load_study(folder / name).items()
    ]
    return pd.concat([t[["study", "variant", *t.columns[:-2]]] for t in tables], ignore_index=True)


def tidy_runs(experiment: Experiment) -> pd.DataFrame:
    """One row per run and epoch: the epoch's metrics, then the run's settings and where it ran.

    A setting named like a metric gets the suffix `_setting`, and the metric holds what the epoch did.
    """
    # e.g. the subset `train_samples`, or a weak-scaling run's empty `global_batch_size`
    per_run = pd.DataFrame(
        [
            {"run": run.name}
            | {
                key + ("_setting" if key in METRICS_COLUMNS else ""): value
                for key, value in run.config.items()
                if key not in NOT_SETTINGS and key not in RUN_COLUMNS
            }
            | {key: run.raw.get(key) for key in RUN_COLUMNS}
            for run in experiment.all_runs
        ]
    )
    return experiment.metrics.merge(per_run, on="run")[["run", *METRICS_COLUMNS, *per_run.columns[1:]]]


@dataclass(frozen=True)
class Measurement:
    """One device's measurement by `benchmarks/single_device.py`: its device.json and epochs.csv."""

    name: str
    info: dict
    epochs: pd.DataFrame


def read_device_files(folder: str | Path, table: str, what: str) -> tuple[str, dict, pd.DataFrame]:
    """A benchmark's measurement of one device: the folder's name, which names the device, device.json and `table`.

    The benchmarks are single_device.py, peers and step_profile.
    """
    folder = Path(folder)
    try:
        return folder.name, json.loads((folder / "device.json").read_text()), pd.read_csv(folder / table)
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{folder}: not a finished {what} ({exc})") from None


def load_per_device(folder: str | Path, read) -> list:
    """`read` of every subfolder of `folder` that holds a device.json, a device each, the CPU ones first."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such results folder")
    found = [read(sub) for sub in sorted(folder.iterdir()) if (sub / "device.json").exists()]
    return sorted(found, key=lambda m: (not m.name.startswith("cpu"), m.name))


def read_measurement(folder: str | Path) -> Measurement:
    return Measurement(*read_device_files(folder, "epochs.csv", "single-device measurement"))


def load_measurements(folder: str | Path) -> list[Measurement]:
    return load_per_device(folder, read_measurement)


# The links of an emulated cluster's runs, as the pages name them


def rate_text(gbit_s: float) -> str:
    return f"{gbit_s:.3g} Gbit/s" if gbit_s >= 1 else f"{gbit_s * 1000:.3g} Mbit/s"


def link_choice(record: dict[str, ModelledVariant], variant: str, nodes: int) -> LinkChoice | None:
    """The links the wind tunnel chose for `variant` at `nodes` nodes, or None where it set none."""
    return record[variant].by_nodes.get(nodes) if variant in record else None


def link_label(experiment: Experiment) -> str:
    """What an experiment's links are set for, in a legend's or a table's words. Where the wind tunnel set them, the
    ratio at each number of nodes ("ratio 2.6", "ratio 5.1 at 2 nodes, 1.6 at 4"); else '1 Gbit/s' or 'unshaped'."""
    modelled = wind_tunnel_record(experiment.folder.parent).get(experiment.folder.name)
    if modelled:
        targets = [(n, choice.target_ratio) for n, choice in sorted(modelled.by_nodes.items())]
        if len(targets) == 1:
            return f"ratio {targets[0][1]:.2g}"
        return "ratio " + ", ".join(
            f"{target:.2g} at {n}" + (" nodes" if i == 0 else "") for i, (n, target) in enumerate(targets)
        )
    rate = next(run.raw["network"]["link_rate_gbit_s"] for run in experiment.all_runs if run.world_size > 1)
    return "unshaped" if rate is None else rate_text(rate)


def point_label(experiment: Experiment, nodes: int) -> str:
    """What an experiment's links were set for at `nodes` nodes: "ratio 5.1" where the wind tunnel set them."""
    choice = link_choice(wind_tunnel_record(experiment.folder.parent), experiment.folder.name, nodes)
    return f"ratio {choice.target_ratio:.2g}" if choice else link_label(experiment)


def borrowed_from(experiment: Experiment) -> str:
    """The real cluster whose compute-to-communication ratio the wind tunnel set an experiment's links to, or ""."""
    modelled = wind_tunnel_record(experiment.folder.parent).get(experiment.folder.name)
    return modelled.configuration if modelled else ""


def wind_tunnel_record(study_folder: Path) -> dict[str, ModelledVariant]:
    """The variants of a study whose links the wind tunnel set, by name; none: {}."""
    record = read_wind_tunnel(study_folder)
    return record.variants if record else {}


def forecast(choice: LinkChoice | None) -> dict:
    """A variant's forecast at N nodes: the median over its rounds of each round's step and speedup over its one node.

    It is {} before any forecast, or where the wind tunnel set no links.
    """
    rounds = pd.DataFrame(choice.forecasts if choice else [])
    if rounds.empty:
        return {}
    return {"step_s": rounds["step_s"].median(), "speedup": (rounds["one_node_step_s"] / rounds["step_s"]).median()}


def measured_gbit_s(experiment: Experiment) -> float:
    """The median of the link rates measured before each multi-node run of the experiment."""
    return float(median(run.raw["network"]["measured_gbit_s"] for run in experiment.all_runs if run.world_size > 1))


def run_on_folder(prog: str, report, load=load_experiment) -> int:
    """`python -m PROG RESULTS_FOLDER`: `report(load(folder))` prints its findings, a bad folder one error line."""
    argv = sys.argv[1:]
    if len(argv) != 1:
        print(f"usage: python -m {prog} RESULTS_FOLDER", file=sys.stderr)
        return 2
    try:
        report(load(argv[0]))
    except ResultsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0
