"""The training state one rank holds under each sharding mode, by ZeRO's formulas and as measured.

The formulas are those of ZeRO (Rajbhandari et al., SC 2020). The chapter and the key findings read the nodes study's
sharded variants: their bytes beside the formula's, and each mode's time per sample against DDP's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddp_core.analysis.comparisons import Judged, compare_times, judged_times, time_floor
from ddp_core.analysis.emulated import ddp_on_nodes, node_share
from ddp_core.analysis.results import (
    Experiment,
    ResultsError,
    RunInfo,
    joined,
    last_epochs,
    link_label,
    only,
    point_label,
    wind_tunnel_record,
)
from ddp_core.analysis.speedups import scaling_table
from ddp_core.analysis.verdict import Comparison
from ddp_core.engine.config import FSDP_MODES
from ddp_core.engine.model_cost import parameter_counts
from ddp_core.engine.run_files import STATE_COLUMNS

MODE_NAMES = {"none": "DDP", "zero1": "ZeRO\u20111", "zero2": "ZeRO\u20112", "zero3": "ZeRO\u20113"}  # hyphens that
# never break a table's narrow first column
SHARDED_MODES = tuple(mode for mode in MODE_NAMES if mode != "none")
HELD = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes")  # a rank's state but the gradients kept
# per mode, the kinds each rank holds 1/N of: ZeRO stage k shards the last k of HELD
SHARDED = {"none": (), "zero1": HELD[2:], "zero2": HELD[1:], "zero3": HELD}


def formula_bytes(parameters: int, tensors: int, ranks: int, mode: str) -> dict[str, float]:
    """Per kind, the bytes one of `ranks` ranks holds under `mode`, for `parameters` parameters in `tensors` tensors."""
    # In fp32 with AdamW, as this project trains: 4 bytes a parameter for the weights, 4 for its gradient, 8 for
    # AdamW's two moments, and 4 a tensor for its step count. N ranks each hold 1/N of what a mode shards:
    # | mode  | parameters | gradients | optimizer state | gradients kept between steps |
    # | none  | 4Ψ         | 4Ψ        | 8Ψ              | 4Ψ (DDP's buckets)            |
    # | zero1 | 4Ψ         | 4Ψ        | 8Ψ/N            | 4Ψ                            |
    # | zero2 | 4Ψ         | 4Ψ/N      | 8Ψ/N            | 0                             |
    # | zero3 | 4Ψ/N       | 4Ψ/N      | 8Ψ/N            | 0                             |
    whole = {
        "parameters_bytes": 4 * parameters,
        "gradients_bytes": 4 * parameters,
        "optimizer_state_bytes": 8 * parameters,
    }
    held = {kind: size / ranks if kind in SHARDED[mode] else size for kind, size in whole.items()}
    held["optimizer_state_bytes"] += 4 * tensors  # a step count per tensor, on every rank under FSDP2 and DDP
    held["gradients_kept_bytes"] = 0 if mode in FSDP_MODES else held["gradients_bytes"]  # FSDP2 frees them
    return {kind: held[kind] for kind in STATE_COLUMNS}


def block_parameters(counts: dict[str, int]) -> dict[str, int]:
    """The parameters of each encoder block, by its index, from `parameter_counts`.

    The rest, embeddings and head, is FSDP2's root unit.
    """
    blocks: dict[str, int] = {}
    for name, count in counts.items():
        if name.startswith("blocks."):
            block = name.split(".")[1]
            blocks[block] = blocks.get(block, 0) + count
    return blocks


GLOO_SENDS = {  # per kind of c10d collective (its operators' names contain it), what a node sends on gloo over
    # (N-1)/N of its size
    "allreduce": 2,  # a ring: a reduce-scatter and an all-gather of the whole
    "reduce_scatter": 2,  # ProcessGroupGloo's is a whole all-reduce of which a rank keeps its chunk (#118911)
    "allgather": 1,  # a ring
    "broadcast": 1,  # a tree: N-1 copies in all, 1/N of them a node on average
}


def collective_kind(name: str) -> str:
    """The kind of the c10d operator `name`, a key of GLOO_SENDS, refused in one line where it has none."""
    kind = next((kind for kind in GLOO_SENDS if kind in name), None)
    if kind is None:
        raise ResultsError(f"no algorithm known for the collective {name}: add its kind to GLOO_SENDS")
    return kind


def gloo_sends(counted: dict[str, dict], nodes: int) -> float:
    """The bytes a node sends on average for the collectives one step handed to gloo, by gloo's algorithms.

    `counted` is run.json's `collectives_per_step`, from `ddp_core.engine.collectives`.
    """
    sent = sum(GLOO_SENDS[collective_kind(name)] * entry["bytes"] for name, entry in counted.items())
    return sent * (nodes - 1) / nodes


def counted_collectives(run: RunInfo) -> dict[str, dict]:
    """The collectives one step of `run` handed to the process group, by operator, from run.json.

    A run that did not count them is refused in one line.
    """
    counted = run.raw.get("collectives_per_step")
    if not counted:
        raise ResultsError(f"run {run.name} did not count its collectives: train it with --count-collectives")
    return counted


def bytes_per_parameter(state: dict[str, float], parameters: int) -> float:
    """What a rank holds of parameters, gradients and optimizer state together, per parameter of the model.

    This number sets the largest model a mode fits in a given memory.
    """
    return sum(state[kind] for kind in HELD) / parameters


def state_table(rows: pd.DataFrame, parameters: int, tensors: int) -> pd.DataFrame:
    """Per mode and ranks, the measured bytes of each kind beside the formula's, and the bytes per parameter of each.

    `rows` holds one run each: its mode, ranks and STATE_COLUMNS as measured.
    """
    # Measured bytes (`ddp_core.engine.memory`) depart from the formula's even 1/N where the split cannot be even.
    # FSDP2 pads each tensor's first dimension to a multiple of N. ZeRO-1 gives each rank whole tensors, so one large
    # tensor, an embedding, leaves one rank most of the optimizer's state.
    out = []
    for (mode, ranks), group in rows.groupby(["mode", "ranks"], sort=False):
        sides = {
            "measured": {kind: float(group[kind].max()) for kind in STATE_COLUMNS},
            "formula": formula_bytes(parameters, tensors, ranks, mode),
        }
        out.append(
            {
                "mode": mode,
                "ranks": ranks,
                **{f"{kind}_{side}": size for side, state in sides.items() for kind, size in state.items()},
                **{f"per_parameter_{side}": bytes_per_parameter(state, parameters) for side, state in sides.items()},
            }
        )
    return pd.DataFrame(out)


def modes(study: dict[str, Experiment], nodes: int | None = None) -> dict[str, Experiment]:
    """The study's variants on several nodes by sharding mode, without the one-node runs, which shard nothing.

    With `nodes`, each variant keeps its runs on that many alone, as the memory and the bytes are read.
    """
    by_mode = {e.baseline.sharding: e for e in study.values() if e.largest > 1}
    return by_mode if nodes is None else {mode: only(e, nodes) for mode, e in by_mode.items()}


def node_counts(study: dict[str, Experiment]) -> list[int]:
    """The numbers of nodes (one rank each) the modes ran on, ascending."""
    return list(modes(study)["none"].repeats)


def one_node(study: dict[str, Experiment]) -> Experiment:
    """The runs on one node, which each mode's speedup is taken over."""
    return next(e for e in study.values() if e.largest == 1)


def model_size(e: Experiment) -> tuple[int, int]:
    """Parameters and parameter tensors of the model the runs trained."""
    return e.baseline.parameters, len(parameter_counts(e.baseline.model))


def state_rows(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per run on the most nodes, its mode, ranks and the largest rank's state by kind in its last epoch."""
    rows = []
    for mode, e in modes(study, max(node_counts(study))).items():
        last = last_epochs(e.metrics)
        for run in e.all_runs:
            rows.append({"mode": mode, "ranks": run.world_size, **last.loc[run.name, STATE_COLUMNS].to_dict()})
    return pd.DataFrame(rows)


def memory_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per mode, each kind measured and by the formula (`state_table`), indexed by the mode's name."""
    table = state_table(state_rows(study), *model_size(next(iter(study.values()))))
    return table.set_index(table["mode"].map(MODE_NAMES))


def held_shares(table: pd.DataFrame) -> pd.DataFrame:
    """Per mode's name, the state its largest rank held over DDP's, as measured and by the formula.

    The state is parameters, gradients and optimizer state.
    """
    held = {side: table[[f"{kind}_{side}" for kind in HELD]].sum(axis=1) for side in ("measured", "formula")}
    return pd.DataFrame({side: held_bytes / held_bytes[MODE_NAMES["none"]] for side, held_bytes in held.items()})


def time_comparisons(study: dict[str, Experiment]) -> dict[int, dict[str, Comparison]]:
    """Per number of nodes and sharded mode, its time per sample against DDP's on as many nodes, repeat by repeat."""
    # one floor for all: that of every configuration `sharding_runs` gives, the one node's too
    by_mode = modes(study)
    ddp, floor = by_mode["none"], time_floor(*study.values())
    return {
        n: {mode: compare_times(by_mode[mode], ddp, n, n, floor=floor) for mode in SHARDED_MODES}
        for n in node_counts(study)
    }


def sharding_runs(nodes: dict[str, Experiment]) -> dict[str, Experiment]:
    """What the sharding chapter reads of the nodes study: the sharded variants, the DDP variant, and the one node.

    All ran in the same rounds, so every mode can be compared with DDP.
    """
    sharded = {name: e for name, e in nodes.items() if e.baseline.sharded}
    if not sharded:
        raise ResultsError(
            f"{next(iter(nodes.values())).folder.parent}: no sharded variant in the nodes study "
            f"(variants with settings: {{sharding: zero1}} and the like)"
        )
    first = next(iter(sharded.values()))
    record = wind_tunnel_record(first.folder.parent)
    models, share = record[first.folder.name].models, node_share(first)
    ddp = {  # the DDP variant whose links the modes share: the same configuration on nodes of the same share
        name: e
        for name, e in nodes.items()
        if ddp_on_nodes(e) and name in record and record[name].models == models and node_share(e) == share
    }
    alone = {name: e for name, e in nodes.items() if e.largest == 1 and node_share(e) == share}
    return alone | ddp | sharded


SPEEDUP_KEYS = ("speedup", "speedup_low", "speedup_high", "efficiency", "verdict", "noise_floor")


def speedup_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per mode's name, its speedup over the one node of the same share on each number of nodes, repeat by repeat.

    Columns are `<key>_n<N>` for each of SPEEDUP_KEYS.
    """
    alone = one_node(study)
    rows = {}
    for mode, e in modes(study).items():
        table = scaling_table(joined(alone, e))
        rows[MODE_NAMES[mode]] = {f"{key}_n{n}": table.loc[n, key] for n in node_counts(study) for key in SPEEDUP_KEYS}
    return pd.DataFrame(rows).T


@dataclass(frozen=True)
class Headline:
    """What the key findings and the sharding page say of sharding, at the most nodes.

    It sets DDP's and ZeRO-3's speedups beside ZeRO-3's share of DDP's state and its time against DDP's.
    """

    nodes: int
    link: str
    setting: str
    ddp_speedup: float
    ddp_speedup_verdict: str
    zero3_speedup: float
    zero3_speedup_verdict: str
    zero3_held_share: float
    zero3_formula_share: float
    zero3_time: Judged


def headline(study: dict[str, Experiment]) -> Headline:
    """`Headline` of the sharding runs (`sharding_runs`), on the most nodes."""
    zero3 = held_shares(memory_table(study)).loc[MODE_NAMES["zero3"]]
    n = max(node_counts(study))
    speedups, ddp, zero3_name = speedup_table(study), MODE_NAMES["none"], MODE_NAMES["zero3"]
    zero3_time = time_comparisons(study)[n]["zero3"]
    return Headline(
        nodes=n,
        link=link_label(modes(study)["none"]),
        setting=point_label(modes(study)["none"], n),
        ddp_speedup=speedups.loc[ddp, f"speedup_n{n}"],
        ddp_speedup_verdict=speedups.loc[ddp, f"verdict_n{n}"],
        zero3_speedup=speedups.loc[zero3_name, f"speedup_n{n}"],
        zero3_speedup_verdict=speedups.loc[zero3_name, f"verdict_n{n}"],
        zero3_held_share=zero3["measured"],
        zero3_formula_share=zero3["formula"],
        zero3_time=judged_times(zero3_time),
    )
