"""The study list, `notebooks/studies.yml`, read into typed entries and expanded into runs.

One list drives both sides of the report: `ddp_core.studies.run` trains results/<study>/..., and the book's study
pages load the same folders. A study is a base profile, the settings it changes, and runs over world sizes, perhaps in
named variants, each repeated with other seeds. A study with `ranks_per_node` trains on an emulated cluster, its links
set by `link_rate` or by `models` (`ddp_core.studies.wind_tunnel`). Everything is checked when the list is read, so a
bad entry fails in one line before any run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from ddp_core.engine.config import UsageError, load_profile
from ddp_core.launch.plan import run_dir_name
from ddp_core.paths import REPO_ROOT

STUDY_LIST = REPO_ROOT / "notebooks" / "studies.yml"
GPU_STUDY_LIST = REPO_ROOT / "notebooks" / "studies-gpu.yml"  # the studies sized for the GPU profile
STUDY_KEYS = {
    "title",
    "profile",
    "settings",
    "world_sizes",
    "repeats",
    "variants",
    "allreduce",
    "ranks_per_node",
    "link_rate",
    "cpus_per_node",
    "ratio_tolerance",
}
VARIANT_KEYS = {"settings", "world_sizes", "link_rate", "cpus_per_node", "models"}


class StudyError(Exception):
    """A bad entry of the study list, or an unknown study name, in one line."""


@dataclass(frozen=True)
class SlurmPlacement:
    """How the runner's --launcher slurm places a run as a job: at most `ranks_per_node` ranks a node. Each rank gets
    `cpus_per_rank` cores, and a GPU on cuda. The site's partition, account and time limit are the sbatch script's."""

    ranks_per_node: int = 4
    cpus_per_rank: int = 4


@dataclass(frozen=True)
class Run:
    study: str
    experiment: str  # folder under the results: <study>, or <study>/<variant> for a study with named variants
    profile: str
    settings: dict
    world_size: int
    repeat: int
    nodes: int | None = None  # an emulated cluster's nodes (None: the ranks run on this machine)
    link_rate: str | None = None  # the emulated links' rate (None: unshaped)
    cpus_per_node: float | None = None  # the emulated nodes' CPU share (None: the machine's cores, shared)
    # the real configuration (ddp_core.analysis.similarity) whose compute-to-communication ratio the links are set to
    # reach on this host; the wind tunnel sets their rate later
    models: str | None = None
    slurm: SlurmPlacement | None = None  # set: a Slurm job, not a process of this machine

    @property
    def folder(self) -> str:
        return f"{self.experiment}/{run_dir_name(self.world_size, self.repeat)}"

    def parameters(self, results_dir: str) -> dict:
        """The run notebook's parameters for this run, which are also `launch.plan.prepare`'s. The runner checks the
        run with them, and papermill hands the same ones to the notebook."""
        common = dict(
            world_size=self.world_size,
            profile=self.profile,
            overrides=self.settings,
            repeat=self.repeat,
            experiment=self.experiment,
            results_dir=results_dir,
        )
        if self.slurm:
            on_gpus = (load_profile(self.profile) | self.settings).get("device") == "cuda"
            return common | dict(
                launcher="slurm",
                nodes=slurm_nodes(self.world_size, self.slurm),
                slurm_gpus_per_rank=int(on_gpus),
                slurm_cpus_per_rank=self.slurm.cpus_per_rank,
            )
        return common | dict(
            launcher="local" if self.nodes is None else "emulated",
            nodes=self.nodes or 1,
            link_rate=self.link_rate,
            cpus_per_node=self.cpus_per_node,
        )


def slurm_nodes(world_size: int, placement: SlurmPlacement) -> int:
    """The nodes a run of `world_size` ranks takes as a job: one up to a node's ranks, else whole nodes."""
    return max(1, world_size // placement.ranks_per_node)


@dataclass(frozen=True)
class Variant:
    name: str  # "" for a study without variants
    settings: dict
    world_sizes: tuple[int, ...]
    link_rate: str | None = None
    cpus_per_node: float | None = None
    models: str | None = None  # a configuration of ddp_core.analysis.similarity: the wind tunnel sets link_rate


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    profile: str
    repeats: int
    variants: tuple[Variant, ...]
    allreduce: bool
    ranks_per_node: int | None = None  # set: every run on an emulated cluster of world_size / ranks_per_node nodes
    ratio_tolerance: float = 0.05  # how far a modelled variant's R_N^bench may miss its target (the wind tunnel's)
    slurm: SlurmPlacement | None = None  # set: every run a Slurm job (the runner's --launcher slurm)

    def experiment(self, variant: Variant) -> str:
        return f"{self.name}/{variant.name}" if variant.name else self.name

    def runs(self) -> list[Run]:
        """Repeat by repeat, every variant and world size once per repeat (see `interleaved`)."""
        return [
            Run(
                self.name,
                self.experiment(variant),
                self.profile,
                variant.settings,
                n,
                repeat,
                n // self.ranks_per_node if self.ranks_per_node else None,
                variant.link_rate,
                variant.cpus_per_node,
                variant.models,
                self.slurm,
            )
            for repeat in range(1, self.repeats + 1)
            for variant in self.variants
            for n in variant.world_sizes
        ]

    @property
    def modelled(self) -> bool:
        """Some variant's links model a configuration: the wind tunnel sets their rate before they train."""
        return any(variant.models for variant in self.variants)

    @property
    def allreduce_world_sizes(self) -> list[int]:
        return sorted({n for v in self.variants for n in v.world_sizes if n > 1}) if self.allreduce else []


def interleaved(studies: list[Study]) -> list[Run]:
    """The runs of several studies in training order, round k running repeat k of everything. The runs a sentence
    compares then alternate in time, so a slow quarter-hour on a shared machine slows one repeat of each side."""
    return sorted((run for study in studies for run in study.runs()), key=lambda run: run.repeat)


def _world_sizes(value, where: str) -> tuple[int, ...]:
    if not (
        isinstance(value, list)
        and value
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value)
    ):
        raise StudyError(f"{where}: world_sizes must be a non-empty list of positive integers, got {value!r}")
    return tuple(value)


def _mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise StudyError(f"{where} must be a mapping, got {value!r}")
    return value


def parse_study(name: str, entry) -> Study:
    where = f"study {name!r}"
    entry = _mapping(entry, where)
    unknown = set(entry) - STUDY_KEYS
    if unknown:
        raise StudyError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a study has {', '.join(sorted(STUDY_KEYS))}"
        )
    if "profile" not in entry or "title" not in entry:
        raise StudyError(f"{where}: needs a title and a profile")
    repeats = entry.get("repeats", 1)
    if not (isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1):
        raise StudyError(f"{where}: repeats must be a positive integer, got {repeats!r}")
    ranks_per_node = entry.get("ranks_per_node")
    if ranks_per_node is not None and not (
        isinstance(ranks_per_node, int) and not isinstance(ranks_per_node, bool) and ranks_per_node >= 1
    ):
        raise StudyError(f"{where}: ranks_per_node must be a positive integer, got {ranks_per_node!r}")
    tolerance = entry.get("ratio_tolerance", Study.ratio_tolerance)
    if not (isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and 0 < tolerance < 1):
        raise StudyError(f"{where}: ratio_tolerance must be a fraction between 0 and 1, got {tolerance!r}")
    common = _mapping(entry.get("settings", {}), f"{where}: settings")
    study_sizes = entry.get("world_sizes")
    variants = []
    for variant_name, variant in _mapping(entry.get("variants", {"": {}}), f"{where}: variants").items():
        vwhere = f"{where}, variant {variant_name!r}" if variant_name else where
        variant = _mapping(variant or {}, vwhere)
        if set(variant) - VARIANT_KEYS:
            raise StudyError(
                f"{vwhere}: unknown key(s) {', '.join(sorted(set(variant) - VARIANT_KEYS))}; "
                f"a variant has {', '.join(sorted(VARIANT_KEYS))}"
            )
        sizes = variant.get("world_sizes", study_sizes)
        if sizes is None:
            raise StudyError(f"{vwhere}: no world_sizes (give them to the study or to each variant)")
        settings = common | _mapping(variant.get("settings", {}), f"{vwhere}: settings")
        link_rate = variant.get("link_rate", entry.get("link_rate"))
        cpus_per_node = variant.get("cpus_per_node", entry.get("cpus_per_node"))
        for key, value in (("link_rate", link_rate), ("cpus_per_node", cpus_per_node)):
            if value is not None and ranks_per_node is None:
                raise StudyError(f"{vwhere}: {key} sets an emulated cluster's nodes; give the study ranks_per_node")
        sizes = _world_sizes(sizes, vwhere)
        if ranks_per_node and any(n % ranks_per_node for n in sizes):
            raise StudyError(f"{vwhere}: every world size must be a multiple of ranks_per_node {ranks_per_node}")
        models = variant.get("models")
        if models is not None:
            _check_models(models, link_rate, cpus_per_node, ranks_per_node, vwhere)
        variants.append(Variant(str(variant_name), settings, sizes, link_rate, cpus_per_node, models))
    for k, variant in enumerate(variants):
        if variant.models and not any(
            not v.models and v.world_sizes == (1,) and v.cpus_per_node == variant.cpus_per_node for v in variants[:k]
        ):
            raise StudyError(
                f"{where}, variant {variant.name!r}: a variant that models a configuration needs a "
                f"one-node variant (world_sizes [1]) of its cpus_per_node listed before it: its first "
                f"run measures the compute the wind tunnel sets the links by"
            )
    return Study(
        name,
        str(entry["title"]),
        str(entry["profile"]),
        repeats,
        tuple(variants),
        bool(entry.get("allreduce", False)),
        ranks_per_node,
        float(tolerance),
    )


def _check_models(models, link_rate, cpus_per_node, ranks_per_node, where: str) -> None:
    """Check a modelled variant: a known configuration, one rank per node with a CPU share, and no link rate."""
    from ddp_core.analysis.similarity import CONFIGURATIONS

    if models not in CONFIGURATIONS:
        raise StudyError(f"{where}: models {models!r} is no configuration; they are: {', '.join(CONFIGURATIONS)}")
    if link_rate is not None:  # the wind tunnel sets it
        raise StudyError(f"{where}: models sets the links' rate on this host; drop link_rate {link_rate!r}")
    if ranks_per_node != 1 or cpus_per_node is None:  # R_N compares one node's compute with its link
        raise StudyError(
            f"{where}: models needs one rank per node (ranks_per_node: 1) and nodes with compute of "
            f"their own (cpus_per_node)"
        )


def load_study_list(path: str | Path = STUDY_LIST) -> dict[str, Study]:
    path = Path(path)
    try:
        entries = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise StudyError(f"cannot read the study list {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise StudyError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(entries, dict) or not entries:
        raise StudyError(f"{path}: the study list is a mapping of study name to study")
    return {name: parse_study(name, entry) for name, entry in entries.items()}


def at_world_sizes(studies: list[Study], sizes: list[int]) -> list[Study]:
    """The studies' runs of `sizes` ranks only. A one-GPU machine can train the 1-rank runs, and a four-GPU node the
    rest later, into the same folders that the runner reuses."""
    kept = []
    for study in studies:
        variants = tuple(
            replace(variant, world_sizes=tuple(n for n in variant.world_sizes if n in sizes))
            for variant in study.variants
        )
        if any(variant.world_sizes for variant in variants):
            kept.append(replace(study, variants=tuple(variant for variant in variants if variant.world_sizes)))
    if not kept:
        raise StudyError(
            f"no run of {', '.join(study.name for study in studies)} has {' or '.join(map(str, sizes))} rank(s)"
        )
    return kept


def on_profile(studies: list[Study], profile: str) -> list[Study]:
    """The studies on another base profile, e.g. `--profile gpu`. A study whose settings override the profile's is
    refused: that profile needs a study list sized for it."""
    try:
        sets = load_profile(profile)
    except UsageError as exc:
        raise StudyError(str(exc)) from None
    for study in studies:
        clash = sorted(
            {
                key
                for variant in study.variants
                for key, value in variant.settings.items()
                if key in sets and sets[key] != value
            }
        )
        if clash:  # e.g. a CPU-sized study's train_samples under a GPU profile: not a silent mix of the two
            raise StudyError(
                f"study {study.name!r} sets {', '.join(clash)} for its own profile {study.profile!r}, "
                f"which profile {profile!r} sets too; run a study list sized for {profile!r} (make report "
                f"PROFILE=gpu uses {GPU_STUDY_LIST.relative_to(REPO_ROOT)})"
            )
    return [replace(study, profile=profile) for study in studies]


def on_slurm(studies: list[Study], placement: SlurmPlacement) -> list[Study]:
    """The studies with every run a Slurm job placed as `placement` says. Emulated studies, and runs that do not
    fill whole nodes, are refused in one line."""
    for study in studies:
        if study.ranks_per_node is not None:  # emulated nodes are this machine's, not a cluster's
            raise StudyError(
                f"study {study.name!r} trains on nodes emulated on this machine: not on Slurm; name the "
                f"studies to submit (e.g. scaling)"
            )
        uneven = sorted(
            {
                n
                for variant in study.variants
                for n in variant.world_sizes
                if n > placement.ranks_per_node and n % placement.ranks_per_node
            }
        )
        if uneven:
            raise StudyError(
                f"study {study.name!r}: {', '.join(map(str, uneven))} ranks do not fill whole nodes of "
                f"{placement.ranks_per_node}"
            )
    return [replace(study, slurm=placement) for study in studies]


def select(studies: dict[str, Study], names: list[str]) -> list[Study]:
    """The named studies in list order, or all of them when none is named."""
    unknown = [n for n in names if n not in studies]
    if unknown:
        raise StudyError(f"no study {', '.join(map(repr, unknown))}; the studies are: {', '.join(studies)}")
    return [study for name, study in studies.items() if not names or name in names]
