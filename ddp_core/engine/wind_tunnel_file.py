"""wind_tunnel.json as records: what the wind tunnel (`ddp_core.studies.wind_tunnel`) writes and the analysis reads,
in one place. Numbers that key a mapping (a CPU share, a number of nodes) are numbers here and text only in the file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ddp_core.engine.run_files import save_atomic

WIND_TUNNEL_FILE = "wind_tunnel.json"


@dataclass(frozen=True)
class OneNodeRun:
    """A calibration run of one node, and why it was set aside (None where it counted)."""

    run: str  # its folder, from the study's
    start_time: str
    compute_per_step_s: float
    set_aside: str | None


@dataclass(frozen=True)
class LinkModel:
    """The all-reduce time against the link rate r, T(r) = A + B/r, fitted through the calibration's points."""

    points: list[tuple[float, float]]  # (rate in bits/s, seconds) at each calibration rate
    fixed_s: float  # A: what no rate removes
    bits: float  # B: what the ring sends, as the links carry it


@dataclass(frozen=True)
class ShareCalibration:
    """What the calibration measured for nodes of one CPU share."""

    compute_per_step_s: float  # T_c: one node's compute per step
    quiet: bool  # False where the one-node runs did not agree and T_c is the median of them all
    out_of_line: float  # how far off the median a run's compute may be before it is set aside
    one_node_runs: list[OneNodeRun]
    bucket_bytes: list[int]
    links: dict[int, LinkModel]  # by number of nodes


@dataclass(frozen=True)
class LinkTry:
    """One try at a variant's link rate: the model it was set from and what the benchmark gave."""

    link_rate: str  # as tc takes it, e.g. "2123393kbit"
    fixed_s: float
    bits: float
    allreduce_s: float
    ratio: float  # R_N^bench reached


@dataclass(frozen=True)
class RoundForecast:
    """A round's forecast of a variant's step on N nodes, written before the round's runs on N nodes."""

    repeat: int
    one_node_step_s: float  # the round's one-node median step, which the forecast replays
    step_s: float
    exposed_s: float
    at: str  # when it was written


@dataclass
class LinkChoice:
    """The links the wind tunnel chose for a variant at N nodes."""

    target_ratio: float  # R_N^bench of the cluster the variant models
    achieved_ratio: float  # R_N^bench the accepted links reached on this machine
    link_rate: str
    rank_compute_s: float  # one node's compute per step over N: what the ratio divides
    tries: list[LinkTry] = field(default_factory=list)
    forecasts: list[RoundForecast] = field(default_factory=list)
    links_of: str | None = None  # the variant whose links it shares, where it models the same cluster


@dataclass
class ModelledVariant:
    """A variant whose links the wind tunnel set: the cluster it models and its links at each number of nodes."""

    models: str  # a key of `similarity.CONFIGURATIONS`
    configuration: str  # that cluster in words
    source: str  # where that cluster's figures come from
    cpus_per_node: float
    by_nodes: dict[int, LinkChoice] = field(default_factory=dict)


@dataclass
class WindTunnelRecord:
    """A study's wind_tunnel.json. `machine` is the environment it ran in, at the top level of the file as in
    run.json."""

    study: str
    tolerance: float
    start_time: str
    machine: dict
    shares: dict[float, ShareCalibration] = field(default_factory=dict)
    variants: dict[str, ModelledVariant] = field(default_factory=dict)
    end_time: str | None = None

    def save(self, folder: Path) -> None:
        """Into folder/wind_tunnel.json, whole or not at all."""
        fields_ = {key: value for key, value in asdict(self).items() if key != "machine"}
        fields_["shares"] = {f"{share:g}": calibration for share, calibration in fields_["shares"].items()}
        save_atomic(_text_keys(fields_) | self.machine, folder / WIND_TUNNEL_FILE)


def _text_keys(value):
    """JSON's keys are text: a number of nodes becomes "4"."""
    if isinstance(value, dict):
        return {str(key): _text_keys(item) for key, item in value.items()}
    return [_text_keys(item) for item in value] if isinstance(value, list) else value


def _link_choice(entry: dict) -> LinkChoice:
    return LinkChoice(
        **{key: value for key, value in entry.items() if key not in ("tries", "forecasts")},
        tries=[LinkTry(**t) for t in entry.get("tries", [])],
        forecasts=[RoundForecast(**f) for f in entry.get("forecasts", [])],
    )


def read_wind_tunnel(study_folder: Path) -> WindTunnelRecord | None:
    """A study's wind_tunnel.json, None where the wind tunnel set no variant's links."""
    path = study_folder / WIND_TUNNEL_FILE
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    known = {f.name for f in fields(WindTunnelRecord)}
    return WindTunnelRecord(
        study=raw["study"],
        tolerance=raw["tolerance"],
        start_time=raw["start_time"],
        end_time=raw.get("end_time"),
        machine={key: value for key, value in raw.items() if key not in known},
        shares={
            float(share): ShareCalibration(
                **{key: value for key, value in calibrated.items() if key not in ("one_node_runs", "links")},
                one_node_runs=[OneNodeRun(**run) for run in calibrated["one_node_runs"]],
                links={int(n): LinkModel(**link) for n, link in calibrated["links"].items()},
            )
            for share, calibrated in raw["shares"].items()
        },
        variants={
            name: ModelledVariant(
                **{key: value for key, value in entry.items() if key != "by_nodes"},
                by_nodes={int(n): _link_choice(choice) for n, choice in entry["by_nodes"].items()},
            )
            for name, entry in raw["variants"].items()
        },
    )
