"""The reference results shipped in the repository: they load, they carry their provenance, a fresh clone
builds the whole book from them without training, and a rebuild pointed at other runs (the PDF) shows those."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.single_device import LOOPS
from conftest import REPO, copy_project, repeat_medians, repeat_runs
from ddp_core.report import discussion, prediction, scaling_analysis, setup
from ddp_core.analysis import provenance
from ddp_core.analysis.comparisons import WARMUP_STEPS
from ddp_core.analysis.nvlink_forecast import load_timelines
from ddp_core.analysis.results import load_experiment, load_measurements, load_study, read_measurement, tidy_runs
from ddp_core.analysis.throughput import throughput_table
from ddp_core.studies.study_list import load_study_list

REFERENCE = REPO / "reference" / "scaling"


def test_the_reference_results_load_and_every_chapter_computes_from_them():
    experiment = load_experiment(REFERENCE)
    assert list(experiment.runs) == [1, 2, 4] and list(experiment.allreduce) == [2, 4]
    nodes = load_study(REPO / "reference" / "nodes")
    assert prediction.findings(experiment, load_timelines(REPO / "reference" / "gpu_timeline"))
    assert discussion.findings(experiment, nodes) and scaling_analysis.findings(experiment, None, nodes)
    assert setup.findings(experiment, REPO / "reference")
    assert len(tidy_runs(experiment)) == len(experiment.metrics)


def test_every_study_ships_reference_runs_that_name_their_machine_and_the_clean_commit_that_made_them():
    for name in load_study_list():
        for experiment in load_study(REPO / "reference" / name).values():
            for run in experiment.all_runs:
                for key in ("hostname", "device_name", "cpu_count", "torch", "start_time", "end_time"):
                    assert run.raw[key], f"{name}/{run.name}: {key} missing"
                assert len(run.raw["git_commit"]) == 40, f"{name}/{run.name}: made from uncommitted code"
                assert (experiment.folder / run.name / "run_experiment.ipynb").is_file()
    assert not list((REPO / "reference").rglob("checkpoint.pt")), "the reference results ship no model weights"


def test_the_shipped_single_device_measurements_name_their_device_and_the_clean_commit():
    measurements = load_measurements(REPO / "reference" / "single_device")
    assert measurements, "no single-device measurement is shipped"
    for m in measurements:
        assert m.info["end_time"] and len(m.info["git_commit"]) == 40, f"{m.name}: unfinished or uncommitted code"
        assert set(m.epochs["loop"]) == set(LOOPS) and throughput_table(m)["tflops"].gt(0).all()


def test_the_bucket_page_gives_each_drawn_step_beside_its_runs_median_step():
    from ddp_core.report.bucket_size import findings

    folder = REPO / "reference" / "bucket_size"
    found = findings(load_study(folder))
    for variant in ("one_bucket", "default_buckets", "one_mib_buckets"):
        run = folder / variant / "n2"  # repeat 1, the lowest seed, whose median step the page draws
        drawn = getattr(found, variant)
        assert drawn.drawn_ms == pytest.approx(pd.read_csv(run / "timeline.csv")["end_s"].max() * 1e3)
        steps = pd.read_csv(run / "steps.csv")["step_time_s"]
        assert drawn.median_ms == pytest.approx(steps.iloc[WARMUP_STEPS:].median() * 1e3)


@pytest.mark.parametrize(
    "study, prefix, variant", [("bucket_size", "bucket", "default_buckets"), ("compression", "compression", "fp32")]
)
def test_a_study_on_links_set_in_mbit_s_says_how_its_all_reduce_weighed_against_its_compute(study, prefix, variant):
    """The links of these studies are set in Mbit/s, so their verdicts belong to the CPU they ran on: the page says
    the all-reduce in flight a step over the step's compute, means over every repeat's epochs after the first."""
    from importlib import import_module

    folder = REPO / "reference" / study
    found = import_module(f"ddp_core.report.{study}").findings(load_study(folder))
    later = pd.concat(pd.read_csv(run / "metrics.csv") for run in (folder / variant).glob("n2*")).query("epoch > 1")
    per_step = lambda column: (later[column] / later["steps"]).mean()  # noqa: E731
    compute = (
        per_step("forward_time_s")
        + per_step("backward_time_s")
        - per_step("comm_exposed_s")
        + per_step("optimizer_time_s")
    )
    assert getattr(found, f"{prefix}_comm_over_compute") == pytest.approx(per_step("comm_total_s") / compute)


NODES = REPO / "reference" / "nodes"
# The sharding chapter's variants of the nodes study, and the mode of each: DDP's on the links the modes share.
SHARDING_VARIANTS = {"a100_nvlink": "none", "zero1": "zero1", "zero2": "zero2", "zero3": "zero3"}


def test_the_sharding_page_takes_each_modes_bytes_a_step_and_its_state_from_its_runs_csvs():
    """Bytes a step: each run's link count over its steps, in fp32 gradients, the median over the runs, and what
    gloo's algorithms send for the collectives the first run counted; the state a rank holds: parameters, gradients
    and optimizer state of the largest rank's last epoch, over DDP's."""
    from ddp_core.analysis.zero import MODE_NAMES, held_shares, memory_table, sharding_runs
    from ddp_core.report.sharding import traffic_table

    study = sharding_runs(load_study(NODES))
    traffic, held = traffic_table(study), held_shares(memory_table(study))["measured"]
    kinds = ["parameters_bytes", "gradients_bytes", "optimizer_state_bytes"]
    state = {}
    for variant, mode in SHARDING_VARIANTS.items():
        runs = repeat_runs(NODES / variant, 4)
        metrics = [pd.read_csv(run / "metrics.csv") for run in runs]
        parameters = 4 * int(pd.read_json(runs[0] / "run.json", typ="series")["parameters"])
        per_step = pd.Series([m["link_sent_bytes"].sum() / m["steps"].sum() / parameters for m in metrics]).median()
        assert traffic.loc[MODE_NAMES[mode], "sent_units"] == pytest.approx(per_step)
        counted = json.loads((runs[0] / "run.json").read_text())["collectives_per_step"]  # what gloo was handed
        sends = (
            sum(
                (2 if "allreduce" in name or "reduce_scatter" in name else 1) * entry["bytes"]
                for name, entry in counted.items()
            )
            * 3
            / 4
        )  # 4 nodes: over (N-1)/N
        assert traffic.loc[MODE_NAMES[mode], "gloo_units"] == pytest.approx(sends / parameters)
        state[mode] = max(m.iloc[-1][kinds].sum() for m in metrics)
    for mode in ("zero1", "zero2", "zero3"):
        assert held[MODE_NAMES[mode]] == pytest.approx(state[mode] / state["none"])


def test_the_sharding_page_gives_the_modes_loss_gap_to_ddp_as_the_power_of_ten_it_lies_within():
    """The modes' final losses differ from DDP's at float rounding: the page says how small, '1e-8', not 9.9e-09."""
    from ddp_core.analysis.zero import sharding_runs
    from ddp_core.report.sharding import findings, loss_gap

    study = sharding_runs(load_study(NODES))
    text = findings(study).sharding_loss_gap_text
    bound = re.fullmatch(r"1e-\d+", text)
    assert bound, text
    assert float(bound[0]) / 10 < loss_gap(study) <= float(bound[0])


def test_the_sharding_page_reads_the_nodes_studys_modes_with_the_ddp_and_one_node_of_their_links_and_share(tmp_path):
    """The modes are set against the DDP variant that models the same configuration on nodes of the same share (not
    the similarity test's, at another share) and that share's one node, which ran in the same rounds; a nodes study
    without sharded variants is refused in one line."""
    from ddp_core.analysis.results import ResultsError
    from ddp_core.analysis.zero import sharding_runs

    study = sharding_runs(load_study(NODES))
    assert set(study) == {"one_node", *SHARDING_VARIANTS}
    rounds = [
        [run.raw["start_time"] for e in study.values() for run in e.all_runs if run.config["seed"] == seed]
        for seed in sorted({run.config["seed"] for e in study.values() for run in e.all_runs})
    ]
    assert all(max(earlier) < min(later) for earlier, later in zip(rounds, rounds[1:])), "repeat k of each in round k"
    for variant in SHARDING_VARIANTS:
        assert {study[variant].baseline.config["sharding"]} == {SHARDING_VARIANTS[variant]}
    for variant in ("one_node", "a100_nvlink_half_share", "one_node_half_share", "h200_nvlink"):
        shutil.copytree(NODES / variant, tmp_path / "nodes" / variant)
    shutil.copy(NODES / "wind_tunnel.json", tmp_path / "nodes")
    with pytest.raises(ResultsError, match="no sharded variant in the nodes study"):
        sharding_runs(load_study(tmp_path / "nodes"))


def test_every_sharding_mode_runs_on_ddps_modelled_links_and_its_times_are_taken_round_by_round():
    """The modes' links: on each number of nodes the rate the wind tunnel set for DDP's ratio there, on every run's
    nodes; each mode's speedup on each number of nodes the median over the rounds of the one node's time per sample
    over the mode's (the same global batch); against DDP, each mode's time held against the floor of the chapter's
    runs, as the page's power of the rule is taken on them."""
    from ddp_core.analysis.comparisons import study_floor_power
    from ddp_core.analysis.zero import MODE_NAMES, sharding_runs, speedup_table, time_comparisons

    record = json.loads((NODES / "wind_tunnel.json").read_text())["variants"]
    counts = sorted(int(n) for n in record["a100_nvlink"]["by_nodes"])
    assert counts == [2, 4], "the modes run on 2 and 4 nodes"
    study = sharding_runs(load_study(NODES))
    table = speedup_table(study)
    chapter_floor = study_floor_power(study)["floor"]

    def medians(variant, n):
        rate = record[variant]["by_nodes"][str(n)]["link_rate"] if n > 1 else None
        for run in repeat_runs(NODES / variant, n) if n > 1 else ():
            assert json.loads((run / "network.json").read_text())["link_rate"] == rate
        return repeat_medians(NODES / variant, n)

    for n in counts:
        assert len({record[variant]["by_nodes"][str(n)]["link_rate"] for variant in SHARDING_VARIANTS}) == 1
        against_ddp = time_comparisons(study)[n]
        for variant, mode in SHARDING_VARIANTS.items():
            paired = [one / many for one, many in zip(medians("one_node", 1), medians(variant, n))]
            assert table.loc[MODE_NAMES[mode], f"speedup_n{n}"] == pytest.approx(pd.Series(paired).median())
            assert table.loc[MODE_NAMES[mode], f"speedup_low_n{n}"] == pytest.approx(min(paired))
            if mode != "none":  # its time per sample over DDP's on as many nodes, round by round
                paired = [mine / ddp for mine, ddp in zip(medians(variant, n), medians("a100_nvlink", n))]
                assert against_ddp[mode].ratio == pytest.approx(pd.Series(paired).median())
                assert against_ddp[mode].floor == pytest.approx(chapter_floor)


def test_the_first_pages_sharding_finding_gives_ddps_speedup_on_the_modes_links_from_the_nodes_studys_runs():
    """One DDP on the modes' links: the first page's is the nodes study's on links set for A100s over NVLink, over
    its one node, round by round, as ZeRO-3's beside it; each with the rule's verdict, which calls a speedup faster
    only where every round's lies above 1."""
    from ddp_core.analysis import zero

    found = zero.headline(zero.sharding_runs(load_study(NODES)))
    for mode, variant in (("ddp", "a100_nvlink"), ("zero3", "zero3")):
        paired = [
            one / many
            for one, many in zip(repeat_medians(NODES / "one_node", 1), repeat_medians(NODES / variant, found.nodes))
        ]
        assert getattr(found, f"{mode}_speedup") == pytest.approx(pd.Series(paired).median())
        verdict = getattr(found, f"{mode}_speedup_verdict")
        assert verdict in ("faster", "slower") or verdict.startswith("no visible difference")
        assert verdict != "faster" or min(paired) > 1
        assert verdict != "slower" or max(paired) < 1


def test_the_first_page_names_emulated_nodes_by_their_ratio_and_every_cluster_beside_its_own_forecast():
    """No emulated result under a GPU's name: the headline's nodes are named by the ratio their links were set to;
    each cluster whose ratio they borrow stands in a column of its own, with its forecast and never a measured
    speedup, and every cluster the wind tunnel modelled appears with its name."""
    from ddp_core.analysis.likeness import likeness_table
    from ddp_core.analysis.results import load_study
    from ddp_core.analysis.similarity import CONFIGURATIONS

    table = likeness_table(load_study(NODES))
    record = json.loads((NODES / "wind_tunnel.json").read_text())["variants"]
    names = [cluster.name for cluster in CONFIGURATIONS.values()]
    nodes = [name for name in table.index if "emulated nodes" in name]
    clusters = [name for name in table.index if name not in nodes]
    assert len(nodes) == len(clusters) == 2
    for emulated, cluster in zip(nodes, clusters):
        assert not any(name in emulated for name in names)
        assert table.loc[emulated, "speedup"].endswith("measured")
        assert table.loc[cluster, "speedup"].endswith("forecast")
        variant = next(v for v, entry in record.items() if cluster.endswith(entry["configuration"]))
        target = record[variant]["by_nodes"]["4"]["target_ratio"]
        assert emulated == f"4 emulated nodes, links set to ratio {target:.2g}"
        assert table.loc[cluster, "bench_ratio"] == target


def test_the_first_pages_one_device_finding_gives_each_configurations_floor_and_the_gpu_the_gpu_chapter_names():
    """The key findings' One device paragraph: the range of the CPU's per-configuration floors, as the One device
    page's ratio table gives them, and the verdicts of the GPU that the GPU finding beside it names."""
    from ddp_core.analysis.throughput import configuration_verdicts, ratio_overview

    cpu = read_measurement(REPO / "reference" / "single_device" / "cpu")
    floors = configuration_verdicts(cpu)["floor"]
    assert ratio_overview(cpu).floors == f"{floors.min():.1%} to {floors.max():.1%}"
    eager = read_measurement(REPO / "reference" / "single_device" / "cuda-nvidia-h200")
    assert ratio_overview(eager).overview_name == eager.info["device_name"]
    assert ratio_overview(eager).configurations == eager.epochs.groupby(["preset", "amp", "batch_size"]).ngroups


def test_the_sharding_page_says_how_far_apart_its_one_node_repeats_ran():
    """The drift each round's speedup carries: the one node's slowest median step over its fastest, less 1."""
    from ddp_core.analysis.zero import sharding_runs
    from ddp_core.report.sharding import findings

    found = findings(sharding_runs(load_study(NODES)))
    medians = repeat_medians(NODES / "one_node", 1)
    assert found.one_node_apart == pytest.approx(max(medians) / min(medians) - 1)


def test_the_methods_chapter_gives_each_studys_steps_a_run_from_its_csvs():
    """How many steps a run's time rests on: the median over the study's runs of the steps its epochs trained."""
    studies = load_study_list()
    table = provenance.floor_power_markdown(REPO / "reference", studies).splitlines()
    header = [cell.strip() for cell in table[0].split("|")[1:-1]]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in table[2:])}
    column = header.index(next(h for h in header if h.startswith("Steps a run")))
    for name in ("nodes", "scaling"):
        per_run = [pd.read_csv(path)["steps"].sum() for path in (REPO / "reference" / name).glob("**/metrics.csv")]
        assert float(rows[studies[name].title][column]) == pd.Series(per_run).median()


def test_the_similarity_tests_chance_to_find_a_difference_is_that_of_the_test_it_runs():
    """The nodes page's similarity test compares two speedups, each a ratio of two noisy steps: its chance to find a
    true 10 % difference is the rule's on that comparison: planted in the slower nodes' step on N nodes, held against
    the floor of every configuration of both sides for a ratio of four runs, as the test itself is."""
    from ddp_core.analysis.emulated import SIMILARITY_EFFECT, similarity_test, similarity_test_table
    from ddp_core.analysis.verdict import error_rates, noise_floor

    folder = REPO / "reference" / "nodes"
    row = similarity_test_table(load_study(folder)).iloc[0]
    assert (row["borrowed"], row["nodes"], row["share"], row["other_share"]) == ("A100s over NVLink", 4, 0.25, 0.125)

    def per_sample(variant, n):
        batches = [
            json.loads((run / "run.json").read_text())["global_batch_size"] for run in repeat_runs(folder / variant, n)
        ]
        return [step / batch for step, batch in zip(repeat_medians(folder / variant, n), batches)]

    repeats = [
        per_sample("one_node", 1),
        per_sample("a100_nvlink", 4),
        per_sample("one_node_half_share", 1),
        per_sample("a100_nvlink_half_share", 4),
        per_sample("a100_nvlink", 2),
        per_sample("a100_nvlink_half_share", 8),
    ]

    def speedups_apart(drawn, effect):
        return list(drawn[0] / drawn[1]), list(drawn[2] / (drawn[3] * (1 + effect)))

    expected = error_rates(repeats, [SIMILARITY_EFFECT], draws=500, planted=speedups_apart, runs=4)[SIMILARITY_EFFECT]
    assert row["finds_effect"] == pytest.approx(expected, abs=0.05)
    assert row["floor"] == pytest.approx(noise_floor(repeats, runs=4))  # the verdict's floor: four runs a ratio
    twin = json.loads((folder / "wind_tunnel.json").read_text())["variants"]["a100_nvlink"]["by_nodes"]["4"]
    assert similarity_test(load_study(folder)).setting == f"4 nodes, links set to ratio {twin['target_ratio']:.2g}"


@pytest.fixture(scope="module")
def clone(tmp_path_factory, isolated_env, offline) -> Path:
    """A copy of the project as a fresh clone has it, its book built as the PDF (`make pdf`) from the reference
    results alone, with no route out of the machine (`offline`). The HTML site is built from other runs by the tiny
    report of test_report.py."""
    if shutil.which("latexmk") is None and os.geteuid() != 0:
        pytest.skip("TeX is absent and installing it (make pdf runs apt-get) needs root")
    clone = copy_project(tmp_path_factory.mktemp("clone"))
    assert not (clone / "book" / "results").exists()
    subprocess.run(
        ["make", "-o", ".venv/.installed", "prepare"], cwd=clone, env=isolated_env, check=True, capture_output=True
    )  # TeX, where it is missing, needs the network
    proc = subprocess.run(
        [*offline, "make", "-o", ".venv/.installed", "pdf"],
        cwd=clone,
        env=isolated_env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return clone


def pdf_text(clone: Path) -> str:
    """The book's LaTeX with the glued values as plain text, on one line."""
    tex = (clone / "_build" / "latex" / "book.tex").read_text()
    return re.sub(r"\s+", " ", re.sub(r"\\DUrole\{pasted-text\}\{([^}]*)\}", r"\1", tex))


@pytest.mark.slow
def test_a_fresh_clone_builds_the_book_from_the_reference_results_without_training(clone):
    assert (clone / "book" / "results" / "scaling").resolve() == (clone / "reference" / "scaling").resolve()
    tex = pdf_text(clone)
    assert "From runs made by this build: none." in tex
    # the PDF lists every run in the runs chapter's table instead of printing a page per run
    assert not re.search(r"\\section\{Run on \d+ ranks?, repeat", tex)
    cells = re.sub(r"\\sphinxAtStartPar\s*", "", tex).replace(r"\sphinxhyphen{}", "-")
    for run in REFERENCE.glob("*/run.json"):
        started = json.loads(run.read_text())["start_time"][:16].replace("T", " ")
        assert re.search(rf"{run.parent.name} &[^&]*&[^&]*& {started} &", cells), run.parent.name
    assert not (clone / "results").exists(), "building the book must never train"


@pytest.mark.slow
def test_the_pdf_shows_the_reference_runs_with_its_equations_and_figures(clone):
    def step_s(n: int) -> float:  # the median over the repeats of each run's median step after its warm-up steps
        return pd.Series(repeat_medians(REFERENCE, n)).median()

    tex = pdf_text(clone)
    assert f"a step of the global batch takes {step_s(4):.3f} s, against {step_s(1):.3f} s on one rank" in tex
    assert tex.count(r"\begin{equation*}") + tex.count(r"\[") >= 8
    assert r"T_\text{ring}(S, N) = 2(N-1)\,\alpha" in tex
    latex = clone / "_build" / "latex"
    figures = re.findall(r"\\sphinxincludegraphics(?:\[[^\]]*\])?\{\{?([^}]+?)\}?\.png\}", tex)
    assert len(figures) >= 4 and all((latex / f"{name}.png").is_file() for name in figures)
    assert re.search(r"Output written on book\.pdf \(\d+ pages", (latex / "book.log").read_text())


@pytest.mark.slow
def test_no_word_of_a_pdf_table_runs_into_the_next_column(clone):
    """A word wider than its column (a header's "(samples/s)", an option `--per-rank-batch-size`) is set past the
    column's edge, into the next one: TeX reports its line as an overfull box, at a line of book.tex inside the
    table."""
    latex = clone / "_build" / "latex"
    in_table, inside = set(), False
    for number, line in enumerate((latex / "book.tex").read_text().splitlines(), 1):
        inside = inside or bool(re.match(r"\\begin\{(tabulary|longtable|tabular)\}", line))
        if inside:
            in_table.add(number)
        inside = inside and not re.match(r"\\end\{(tabulary|longtable|tabular)\}", line)
    overfull = re.findall(
        r"Overfull \\hbox \(([\d.]+)pt too wide\) in paragraph at lines \d+--(\d+)\n(.*)",
        (latex / "book.log").read_text(),
    )
    assert [(words, f"{wide} pt") for wide, line, words in overfull if int(line) in in_table] == []


def test_the_headline_is_the_emulated_nodes_fastest_link_and_names_what_cost_it_most():
    from ddp_core.analysis.emulated import headline, link_experiments
    from ddp_core.analysis.headline import EXPOSED
    from ddp_core.analysis.headline import headline as first_page_headline
    from ddp_core.analysis.speedups import scaling_table

    nodes = load_study(REPO / "reference" / "nodes")
    found = first_page_headline(load_experiment(REFERENCE), nodes)
    fastest = next(iter(link_experiments(nodes).values()))
    n, one = fastest.largest, fastest.baseline
    assert (found.units, found.most) == ("emulated nodes", n)
    assert found.speedup.shown == headline(nodes).fastest.speedup_shown
    table = scaling_table(fastest)
    exposed = table.loc[n, "comm_exposed_per_step_s"]  # below the all-reduce in flight: backward hid some of it
    undivided = table.loc[n, "compute_per_step_s"] - table.loc[1, "compute_per_step_s"] * (
        fastest.runs[n].per_rank_batch_size / one.per_rank_batch_size
    )
    assert found.limit_ms == pytest.approx(max(exposed, undivided) * 1e3)
    assert (found.limit == EXPOSED) == (exposed >= undivided)
    assert found.step_ms == pytest.approx(table.loc[n, "mean_step_s"] * 1e3)


def test_gpu_runs_of_the_results_chapter_are_the_headline_named_by_their_gpu_and_backend(tmp_path):
    from gpu_runs import GPU_NAME, as_gpu_runs
    from ddp_core.analysis.comparisons import speedup_comparisons
    from ddp_core.analysis.headline import headline, headline_runs

    gpus = load_experiment(as_gpu_runs(REFERENCE, tmp_path / "scaling"))
    nodes = load_study(REPO / "reference" / "nodes")
    assert headline_runs(gpus, nodes).experiment is gpus
    found = headline(gpus, nodes)
    largest = speedup_comparisons(gpus)[4]
    assert (found.units, found.setting, found.most) == (f"{GPU_NAME} GPUs", "with NCCL", 4)
    assert float(found.speedup.shown) == pytest.approx(largest.ratio, abs=0.05)
    assert (found.whose, found.made_on) == ("yours", f"4 {GPU_NAME} GPUs")


def test_the_first_pages_step_is_the_headlines_mean_step_cut_into_its_timed_parts():
    """The step drawn on the first page: its parts add up to the mean step, and the all-reduce's two parts to the
    all-reduce in flight, at the headline's most processes."""
    from ddp_core.analysis.headline import headline_runs
    from ddp_core.analysis.speedups import scaling_table
    from ddp_core.report.intro import step_parts

    parts = step_parts(REPO / "reference")
    experiment = headline_runs(load_experiment(REFERENCE), load_study(NODES)).experiment
    row = scaling_table(experiment).loc[experiment.largest]
    assert parts.processes == experiment.largest
    total = parts.forward_backward_ms + parts.exposed_ms + parts.optimizer_ms + parts.other_ms
    assert total == pytest.approx(row["mean_step_s"] * 1e3)
    assert parts.hidden_ms + parts.exposed_ms == pytest.approx(row["comm_total_per_step_s"] * 1e3)
    assert parts.exposed_ms == pytest.approx(row["comm_exposed_per_step_s"] * 1e3)
    assert parts.optimizer_ms == pytest.approx(row["optimizer_per_step_s"] * 1e3)
