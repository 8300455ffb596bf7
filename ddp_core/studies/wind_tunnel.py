"""The emulated cluster dimensioned by similarity: before a modelled variant trains, its links' rate is chosen on this
host so that its compute-to-communication ratio R_N^bench equals the real configuration's
(`ddp_core.report.similarity`) within TOLERANCE. A link set in Mbit/s models one cluster on one CPU and another on a
CPU twice as fast; a link set by R_N models the same cluster on both.

R_N^bench = (T_c/N) / T_comm: T_c is one node's compute per step at its CPU share, T_comm the all-reduce of the
model's gradient buckets as `ddp_core.bench.allreduce` times them over the variant's links and nodes. The calibration,
its files in results/<study>/wind_tunnel/ and its record in wind_tunnel.json beside them:

1. T_c: the study's one-node run (the baseline variant's first repeat, which trains first in round 1), its compute
   per step over the steady epochs as every page takes it;
2. per number of nodes N, the buckets' all-reduce T(r) = A + B/r against the links' rate r, from the benchmark at two
   rates (CALIBRATION_RATES): A is the part no rate changes (gloo's latency and sums on a node's share, the kernel's
   work on the links), B the bits a node sends as the links carry them (a ring sends 2(N-1)/N of every byte);
3. per variant and N, the rate r at which T(r) = T* = (T_c/N) / R_target, r = B / (T* - A). The benchmark at r
   gives the R achieved; where it misses by more than TOLERANCE, A is taken anew from it (A = measured - B/r: the
   fixed part as it is at that rate) and r set again, at most MAX_TRIES times.
The accepted benchmark becomes the variant's allreduce-n<N>, which the cost model reads as before. A target this host
cannot reach (the all-reduce over the fastest link still too long, or the rate beyond what a link can be set to) is
refused in one line before any of the variant's nodes are made.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ddp_core.engine.model_cost import bucket_sizes
from ddp_core.engine.run_files import environment, now_iso, save_atomic
from ddp_core.launch.emulated import EmulatedCluster, rate_bits_per_s
from ddp_core.launch.local import ALLREDUCE_READY_LINE, WIND_TUNNEL_FILE, ExperimentError, run_dir_name
from ddp_core.studies.study_list import Run, Study, StudyError

TOLERANCE = 0.05  # the achieved R_N^bench within 5 % of the target
MAX_TRIES = 4
FASTEST_RATE = 5e9  # bits/s: above this tbf and the veth pair cost more CPU than the nodes' shares leave them
SLOWEST_RATE = 1e6
FOLDER = "wind_tunnel"
SECONDS_PER_SIZE = "0.5"
CALIBRATION_RATES = ("200mbit", "1gbit")  # about the slowest and fastest links the report's configurations need


def ring_bits(buckets: list[int], nodes: int) -> float:
    """W: the bits each node sends in a ring all-reduce of the buckets, 2(N-1)/N of every byte."""
    return sum(2 * (nodes - 1) / nodes * size * 8 for size in buckets)


def link_rate_for(target_ratio: float, rank_compute_s: float, fixed_s: float, wire_bits: float) -> float:
    """The link rate (bits/s) at which the all-reduce takes (T_c/N)/R_target: the fixed part `fixed_s` and
    `wire_bits` at that rate. Refused in one line where no rate between SLOWEST_RATE and FASTEST_RATE gives it."""
    target_s = rank_compute_s / target_ratio
    if target_s <= fixed_s:
        raise StudyError(f"R = {target_ratio:.2f} needs the all-reduce of a step in {target_s * 1e3:.0f} ms, but on "
                         f"this host it takes {fixed_s * 1e3:.0f} ms over any link: give the nodes a smaller "
                         f"cpus_per_node (a longer step) or model another configuration")
    rate = wire_bits / (target_s - fixed_s)
    if not SLOWEST_RATE <= rate <= FASTEST_RATE:
        raise StudyError(f"R = {target_ratio:.2f} needs links of {rate / 1e6:,.1f} Mbit/s on this host, outside the "
                         f"{SLOWEST_RATE / 1e6:g} Mbit/s to {FASTEST_RATE / 1e9:g} Gbit/s a link can be set to: "
                         f"change cpus_per_node or model another configuration")
    return rate


def tc_rate(bits_per_s: float) -> str:
    """A rate as tc takes it, to the kbit/s."""
    return f"{round(bits_per_s / 1e3)}kbit"


def buckets_allreduce_s(out: Path, buckets: list[int]) -> float:
    """The sum of the benchmark's all-reduce times at the buckets' sizes (it timed exactly those)."""
    import pandas as pd

    times = pd.read_csv(out / "allreduce.csv").set_index("size_bytes")["time_s"]
    return float(sum(times[size] for size in buckets))


def benchmark_on_cluster(nodes: int, ranks_per_node: int, link_rate: str | None, cpus_per_node: float | None,
                         out: Path, args: list[str]) -> None:
    """The all-reduce benchmark on the nodes the study trains on: their links and, where set, their CPU shares (gloo
    sums the buckets on the CPU)."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        with EmulatedCluster(nodes, link_rate, cpus_per_node) as cluster:
            leader, *others = cluster.launch(ranks_per_node, ["-m", "ddp_core.bench.allreduce", "--out", str(out),
                                                              *args], out)
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


def baseline_run(study: Study, results_dir: str) -> Path:
    """The run whose compute per step is T_c: the first repeat of the study's first variant, one node (the study list
    makes sure), which round 1 trains before the modelled variants."""
    return Path(results_dir) / study.experiment(study.variants[0]) / run_dir_name(1)


def node_compute_s(run_dir: Path) -> tuple[float, dict, int]:
    """A one-node run's compute per step over its steady epochs (as the pages take it), its model and global batch."""
    from ddp_core.report.comparisons import steady_phases
    from ddp_core.report.results import ResultsError, read_run

    try:
        metrics, info = read_run(run_dir)
    except ResultsError as exc:
        raise StudyError(f"the wind tunnel needs the one-node run first: {exc}") from None
    if not info.get("end_time"):
        raise StudyError(f"the wind tunnel needs the one-node run {run_dir} finished")
    return float(steady_phases(metrics)["compute_per_step_s"].mean()), info["model"], info["global_batch_size"]


def recorded(study: Study, results_dir: str) -> dict | None:
    """The study's wind_tunnel.json, None before its calibration."""
    path = Path(results_dir) / study.name / WIND_TUNNEL_FILE
    return json.loads(path.read_text()) if path.exists() else None


def calibrate(study: Study, results_dir: str) -> dict:
    """The study's wind_tunnel.json: made once (the runs reuse it, as they reuse a finished run), by the steps of the
    module's docstring."""
    import torch

    from ddp_core.report.similarity import SimilarityError, configuration

    home = Path(results_dir) / study.name
    if recorded(study, results_dir):
        return recorded(study, results_dir)
    baseline = baseline_run(study, results_dir)
    compute_s, workload, global_batch = node_compute_s(baseline)
    buckets = bucket_sizes(workload)
    modelled = [variant for variant in study.variants if variant.models]
    try:  # every target computed (and a missing measurement refused) before any node is made
        targets = {(v.name, n): configuration(v.models).ratio(workload, global_batch, n)
                   for v in modelled for n in v.world_sizes}
    except SimilarityError as exc:
        raise StudyError(f"study {study.name!r}: {exc}") from None
    cpus = modelled[0].cpus_per_node
    ranks = study.ranks_per_node
    links = {n: link_model(study, n, buckets, cpus, home) for n in sorted({n for v in modelled for n in v.world_sizes})}
    for (variant, n), target in targets.items():  # every target within reach, before a variant's nodes are made
        try:
            link_rate_for(target, compute_s / n, links[n]["fixed_s"], links[n]["bits"])
        except StudyError as exc:
            raise StudyError(f"study {study.name!r}, variant {variant!r} at {n} nodes: {exc}") from None
    record = {"study": study.name, "baseline": str(baseline.relative_to(home)), "compute_per_step_s": compute_s,
              "cpus_per_node": cpus, "bucket_bytes": buckets, "tolerance": TOLERANCE,
              "links": {str(n): link for n, link in links.items()}, "variants": {},
              "start_time": now_iso(), **environment(torch.device("cpu"))}
    for variant in modelled:
        modelling = configuration(variant.models)
        entries = {}
        record["variants"][variant.name] = {"models": variant.models, "configuration": modelling.name,
                                            "source": modelling.source, "by_nodes": entries}
        for n in variant.world_sizes:
            start = time.perf_counter()
            entries[str(n)] = entry = dimension(study, variant.name, n, targets[(variant.name, n)], compute_s / n,
                                                links[n], buckets, cpus, home)
            print(f"{study.name}/{variant.name}: {n // ranks} nodes model {modelling.name} at R = "
                  f"{entry['target_ratio']:.2f}: links at {entry['link_rate']}, R achieved "
                  f"{entry['achieved_ratio']:.2f} ({len(entry['tries'])} tries, {time.perf_counter() - start:.0f} s)",
                  flush=True)
    save_atomic(record | {"end_time": now_iso()}, home / WIND_TUNNEL_FILE)
    return record


def link_model(study: Study, n: int, buckets: list[int], cpus: float | None, home: Path) -> dict:
    """The buckets' all-reduce on n ranks against the link rate, T(r) = A + B/r, through the benchmark at the two
    CALIBRATION_RATES: A, the part no rate changes, and B, the bits the ring sends as the links carry them (never
    fewer than `ring_bits`: noise that makes the slower link look faster is not taken for physics)."""
    times = []
    for rate in CALIBRATION_RATES:
        out = home / FOLDER / f"calibration-n{n}-{rate}"
        shutil.rmtree(out, ignore_errors=True)  # an interrupted calibration starts again
        benchmark_on_cluster(n // study.ranks_per_node, study.ranks_per_node, rate, cpus, out,
                             ["--sizes", *map(str, buckets), "--seconds-per-size", SECONDS_PER_SIZE])
        times.append(buckets_allreduce_s(out, buckets))
    slow, fast = (1 / rate_bits_per_s(rate) for rate in CALIBRATION_RATES)
    bits = max((times[0] - times[1]) / (slow - fast), ring_bits(buckets, n // study.ranks_per_node))
    return {"rates": list(CALIBRATION_RATES), "allreduce_s": times, "bits": bits,
            "fixed_s": max(0.0, times[1] - bits * fast)}


def dimension(study: Study, variant: str, n: int, target: float, rank_compute_s: float, link: dict,
              buckets: list[int], cpus: float | None, home: Path) -> dict:
    """One variant at n ranks: its link rate, by the tries of the module's step 3, and the accepted benchmark moved to
    the variant's allreduce-n<n>."""
    bits, fixed_s = link["bits"], link["fixed_s"]
    tries = []
    for attempt in range(1, MAX_TRIES + 1):
        rate = tc_rate(link_rate_for(target, rank_compute_s, fixed_s, bits))
        out = home / FOLDER / f"{variant}-n{n}-try{attempt}"
        shutil.rmtree(out, ignore_errors=True)
        benchmark_on_cluster(n // study.ranks_per_node, study.ranks_per_node, rate, cpus, out,
                             ["--sizes", *map(str, buckets), "--seconds-per-size", SECONDS_PER_SIZE])
        measured = buckets_allreduce_s(out, buckets)
        achieved = rank_compute_s / measured
        tries.append({"link_rate": rate, "fixed_s": fixed_s, "allreduce_s": measured, "ratio": achieved})
        if abs(achieved / target - 1) <= TOLERANCE:
            accepted = home / variant / f"allreduce-n{n}"
            shutil.rmtree(accepted, ignore_errors=True)
            accepted.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(out, accepted)
            return {"target_ratio": target, "achieved_ratio": achieved, "link_rate": rate,
                    "rank_compute_s": rank_compute_s, "tries": tries}
        fixed_s = measured - bits / rate_bits_per_s(rate)
    raise StudyError(f"study {study.name!r}, variant {variant!r} at {n} ranks: R = {target:.2f} not reached within "
                     f"{TOLERANCE:.0%} in {MAX_TRIES} tries (the last: {tries[-1]['ratio']:.2f} at "
                     f"{tries[-1]['link_rate']}); see {home / FOLDER}")


def dimensioned(run: Run, record: dict) -> Run:
    """`run` with the link rate the wind tunnel chose for its variant and world size."""
    from dataclasses import replace

    variant = run.experiment.split("/", 1)[1]
    return replace(run, link_rate=record["variants"][variant]["by_nodes"][str(run.world_size)]["link_rate"])
