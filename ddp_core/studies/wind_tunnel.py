"""The wind tunnel: it sets each modelled variant's link rate on this host to match the real configuration's R_N.

R_N^bench = (T_c/N) / T_comm, as `ddp_core.analysis.similarity` defines it. T_c is one node's compute per step at
its CPU share. T_comm is the all-reduce of the gradient buckets over the variant's links and nodes. A rate fixed in
Mbit/s models another cluster on a CPU twice as fast. A rate set by R_N models the same cluster on both.

The steps, recorded in results/<study>/wind_tunnel.json:

1. T_c, one node's compute per step, from one-node runs (`calibration_compute`).
2. T(r) = A + B/r, the all-reduce time against the link rate r, per number of nodes (`link_model`).
3. The rate that meets each variant's target R, found by tries (`dimension`).
4. Each round's forecast of every variant's step on N nodes (`forecast_round`).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ddp_core.engine.model_cost import bucket_sizes
from ddp_core.engine.run_files import environment, now_iso
from ddp_core.engine.wind_tunnel_file import (
    LinkChoice,
    LinkModel,
    LinkTry,
    ModelledVariant,
    OneNodeRun,
    RoundForecast,
    ShareCalibration,
    WindTunnelRecord,
    read_wind_tunnel,
)
from ddp_core.launch.emulated import EmulatedCluster
from ddp_core.launch.launchers import start
from ddp_core.launch.plan import ALLREDUCE_READY_LINE, ExperimentError, prepare_run, rate_bits_per_s
from ddp_core.launch.plan import WIND_TUNNEL_FOLDER as FOLDER
from ddp_core.studies.study_list import Run, Study, StudyError

MAX_TRIES = 6
FASTEST_RATE = 5e9  # bits/s: above this tbf and the veth pair cost more CPU than the nodes' shares leave them
SLOWEST_RATE = 1e6
SECONDS_PER_SIZE = "1"  # per bucket size: at 8 nodes two tries of 0.5 s differed by 15 %
CALIBRATION_RATES = ("200mbit", "1gbit")  # about the slowest and fastest links the report's configurations need
CALIBRATION_RUNS = 3  # one-node runs whose median compute per step the links are set by
MAX_CALIBRATION_RUNS = 5  # on a machine too busy for 3 to agree in as many, the median of them all, recorded as such
OUT_OF_LINE_TOLERANCES = 2  # a run whose compute is more ratio tolerances than this off the runs' median is set aside


def ring_bits(buckets: list[int], nodes: int) -> float:
    """W: the bits each node sends in a ring all-reduce of the buckets."""
    # a ring sends 2(N-1)/N of every byte
    return sum(2 * (nodes - 1) / nodes * size * 8 for size in buckets)


def link_rate_for(target_ratio: float, rank_compute_s: float, fixed_s: float, wire_bits: float) -> float:
    """The link rate in bits/s at which the all-reduce takes T* = (T_c/N) / R_target. Refused in one line where no
    rate a link can be set to gives it."""
    # Step 3: T(r) = A + B/r = T* gives r = B / (T* - A), with A `fixed_s` and B `wire_bits`.
    target_s = rank_compute_s / target_ratio
    if target_s <= fixed_s:
        raise StudyError(
            f"R = {target_ratio:.2f} needs the all-reduce of a step in {target_s * 1e3:.0f} ms, but on "
            f"this host it takes {fixed_s * 1e3:.0f} ms over any link: give the nodes a smaller "
            f"cpus_per_node (a longer step) or model another configuration"
        )
    rate = wire_bits / (target_s - fixed_s)
    if not SLOWEST_RATE <= rate <= FASTEST_RATE:
        raise StudyError(
            f"R = {target_ratio:.2f} needs links of {rate / 1e6:,.1f} Mbit/s on this host, outside the "
            f"{SLOWEST_RATE / 1e6:g} Mbit/s to {FASTEST_RATE / 1e9:g} Gbit/s a link can be set to: "
            f"change cpus_per_node or model another configuration"
        )
    return rate


def tc_rate(bits_per_s: float) -> str:
    """A rate as tc takes it, to the kbit/s."""
    return f"{round(bits_per_s / 1e3)}kbit"


def bucket_times(out: Path, buckets: list[int]) -> list[float]:
    """The all-reduce time of each bucket, bucket 1 first, from the benchmark in `out` (it timed their sizes)."""
    import pandas as pd

    times = pd.read_csv(out / "allreduce.csv").set_index("size_bytes")["time_s"]
    return [float(times[size]) for size in buckets]


def benchmark_buckets(study: Study, n: int, link_rate: str, cpus: float, buckets: list[int], out: Path) -> list[float]:
    """Time the buckets' all-reduces on n ranks of the study's nodes at `link_rate`, into `out`."""
    shutil.rmtree(out, ignore_errors=True)  # made anew: an interrupted calibration starts again
    benchmark_on_cluster(
        n // study.ranks_per_node,
        study.ranks_per_node,
        link_rate,
        cpus,
        out,
        ["--sizes", *map(str, buckets), "--seconds-per-size", SECONDS_PER_SIZE],
    )
    return bucket_times(out, buckets)


def benchmark_on_cluster(
    nodes: int, ranks_per_node: int, link_rate: str | None, cpus_per_node: float | None, out: Path, args: list[str]
) -> None:
    """Run the all-reduce benchmark on the nodes the study trains on, with their links and CPU shares. The shares
    matter because gloo sums the buckets on the CPU."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        with EmulatedCluster(nodes, link_rate, cpus_per_node) as cluster:
            leader, *others = cluster.launch(
                ranks_per_node, ["-m", "ddp_core.bench.allreduce", "--out", str(out), *args], out
            )
            output = []
            for line in leader.stdout:
                output.append(line)
                if line.startswith(ALLREDUCE_READY_LINE):
                    cluster.limit_cpu()
            if leader.wait() != 0:
                tail = "".join(output[-10:]).strip()
                raise StudyError(f"the all-reduce benchmark in {out} failed on node 0; its last lines:\n{tail}")
            cluster.wait(others, out)
    except ExperimentError as exc:
        raise StudyError(str(exc)) from None


def one_node_run(study: Study, share: float) -> Run:
    """The first run of the study's one-node variant on nodes of `share` cores."""
    return next(run for run in study.runs() if run.world_size == 1 and not run.models and run.cpus_per_node == share)


def baseline_run(study: Study, share: float, results_dir: str, repeat: int = 1) -> Path:
    """Repeat `repeat` of the study's one-node variant at `share` cores: the run its round is forecast from. The study
    list makes sure each round trains it before the variants it serves."""
    return Path(results_dir) / replace(one_node_run(study, share), repeat=repeat).folder


def calibration_run(study: Study, share: float, repeat: int) -> Run:
    """Repeat `repeat` of the one-node variant, trained into the wind tunnel's folder to measure T_c. The study's own
    one-node runs stay in their rounds."""
    run = one_node_run(study, share)
    return replace(run, experiment=f"{study.name}/{FOLDER}/{run.experiment.split('/', 1)[1]}", repeat=repeat)


def train_quietly(run: Run, results_dir: str) -> Path:
    """The run trained (or reused, when finished), its output shown only when it fails."""
    output = io.StringIO()
    try:
        plan = prepare_run(run.parameters(results_dir))
        if plan.action != "reuse":
            began = time.perf_counter()
            with contextlib.redirect_stdout(output):
                start(plan)
            print(f"{run.folder}: trained in {time.perf_counter() - began:.0f} s", flush=True)
    except ExperimentError as exc:
        tail = "\n".join(output.getvalue().strip().splitlines()[-10:])
        raise StudyError(
            f"the wind tunnel's run {run.folder} failed: {exc}" + (f"; its last lines:\n{tail}" if tail else "")
        ) from None
    return plan.run_dir


def node_compute(run_dir: Path, home: Path) -> dict:
    """A one-node run's compute per step over its steady epochs, as the pages take it, and whether it counts. A run
    that got less than its share or ran beside other work is `disturbed`."""
    from ddp_core.analysis.comparisons import steady_phases
    from ddp_core.analysis.results import ResultsError, node_disturbed, read_run

    try:
        metrics, info = read_run(run_dir)
    except ResultsError as exc:
        raise StudyError(f"the wind tunnel needs its one-node run: {exc}") from None
    return {
        "run": run_dir.relative_to(home).as_posix(),
        "start_time": info["start_time"],
        "compute_per_step_s": float(steady_phases(metrics)["compute_per_step_s"].mean()),
        "disturbed": node_disturbed(info),
        "model": info["model"],
        "global_batch_size": info["global_batch_size"],
    }


def set_aside(runs: list[dict], tolerance: float) -> list[str | None]:
    """Why each one-node run cannot set the links: "disturbed" or "out of line", None where it can."""
    # the median of all the runs: of the undisturbed ones alone, a single run could be that median
    middle = float(np.median([run["compute_per_step_s"] for run in runs]))
    return [
        "disturbed"
        if run["disturbed"]
        else "out of line"
        if abs(run["compute_per_step_s"] / middle - 1) > OUT_OF_LINE_TOLERANCES * tolerance
        else None
        for run in runs
    ]


@dataclass(frozen=True)
class OneNodeCompute:
    """Step 1's answer: T_c at a share, the runs it came from, and the workload they trained."""

    compute_per_step_s: float
    quiet: bool  # False where the runs did not agree and T_c is the median of them all
    runs: list[OneNodeRun]
    model: dict
    global_batch_size: int


def calibration_compute(study: Study, share: float, results_dir: str) -> OneNodeCompute:
    """Step 1: T_c at `share`, the median compute per step of the one-node runs that count. Runs are set aside so that
    one disturbed run cannot set every link."""
    home = Path(results_dir) / study.name
    runs = []
    # Train until CALIBRATION_RUNS runs count, at most MAX_CALIBRATION_RUNS. A run that got less than its share, ran
    # beside other work, or computed out of line with the others is set aside, and another trained.
    for repeat in range(1, MAX_CALIBRATION_RUNS + 1):
        runs.append(node_compute(train_quietly(calibration_run(study, share, repeat), results_dir), home))
        reasons = set_aside(runs, study.ratio_tolerance)
        if reasons.count(None) >= CALIBRATION_RUNS:
            break
    counted = [run for run, why in zip(runs, reasons) if why is None]
    quiet = len(counted) >= CALIBRATION_RUNS
    if not quiet:  # a busy machine: the median of all the runs, recorded with `quiet` false
        print(
            f"{study.name}: the one-node runs at {share:g} core did not agree in {MAX_CALIBRATION_RUNS} tries (other "
            f"work on the machine?): the links are set by the median of them all, and the book says so",
            flush=True,
        )
    return OneNodeCompute(
        compute_per_step_s=float(np.median([run["compute_per_step_s"] for run in (counted if quiet else runs)])),
        quiet=quiet,
        runs=[
            OneNodeRun(run["run"], run["start_time"], run["compute_per_step_s"], set_aside=why)
            for run, why in zip(runs, reasons)
        ],
        model=runs[0]["model"],
        global_batch_size=runs[0]["global_batch_size"],
    )


def recorded(study: Study, results_dir: str) -> WindTunnelRecord | None:
    """The study's wind_tunnel.json, None before its calibration."""
    return read_wind_tunnel(Path(results_dir) / study.name)


def one_node_timeline(run_dir: Path):
    """The one-node run's median step with the moments its gradient buckets were ready, which the forecast replays."""
    import pandas as pd

    from ddp_core.analysis.comparisons import median_step
    from ddp_core.analysis.replay import stretched
    from ddp_core.engine.run_files import READY

    timeline = pd.read_csv(run_dir / "timeline.csv")
    if not timeline["what"].str.startswith(READY).any():
        raise StudyError(
            f"{run_dir} has no moments at which its gradient buckets were ready (an older ddp_core made "
            f"it): delete it, and the runner trains it again"
        )
    # stretched to the run's median step after warm-up, the statistic the runs on N nodes are measured by
    return stretched(timeline, median_step(pd.read_csv(run_dir / "steps.csv")["step_time_s"]))


def calibrate(study: Study, results_dir: str, share: float) -> WindTunnelRecord:
    """Dimension every variant on nodes of `share` cores and return the study's wind_tunnel.json. It is made once
    per share, when the first such variant is to train, and reused after."""
    import torch

    from ddp_core.analysis.similarity import SimilarityError, configuration

    home = Path(results_dir) / study.name
    record = recorded(study, results_dir) or WindTunnelRecord(
        study.name, study.ratio_tolerance, start_time=now_iso(), machine=environment(torch.device("cpu"))
    )
    if share in record.shares:
        return record
    calibration = calibration_compute(study, share, results_dir)  # step 1
    compute_s, workload, global_batch = calibration.compute_per_step_s, calibration.model, calibration.global_batch_size
    buckets = bucket_sizes(workload)
    modelled = [variant for variant in study.variants if variant.models and variant.cpus_per_node == share]
    try:  # every target computed (and a missing measurement refused) before any node is made
        targets = {
            (v.name, n): configuration(v.models).ratio(workload, global_batch, n)
            for v in modelled
            for n in v.world_sizes
        }
    except SimilarityError as exc:
        raise StudyError(f"study {study.name!r}: {exc}") from None
    ranks = study.ranks_per_node
    sizes = sorted({n for v in modelled for n in v.world_sizes})
    links = {n: link_model(study, n, buckets, share, home) for n in sizes}  # step 2
    for (variant, n), target in targets.items():  # every target within reach, before a variant's nodes are made
        try:
            link_rate_for(target, compute_s / n, links[n].fixed_s, links[n].bits)
        except StudyError as exc:
            raise StudyError(f"study {study.name!r}, variant {variant!r} at {n} nodes: {exc}") from None
    record.shares[share] = ShareCalibration(
        compute_per_step_s=compute_s,
        quiet=calibration.quiet,
        out_of_line=OUT_OF_LINE_TOLERANCES * study.ratio_tolerance,
        one_node_runs=calibration.runs,
        bucket_bytes=buckets,
        links=links,
    )
    # Step 3, per variant and N. Variants that model the same configuration on the same nodes share the first one's
    # links: the nodes study's sharded modes and its DDP.
    dimensioned_first = {}  # (configuration, n): the variant whose links the others that model it share
    for variant in modelled:
        modelling = configuration(variant.models)
        entries = record.variants[variant.name] = ModelledVariant(
            variant.models, modelling.name, modelling.source, cpus_per_node=share
        )
        for n in variant.world_sizes:
            first = dimensioned_first.setdefault((variant.models, n), variant.name)
            if first != variant.name:  # the same cluster: its links, not a second draw of the benchmark's noise
                entries.by_nodes[n] = same_links(record.variants[first].by_nodes[n], first, variant.name, n, home)
                continue
            start = time.perf_counter()
            entries.by_nodes[n] = entry = dimension(
                study,
                variant.name,
                n,
                targets[(variant.name, n)],
                compute_s / n,
                NodeLinks(links[n], buckets, share),
                home,
            )
            print(
                f"{study.name}/{variant.name}: {n // ranks} nodes of {share:g} core model {modelling.name} at R = "
                f"{entry.target_ratio:.2f}: links at {entry.link_rate}, R achieved "
                f"{entry.achieved_ratio:.2f} ({len(entry.tries)} tries, {time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    record.end_time = now_iso()
    record.save(home)
    return record


def fit_link(points: list[tuple[float, float]], wire_bits: float) -> tuple[float, float]:
    """Fit T(r) = A + B/r through (rate in bits/s, seconds) points by least squares, and return (A, B)."""
    # A: what no rate changes, gloo's latency and sums on a node's share and the kernel's work on the links.
    # B: the bits the ring sends, as the links carry them.
    inverse = np.array([1 / rate for rate, _ in points])
    seconds = np.array([time for _, time in points])
    bits, fixed = np.polyfit(inverse, seconds, 1)
    # B below the ring's bits is noise that makes a slower link look faster, not physics: A is then the mean remainder.
    if bits < wire_bits:
        bits, fixed = wire_bits, float(np.mean(seconds - wire_bits * inverse))
    return max(0.0, float(fixed)), float(bits)


def link_model(study: Study, n: int, buckets: list[int], cpus: float, home: Path) -> LinkModel:
    """Step 2: the buckets' all-reduce on n ranks against the link rate, fitted from the benchmark at the two
    CALIBRATION_RATES."""
    points = [
        (
            rate_bits_per_s(rate),
            sum(
                benchmark_buckets(
                    study, n, rate, cpus, buckets, home / FOLDER / f"calibration-{cpus:g}core-n{n}-{rate}"
                )
            ),
        )
        for rate in CALIBRATION_RATES
    ]
    fixed, bits = fit_link(points, ring_bits(buckets, n // study.ranks_per_node))
    return LinkModel(points, fixed, bits)


def forecast_round(study: Study, results_dir: str, share: float, repeat: int) -> None:
    """Step 4: forecast each DDP variant's step on nodes of `share` cores for round `repeat`, into wind_tunnel.json.
    It runs after the round's one-node run and before the round's variants train."""
    from ddp_core.analysis.replay import one_node_step_s, replay_step

    home = Path(results_dir) / study.name
    record = recorded(study, results_dir)
    calibrated = record.shares[share]
    sharded = {v.name for v in study.variants if v.settings.get("sharding", "none") != "none"}  # no DDP to replay
    entries = [
        (name, n, entry)
        for name, variant in record.variants.items()
        if variant.cpus_per_node == share and name not in sharded
        for n, entry in variant.by_nodes.items()
        if repeat not in [ahead.repeat for ahead in entry.forecasts]
    ]
    if not entries:  # already forecast
        return
    # The round's own one node, as its speedup is measured over it: here one node's repeats ran up to a third apart.
    timeline = one_node_timeline(baseline_run(study, share, results_dir, repeat))
    for variant, n, entry in entries:  # the one node's median step replayed on n nodes with the accepted all-reduces
        step = replay_step(timeline, n, bucket_times(home / variant / f"allreduce-n{n}", calibrated.bucket_bytes))
        entry.forecasts.append(
            RoundForecast(repeat, one_node_step_s(timeline), step["step_s"], step["exposed_s"], at=now_iso())
        )
    record.save(home)


@dataclass(frozen=True)
class NodeLinks:
    """What the calibration found for the links of n nodes of one CPU share: where a variant's tries start."""

    model: LinkModel  # the all-reduce against the rate
    buckets: list[int]  # the model's gradient buckets, in bytes, which each try benchmarks
    cpus: float  # each node's CPU share, in cores


def dimension(
    study: Study, variant: str, n: int, target: float, rank_compute_s: float, links: NodeLinks, home: Path
) -> LinkChoice:
    """Step 3 for one variant at n ranks: find its link rate by tries, and keep the accepted benchmark."""
    bits, fixed_s, buckets, cpus = links.model.bits, links.model.fixed_s, links.buckets, links.cpus
    # Near the target, the line through the two calibration rates can miss what the links do. Each miss beyond the
    # tolerance takes anew the part, A or B, that took most of the try's time, and sets the rate again.
    tries = []
    for attempt in range(1, MAX_TRIES + 1):
        rate = tc_rate(link_rate_for(target, rank_compute_s, fixed_s, bits))
        out = home / FOLDER / f"{variant}-n{n}-try{attempt}"
        measured = sum(benchmark_buckets(study, n, rate, cpus, buckets, out))
        achieved = rank_compute_s / measured
        tries.append(LinkTry(rate, fixed_s, bits, allreduce_s=measured, ratio=achieved))
        if abs(achieved / target - 1) <= study.ratio_tolerance:
            accept_benchmark(out, home / variant / f"allreduce-n{n}")  # the cost model reads it, as any benchmark
            return LinkChoice(target, achieved, rate, rank_compute_s, tries=tries)
        # Each a mean over the tries so far, so that one benchmark's noise is not a new A or B.
        if measured > 2 * fixed_s:  # mostly on the links: B as the tries took it beyond A at their rates
            # Far below the calibration rates a bit costs less: a B kept too large crept to the target by a few % a try.
            bits = float(np.mean([(t.allreduce_s - fixed_s) * rate_bits_per_s(t.link_rate) for t in tries]))
        else:  # A as what each try left beside B/r
            fixed_s = float(np.mean([t.allreduce_s - bits / rate_bits_per_s(t.link_rate) for t in tries]))
    raise StudyError(
        f"study {study.name!r}, variant {variant!r} at {n} ranks: R = {target:.2f} not reached within "
        f"{study.ratio_tolerance:.0%} in {MAX_TRIES} tries (the last: {tries[-1].ratio:.2f} at "
        f"{tries[-1].link_rate}; see {home / FOLDER}): other work on the machine? run again when it is "
        f"quiet (finished runs are kept), or widen the study's ratio_tolerance"
    )


def accept_benchmark(benchmark: Path, accepted: Path) -> None:
    """The benchmark in `benchmark` as a variant's allreduce-n<N> (`accepted`), replacing any there before."""
    shutil.rmtree(accepted, ignore_errors=True)
    accepted.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(benchmark, accepted)


def same_links(entry: LinkChoice, first: str, variant: str, n: int, home: Path) -> LinkChoice:
    """Give `variant` the links of `first` at n nodes, which model the same configuration on the same nodes. It
    takes their rate and benchmark, without the tries."""
    accept_benchmark(home / first / f"allreduce-n{n}", home / variant / f"allreduce-n{n}")
    return LinkChoice(entry.target_ratio, entry.achieved_ratio, entry.link_rate, entry.rank_compute_s, links_of=first)


def dimensioned(run: Run, record: WindTunnelRecord | None) -> Run:
    """`run` with the link rate the wind tunnel chose for its variant and world size. It is unchanged before then."""
    modelled = record.variants.get(run.experiment.split("/", 1)[1]) if record else None
    return replace(run, link_rate=modelled.by_nodes[run.world_size].link_rate) if modelled else run
