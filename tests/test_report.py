"""The report: notebooks run under papermill, the book builds with warnings as errors, and what it
shows is what the CSVs say. Every test that reads the tiny end-to-end report (`project`) is in this file, which
one worker runs (`--dist loadfile`), so that the report is made once."""

import os
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jupytext
import nbformat
import pandas as pd
import papermill
import pytest

from conftest import (
    LEFT_OUT_OF_THE_TINY_REPORT,
    REPO,
    TINY_STUDIES,
    WORLD_SIZES,
    copy_project,
    ddp_variants,
    runnable_tiny_studies,
)
from ddp_core.launch.plan import rate_bits_per_s
from ddp_core.launch.local import run_local
from ddp_core.launch.plan import ExperimentError, Placement, prepare
from ddp_core.analysis.cluster_forecast import Cluster, cluster_forecast
from ddp_core.report import forecast, grad_accum, runs
from ddp_core.analysis.comparisons import WARMUP_STEPS
from ddp_core.analysis.results import load_study
from ddp_core.studies.study_list import interleaved, load_study_list
from ddp_core.studies.wind_tunnel import baseline_run


def page_text(site: Path, page: str) -> str:
    text = html.unescape(re.sub(r"<[^>]+>", " ", (site / f"{page}.html").read_text()))
    return re.sub(r"\s+", " ", text)


def as_ipynb(md: Path, folder: Path) -> Path:
    path = folder / (md.stem + ".ipynb")
    jupytext.write(jupytext.read(md), path)
    return path


def test_each_run_keeps_its_executed_notebook_next_to_its_csvs(project):
    for n in WORLD_SIZES:
        run_dir = project / "results" / "scaling" / f"n{n}"
        assert {"metrics.csv", "run.json", "run_experiment.ipynb"} <= {p.name for p in run_dir.iterdir()}
        assert (project / "_build" / "html" / "results" / "scaling" / f"n{n}" / "run_experiment.html").is_file()
        # the runs share a kernel: each notebook still reads as if run alone, numbered from 1, its own output only
        code = [
            cell
            for cell in nbformat.read(run_dir / "run_experiment.ipynb", as_version=4).cells
            if cell.cell_type == "code"
        ]
        assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
        printed = "".join(output.get("text", "") for cell in code for output in cell.outputs)
        assert f"train: results/scaling/n{n}\n" in printed
        assert [m for m in WORLD_SIZES if f"scaling/n{m}" in printed] == [n]


def test_the_book_shows_the_projects_own_runs_and_offers_every_epoch_it_shows_as_one_csv(project):
    assert (project / "book" / "results" / "scaling").resolve() == (project / "results" / "scaling").resolve()
    [table] = (project / "_build" / "html").glob("_downloads/*/all_runs.csv")
    shown = [(project / "book" / "results" / name).resolve() for name in STUDIES]  # own runs, else the reference
    # the wind tunnel's one-node runs are the nodes page's, not a study's
    epochs = {
        name: sum(
            len(pd.read_csv(metrics))
            for metrics in folder.glob("**/metrics.csv")
            if "wind_tunnel" not in metrics.relative_to(folder).parts
        )
        for name, folder in zip(STUDIES, shown)
    }
    assert pd.read_csv(table).groupby("study").size().to_dict() == epochs


def test_theory_page_renders_its_equations_with_local_mathjax(project):
    site = project / "_build" / "html"
    theory = (site / "theory.html").read_text()
    assert theory.count('class="math notranslate nohighlight"') >= 10
    assert r"T_\text{ring}(S, N) = 2(N-1)\,\alpha + 2\,\frac{N-1}{N}\, S\, \beta" in html.unescape(theory)
    assert 'src="_static/mathjax/tex-chtml.js' in theory and "cdn" not in theory.lower()
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()


def test_results_page_has_its_figures(project):
    site = project / "_build" / "html" / "notebooks"
    images = re.findall(r'<img[^>]+src="([^"]+\.png)"', (site / "scaling_analysis.html").read_text())
    assert len(images) >= 4
    assert all((site / src).resolve().is_file() for src in images)


def test_numbers_in_the_prose_are_those_of_the_csvs(project):
    folder = project / "results" / "scaling"
    runs = {n: pd.read_csv(folder / f"n{n}" / "metrics.csv") for n in WORLD_SIZES}
    per_sample = {
        n: pd.read_csv(folder / f"n{n}" / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
        / runs[n]["global_batch_size"].iloc[0]
        for n in WORLD_SIZES
    }
    largest = max(WORLD_SIZES)
    speedup = per_sample[1] / per_sample[largest]
    text = page_text(project / "_build" / "html", "notebooks/scaling_analysis")
    step = {n: per_sample[n] * runs[n]["global_batch_size"].iloc[0] for n in WORLD_SIZES}
    assert f"a step of the global batch takes {step[largest]:.3f} s, against {step[1]:.3f} s on one rank" in text
    assert f"the speedup is {speedup:.2f} (one run each)" in text
    assert f"The parallel efficiency is {speedup / largest:.1%}" in text
    assert f"it is {runs[1]['val_accuracy'].iloc[-1]:.3f} on one rank" in text
    discussion = page_text(project / "_build" / "html", "discussion")
    assert f"the speedup at {largest} ranks is {speedup:.2f} (one run each)" in discussion
    assert f"That median speedup means a parallel efficiency of {speedup / largest:.1%}" in discussion


def test_the_allreduce_benchmark_reports_time_and_the_nccl_tests_bandwidths(project):
    bench = pd.read_csv(project / "results" / "scaling" / "allreduce-n4" / "allreduce.csv")
    assert list(bench["size_bytes"]) == [4**k for k in range(1, 11)]  # the tiny report's --max-bytes: 1 MiB
    assert (bench["time_s"] > 0).all() and (bench["world_size"] == 4).all()
    assert bench["algbw_GBps"].tolist() == pytest.approx((bench["size_bytes"] / bench["time_s"] / 1e9).tolist())
    assert bench["busbw_GBps"].tolist() == pytest.approx((bench["algbw_GBps"] * 2 * (4 - 1) / 4).tolist())


def test_a_finished_run_is_reused_and_one_with_other_settings_refused(project):
    common = dict(
        world_size=1, placement=Placement(), results_dir=str(project / "results"), experiment="scaling", profile="tiny"
    )
    assert prepare(**common).action == "reuse"
    with pytest.raises(ExperimentError, match="holds a run with other settings \\(--lr\\)"):
        prepare(**common, overrides={"lr": 0.01})


def test_a_run_stopped_before_its_first_checkpoint_is_left_alone(project, tmp_path):
    run_dir = tmp_path / "results" / "scaling" / "n1"
    run_dir.mkdir(parents=True)
    info = json.loads((project / "results" / "scaling" / "n1" / "run.json").read_text()) | {"end_time": None}
    (run_dir / "run.json").write_text(json.dumps(info))
    plan = prepare(
        world_size=1, placement=Placement(), results_dir=str(tmp_path / "results"), experiment="scaling", profile="tiny"
    )
    assert plan.action == "interrupted"
    with pytest.raises(ExperimentError, match="stopped before its first checkpoint"):
        run_local(plan)
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]


@pytest.mark.parametrize(
    "parameters,message",
    [
        ({"world_size": 0}, "world_size must be a positive integer, got 0"),
        ({"launcher": "mpi"}, "unknown launcher 'mpi'; choose from local, slurm"),
        ({"overrides": {"dataset": "mnist"}}, "invalid choice: 'mnist'"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0, got -1"),
        ({"launcher": "slurm", "slurm_gpus_per_rank": -1}, "slurm_gpus_per_rank must be an integer >= 0"),
    ],
    ids=["world_size 0", "unknown launcher", "unknown dataset", "negative restarts", "negative GPUs"],
)
def test_a_bad_parameter_fails_the_first_cell_in_one_line(tmp_path, parameters, message):
    notebook = as_ipynb(REPO / "notebooks" / "run_experiment.md", tmp_path)
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        papermill.execute_notebook(
            notebook,
            tmp_path / "out.ipynb",
            cwd=tmp_path,
            progress_bar=False,
            parameters={"results_dir": str(tmp_path / "results"), **parameters},
        )
    assert failure.value.ename == "ExperimentError"
    assert message in failure.value.evalue and "\n" not in failure.value.evalue
    executed = [c for c in jupytext.read(tmp_path / "out.ipynb").cells if c.cell_type == "code"]
    failed = next(i for i, c in enumerate(executed) if any(o.get("output_type") == "error" for o in c.outputs))
    assert "prepare(" in executed[failed].source
    parameter_tags = {"parameters", "injected-parameters"}
    assert all(parameter_tags & set(executed[i].metadata.get("tags", [])) for i in range(failed))
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda run: (run / "metrics.csv").unlink(), "metrics.csv: missing"),
        (lambda run: (run / "metrics.csv").write_text("epoch,world_size\n1,1\n"), "metrics.csv: missing column(s)"),
        (lambda run: (run / "metrics.csv").write_bytes(b'epoch,"world\n\x00\x01'), "metrics.csv: unreadable CSV"),
        (
            lambda run: metrics_of(run).assign(epoch_time_s="fast").to_csv(run / "metrics.csv", index=False),
            "metrics.csv: empty or non-numeric values",
        ),
        (
            lambda run: (run / "run.json").write_text(json.dumps({"world_size": 4})),
            "run.json: not a run's record (missing",
        ),
        (lambda run: (run / "run.json").write_text("[4]"), "run.json: not a run's record (missing world_size"),
        (lambda run: (run / "run.json").unlink(), "run.json: missing (a run's metrics without its record"),
    ],
    ids=[
        "missing CSV",
        "CSV without its columns",
        "corrupt CSV",
        "a word for a time",
        "run.json without its fields",
        "run.json not a mapping",
        "metrics without run.json",
    ],
)
def test_analysis_names_the_bad_file_and_the_reason(project, tmp_path, damage, reason):
    results = tmp_path / "experiment"
    shutil.copytree(project / "results" / "scaling", results)
    damage(results / "n4")
    notebook = as_ipynb(REPO / "notebooks" / "scaling_analysis.md", tmp_path)
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        papermill.execute_notebook(
            notebook, tmp_path / "out.ipynb", cwd=tmp_path, progress_bar=False, parameters={"results": str(results)}
        )
    assert failure.value.ename == "ResultsError"
    assert str(results / "n4" / reason.split(":")[0]) in failure.value.evalue
    assert reason.split(": ")[1] in failure.value.evalue


# The studies of the tiny report -------------------------------------------------------------------------------

STUDIES = load_study_list()


def metrics_of(folder) -> pd.DataFrame:
    return pd.read_csv(folder / "metrics.csv")


def test_the_studies_the_tiny_report_left_out_are_shown_from_the_reference_results_and_said_to_be(project):
    for name in LEFT_OUT_OF_THE_TINY_REPORT:
        assert (project / "book" / "results" / name).resolve() == (project / "reference" / name).resolve()
    made_here = ", ".join(study.title for name, study in STUDIES.items() if name in runnable_tiny_studies())
    from_reference = ", ".join(study.title for name, study in STUDIES.items() if name not in runnable_tiny_studies())
    page = re.sub(r"\s+([.,:)])", r"\1", re.sub(r"\(\s+", "(", page_text(project / "_build" / "html", "studies")))
    assert f"From runs made by this build: {made_here}." in page
    assert f"From the shipped reference: {from_reference}, the CPU quota period (emulated nodes)," in page


def test_make_report_prints_a_line_per_run_with_its_time_and_no_kernel_chatter(project):
    printed = (project.parent / "make-report.log").read_text()
    runs = [run.folder for run in interleaved(list(runnable_tiny_studies().values()))]
    lines = re.findall(r"^\[(\d+)/(\d+)\] (\S+): train in \d+ s$", printed, re.MULTILINE)
    assert [(int(i), int(n), folder) for i, n, folder in lines] == [(i, len(runs), f) for i, f in enumerate(runs, 1)]
    assert re.search(r"^scaling: all-reduce benchmark on 4 ranks: done in \d+ s$", printed, re.MULTILINE), printed
    assert "[IPKernelApp]" not in printed, printed  # how a notebook kernel's own log lines start


def test_running_the_studies_again_reuses_every_finished_run(project, isolated_env):
    before = {p: p.stat().st_mtime_ns for p in (project / "results").rglob("*.csv")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddp_core.studies.run",
            "--study-list",
            str(TINY_STUDIES),
            "--results-dir",
            "results",
            *runnable_tiny_studies(),
        ],
        cwd=project,
        env=isolated_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    runs = sum(len(study.runs()) for study in runnable_tiny_studies().values())
    assert proc.stdout.count("done before, reused") == runs
    assert {p: p.stat().st_mtime_ns for p in (project / "results").rglob("*.csv")} == before


def test_gradient_accumulation_and_ddp_train_the_same_model_as_one_batch(project):
    folder = project / "results" / "grad_accum"
    runs = {"one_batch": "n1", "accumulated": "n1", "ddp": "n2"}
    losses = {name: metrics_of(folder / name / run)[["train_loss", "val_loss"]] for name, run in runs.items()}
    worst = max(float((losses[name] - losses["one_batch"]).abs().max().max()) for name in runs)
    assert worst < 1e-4
    study = load_study(folder)
    assert grad_accum.loss_gap(grad_accum.accumulation_table(study)) == pytest.approx(worst)
    assert grad_accum.findings(study).accum_same_model == "the same model"


def test_the_runs_page_lists_each_run_with_its_seed_and_its_last_epoch_as_its_csv_wrote_it():
    folder = REPO / "reference" / "scaling"
    header, _, *rows = runs.runs_markdown(folder).splitlines()
    assert [cell.strip() for cell in header.strip("|").split("|")] == [
        "Run",
        "Ranks",
        "Seed",
        "Started (UTC)",
        "Epochs",
        "Last epoch (s)",
        "Validation accuracy",
    ]
    shown = {cells[0]: cells[1:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}
    assert set(shown) == {run.name for run in folder.glob("*/run.json") for run in [run.parent]}
    for name, (ranks, seed, started, epochs, epoch_s, accuracy) in shown.items():
        info = json.loads((folder / name / "run.json").read_text())
        last = pd.read_csv(folder / name / "metrics.csv").iloc[-1]
        assert (ranks, seed) == (str(info["world_size"]), str(info["config"]["seed"]))
        assert started == info["start_time"][:16].replace("T", " ") and epochs == str(int(last["epoch"]))
        assert (epoch_s, accuracy) == (f"{last['epoch_time_s']:.2f}", f"{last['val_accuracy']:.3f}")


def test_the_accumulation_page_gives_loss_gaps_at_float_rounding_as_the_power_of_ten_they_lie_below():
    """The reference runs' losses agree to float rounding: the page and its table say how small the gap is ('1e-7',
    'below 1e-7'), not its digits (3.2e-08, 2.0e-08), and the table's first variant, against itself, reads 0."""
    study = load_study(REPO / "reference" / "grad_accum")
    table = grad_accum.accumulation_table(study)
    gaps = table["max_train_loss_gap"]
    header, alignment, *rows = grad_accum.accumulation_markdown(study).splitlines()
    row = next(
        [cell.strip() for cell in line.strip("|").split("|")] for line in rows if "Largest training-loss gap" in line
    )
    assert row[1] == "0" and gaps.iloc[0] == 0
    for cell, gap in zip(row[2:], gaps.iloc[1:]):
        bound = re.fullmatch(r"below (1e-\d+)", cell)
        assert bound and float(bound[1]) / 10 < gap <= float(bound[1]), cell
    assert all(cell.strip().endswith(":") for cell in alignment.strip("|").split("|")[1:])  # numbers: right-aligned
    bound = re.fullmatch(r"1e-\d+", grad_accum.findings(study).accum_loss_gap_text)
    assert bound and float(bound[0]) / 10 < grad_accum.loss_gap(table) <= float(bound[0])


@pytest.mark.parametrize("name", [name for name in STUDIES if name != "scaling"])
def test_each_study_page_shows_its_figure_or_table(project, name):
    page = (project / "_build" / "html" / "studies" / f"{name}.html").read_text()
    assert "<table" in page
    assert "Traceback" not in page


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_the_link_study_takes_each_links_speedup_against_the_one_node_runs(project):
    from ddp_core.analysis.emulated import link_table

    folder = project / "results" / "nodes"
    table = link_table(load_study(folder)).set_index("link")

    def per_sample(run_dir):
        steps = pd.read_csv(run_dir / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
        return steps / json.loads((run_dir / "run.json").read_text())["global_batch_size"]

    one_node = per_sample(folder / "one_node" / "n1")
    assert table.loc["100 Mbit/s", "speedup"] == pytest.approx(one_node / per_sample(folder / "100mbit" / "n2"))
    assert table.loc["unshaped", "speedup"] == pytest.approx(one_node / per_sample(folder / "unshaped" / "n2"))
    network = json.loads((folder / "100mbit" / "n2" / "network.json").read_text())
    assert table.loc["100 Mbit/s", "measured_gbit_s"] == pytest.approx(network["measured_gbit_s"])
    # each node has the one node's CPU share: a rank's compute is predicted as the one node's over the nodes
    one = metrics_of(folder / "one_node" / "n1").iloc[1:]
    one_node_compute = (
        (one["forward_time_s"] + one["backward_time_s"] + one["optimizer_time_s"]) / one["steps"]
    ).mean()
    assert table["predicted_compute_s"].tolist() == pytest.approx([one_node_compute / 2] * len(table))


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_each_point_of_the_efficiency_curve_sits_at_its_runs_compute_over_their_exposed_all_reduce(project):
    """x = R_N / f = (T_c / N) / (the all-reduce a step waited for), from the steady epochs' CSV rows; the theory's
    efficiency there is x / (1 + x), and the point's efficiency is measured by the same statistic, mean steps."""
    from ddp_core.analysis.emulated import efficiency_table

    folder = project / "results" / "nodes"
    table = efficiency_table(load_study(folder)).set_index("configuration")
    one = metrics_of(folder / "one_node" / "n1").iloc[1:]
    one_node_compute = (
        (one["forward_time_s"] + one["backward_time_s"] + one["optimizer_time_s"]) / one["steps"]
    ).mean()
    two = metrics_of(folder / "100mbit" / "n2").iloc[1:]
    x = (one_node_compute / 2) / (two["comm_exposed_s"] / two["steps"]).mean()
    row = table.loc["100 Mbit/s"]
    assert (row["ratio_over_exposed"], row["theory_efficiency"]) == pytest.approx((x, x / (1 + x)))
    mean_step = lambda epochs: (epochs["epoch_time_s"] / epochs["steps"]).mean()  # noqa: E731
    assert row["efficiency"] == pytest.approx(mean_step(one) / (2 * mean_step(two)))
    assert row["efficiency_low"] <= row["efficiency"] <= row["efficiency_high"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_the_measured_gradient_profile_is_when_the_one_nodes_buckets_were_ready_within_its_backward(project):
    from ddp_core.engine.model_cost import bucket_sizes
    from ddp_core.report.nodes import gradient_ready_table

    folder = project / "results" / "nodes"
    timeline = pd.read_csv(folder / "one_node" / "n1" / "timeline.csv").set_index("what")
    start, end = timeline.loc["backward", "start_s"], timeline.loc["backward", "end_s"]
    sizes = bucket_sizes(json.loads((folder / "one_node" / "n1" / "run.json").read_text())["model"])
    measured = (
        gradient_ready_table(load_study(folder))
        .groupby("model", sort=False)
        .get_group("tiny model, measured on one node")
    )
    assert measured["backward_done"].tolist() == pytest.approx(
        [
            (timeline.loc[f"gradients ready, bucket {k}", "start_s"] - start) / (end - start)
            for k in range(1, len(sizes) + 1)
        ]
    )
    assert measured["bytes_ready"].tolist() == pytest.approx(list(pd.Series(sizes).cumsum() / sum(sizes)))


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_the_wind_tunnels_file_reads_back_as_the_record_it_was_written_from(project, tmp_path):
    """One place writes and reads wind_tunnel.json: a field the reader dropped or renamed would change the file."""
    from ddp_core.engine.wind_tunnel_file import read_wind_tunnel

    folder = project / "results" / "nodes"
    record = read_wind_tunnel(folder)
    assert record.variants and all(isinstance(n, int) for v in record.variants.values() for n in v.by_nodes)
    record.save(tmp_path)
    written = json.loads((folder / "wind_tunnel.json").read_text())
    assert json.loads((tmp_path / "wind_tunnel.json").read_text()) == written


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_the_similarity_test_sets_a_configuration_on_slower_nodes_against_the_same_on_faster_ones(project):
    """At tiny scale (steps of milliseconds, shorter than a node's quota period) the speedups need not agree; what
    holds at any scale: both shares reach the configuration's ratio, the slower nodes get slower links for it, and
    each speedup is taken over the one node of its own share."""
    from ddp_core.analysis.emulated import similarity_test_table

    folder = project / "results" / "nodes"
    record = json.loads((folder / "wind_tunnel.json").read_text())
    variants = record["variants"]
    fast, slow = (variants[name]["by_nodes"]["2"] for name in ("a100_ethernet", "a100_ethernet_half_share"))
    assert fast["target_ratio"] == slow["target_ratio"]
    for entry in (fast, slow):
        assert abs(entry["achieved_ratio"] / entry["target_ratio"] - 1) <= record["tolerance"]
    assert rate_bits_per_s(slow["link_rate"]) < rate_bits_per_s(fast["link_rate"])

    def per_sample(run_dir):
        steps = pd.read_csv(run_dir / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
        return steps / json.loads((run_dir / "run.json").read_text())["global_batch_size"]

    (row,) = similarity_test_table(load_study(folder)).itertuples()
    assert (row.borrowed, row.nodes, row.share, row.other_share) == ("A100s over 32 Gbit/s Ethernet", 2, 0.5, 0.25)
    assert row.speedup == pytest.approx(
        per_sample(folder / "one_node" / "n1") / per_sample(folder / "a100_ethernet" / "n2")
    )
    assert row.other_speedup == pytest.approx(
        per_sample(folder / "one_node_half_share" / "n1") / per_sample(folder / "a100_ethernet_half_share" / "n2")
    )
    assert row.verdict == "too few repeats"  # one run each: the rule gives no verdict on it


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_each_round_is_forecast_from_its_own_one_node_before_its_runs(project):
    """The replay's one node in round k: repeat k of the one-node run, its median step after the warm-up, as every
    run's step is taken, not the length of the one step its timeline drew; written before round k's run started."""
    folder = project / "results" / "nodes"
    record = json.loads((folder / "wind_tunnel.json").read_text())
    study = load_study_list(TINY_STUDIES)["nodes"]
    for variant, modelled in ddp_variants(folder, record).items():  # the sharded modes have no DDP to replay
        for n, entry in modelled["by_nodes"].items():
            assert entry["forecasts"]
            for ahead in entry["forecasts"]:
                k = ahead["repeat"]
                one_node = baseline_run(study, modelled["cpus_per_node"], str(project / "results"), k)
                median = pd.read_csv(one_node / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
                assert ahead["one_node_step_s"] == pytest.approx(median)
                run = folder / variant / (f"n{n}" + (f"-r{k}" if k > 1 else ""))
                assert ahead["at"] < json.loads((run / "run.json").read_text())["start_time"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_the_key_findings_table_says_why_from_the_runs_ratio_against_the_break_even(project):
    """Break-even f/(N-1), f the share of the all-reduce in flight that a step waited for (steady epochs' CSV rows);
    R_N the one node's compute per step over N, over the all-reduce in flight."""
    from ddp_core.report.intro import summary_table

    folder = project / "results" / "nodes"
    one = metrics_of(folder / "one_node" / "n1").iloc[1:]
    one_node_compute = (
        (one["forward_time_s"] + one["backward_time_s"] + one["optimizer_time_s"]) / one["steps"]
    ).mean()
    two = metrics_of(folder / "100mbit" / "n2").iloc[1:]
    in_flight, exposed = (two["comm_total_s"] / two["steps"]).mean(), (two["comm_exposed_s"] / two["steps"]).mean()
    ratio, break_even = one_node_compute / 2 / in_flight, exposed / in_flight
    row = summary_table(project / "results").set_index("setting").loc["2 nodes, 100 Mbit/s links"]
    assert row["why"] == f"$R_N$ {ratio:.2f} {'>' if ratio > break_even else '<'} {break_even:.2f}"


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_a_node_that_did_not_get_its_share_is_named_and_the_others_show_what_they_used(project, tmp_path):
    from ddp_core.report.nodes import disturbed_runs, fidelity_table

    folder = shutil.copytree(project / "results" / "nodes", tmp_path / "nodes")
    network = json.loads((folder / "100mbit" / "n2" / "network.json").read_text())
    used = [
        node["cpu_s"] / (node["periods"] * network["cpu_period_ms"] / 1e3) / network["cpus_per_node"]
        for node in network["node_cpu"]
    ]
    row = fidelity_table(load_study(folder)).set_index("run").loc["100mbit/n2"]
    assert (row["used_share"], row["used_share_low"]) == pytest.approx((pd.Series(used).median(), min(used)))
    starved = json.loads((folder / "one_node" / "n1" / "network.json").read_text())
    starved["node_cpu"][0]["cpu_s"] *= 0.5  # the one node computed half of its quota
    (folder / "one_node" / "n1" / "network.json").write_text(json.dumps(starved))
    assert "one_node/n1" in disturbed_runs(load_study(folder)).split(", ")


@pytest.mark.skipif(os.geteuid() != 0, reason="the tiny link study runs on emulated nodes, which need root")
def test_each_link_of_the_link_study_trains_and_benchmarks_over_two_nodes_at_its_rate(project):
    folder = project / "results" / "nodes"
    for variant, rate in (("unshaped", None), ("100mbit", "100mbit")):
        network = json.loads((folder / variant / "n2" / "network.json").read_text())
        assert (network["nodes"], network["ranks_per_node"], network["link_rate"]) == (2, 1, rate)
        epochs = json.loads((folder / variant / "n2" / "run.json").read_text())["config"]["epochs"]
        assert len(metrics_of(folder / variant / "n2")) == epochs
    largest = {
        variant: pd.read_csv(folder / variant / "allreduce-n2" / "allreduce.csv")["time_s"].iloc[-1]
        for variant in ("unshaped", "100mbit")
    }
    # On 2 ranks a ring all-reduce sends the whole message (the tests' largest: 1 MiB) each way: 84 ms at 100 Mbit/s.
    # No load makes a link faster than its rate; an unshaped one took 3 ms alone, 13 ms on a loaded machine.
    at_100mbit = 2**20 * 8 / 100e6
    assert largest["100mbit"] >= 0.9 * at_100mbit and largest["unshaped"] < at_100mbit / 2


def test_a_run_the_machine_disturbed_is_named_in_the_methods_chapter(project, tmp_path):
    """Other processes' cores call a run on shared cores disturbed; on emulated nodes (the kernel's link work counts
    as other processes) only more than a quiet machine's launcher and links use; and the hypervisor's share."""
    from ddp_core.analysis.provenance import quiet_machine_table
    from ddp_core.analysis.results import EMULATED_OTHER_CORES, OTHER_CORES, STOLEN

    results = tmp_path / "results"
    for name in ("scaling", "nodes"):
        shutil.copytree(project / "results" / name, results / name)

    def disturb(run_dir, other_cores=0.0, stolen=0.0):
        info = json.loads((run_dir / "run.json").read_text())
        machine = info["machine"]
        machine["other_cpu_s"] = other_cores * machine["wall_s"]
        machine["steal_cpu_s"] = stolen * machine["wall_s"] * machine["cores"]
        (run_dir / "run.json").write_text(json.dumps(info))

    for run_dir in [*results.glob("*/n*"), *results.glob("*/*/n*")]:
        disturb(run_dir)
    disturb(results / "scaling" / "n4", other_cores=OTHER_CORES * 2)
    disturb(results / "nodes" / "100mbit" / "n2", other_cores=OTHER_CORES * 2)  # a quiet machine's link work
    disturb(results / "nodes" / "unshaped" / "n2", other_cores=EMULATED_OTHER_CORES * 1.1)
    disturb(results / "nodes" / "one_node" / "n1", stolen=STOLEN * 2)
    table = quiet_machine_table(results, {name: STUDIES[name] for name in ("scaling", "nodes")})
    assert table.loc[STUDIES["scaling"].title, "disturbed"] == "`n4`"
    nodes = f"{STUDIES['nodes'].title} (emulated nodes)"
    assert table.loc[nodes, "disturbed"] == "`one_node/n1`, `unshaped/n2`"
    assert table.loc[nodes, "stolen_most"] == pytest.approx(STOLEN * 2)


def runs_shown(site: Path, page: str) -> str:
    """What a page's first line says of its runs: "yours" or "the shipped reference"."""
    found = re.search(r"Runs shown: (yours|the shipped reference)", page_text(site, page))
    assert found, f"{page} does not say whose runs it shows"
    return found[1]


def test_every_study_page_says_first_whether_it_shows_your_runs_or_the_shipped_reference(project):
    site = project / "_build" / "html"
    for name in STUDIES:
        page = "notebooks/scaling_analysis" if name == "scaling" else f"studies/{name}"
        assert runs_shown(site, page) == ("yours" if name in runnable_tiny_studies() else "the shipped reference")
    intro = re.sub(r"\s+([:.,])", r"\1", page_text(site, "intro"))
    whose = "yours" if "nodes" in runnable_tiny_studies() else "the shipped reference"
    assert re.search(rf"The headline’s runs are {whose}: made \d{{4}}-\d\d-\d\d( to \d{{4}}-\d\d-\d\d)? on", intro)


def test_a_book_of_your_gpu_runs_leads_with_them_and_calls_them_gpus(project, isolated_env, offline):
    """A book built from a scaling study on one node of four GPUs (tests/gpu_runs.py: the tiny report's runs,
    relabelled) and the shipped reference for the rest, on a compute node with no route out (`offline`), from a
    prepared project (its venv, MathJax and TeX already there): the site, and as a user without root where that user
    can run the venv's interpreter, the PDF too."""
    from gpu_runs import GPU_NAME, as_gpu_runs

    as_user = (
        os.geteuid() == 0
        and shutil.which("setpriv")
        and shutil.which("latexmk")
        and subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                f"{REPO}/.venv/bin/python -c ''",
            ],
            capture_output=True,
        ).returncode
        == 0
    )  # the venv's interpreter may lie where only root reaches (/root)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-book-"))  # under /tmp: the other user can reach it
    try:
        results = as_gpu_runs(project / "results" / "scaling", scratch / "results" / "scaling").parent
        book = copy_project(scratch / "project")
        env = dict(
            isolated_env,
            HOME=str(scratch),
            TMPDIR=str(scratch),
            HF_HOME=str(scratch / "hf"),
            DDP_CORE_CACHE_DIR=str(scratch / "tokens"),
        )
        user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_user else []
        if as_user:
            subprocess.run(["chown", "-R", "65534:65534", scratch], check=True)
            os.chmod(scratch, 0o755)
        for target in ("book", "pdf") if as_user else ("book",):
            proc = subprocess.run(
                [*offline, *user, "make", "-o", ".venv/.installed", target, f"RESULTS_DIR={results}"],
                cwd=book,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=900,
            )
            assert proc.returncode == 0, proc.stdout[-3000:]
        site = book / "_build" / "html"
        intro = re.sub(r"\s+([:.,])", r"\1", page_text(site, "intro"))
        assert "The headline’s runs are yours: made" in intro and f"on 4 {GPU_NAME} GPUs." in intro
        assert f"On 4 {GPU_NAME} GPUs with NCCL, a step ran" in intro
        assert "Emulated nodes, the shipped reference:" in intro
        assert runs_shown(site, "notebooks/scaling_analysis") == "yours"
        assert runs_shown(site, "studies/nodes") == "the shipped reference"
        for page in ("intro", "notebooks/scaling_analysis", "discussion"):
            text = page_text(site, page)
            assert "each had a GPU of its own" in text
            for cpu_words in ("shared one machine", "CPU cores in all", "Ranks on one machine", "these shared cores"):
                assert cpu_words not in text, (page, cpu_words)
        if as_user:
            assert f"4 {GPU_NAME} GPUs" in (book / "_build" / "latex" / "book.tex").read_text()
            assert (book / "_build" / "latex" / "book.pdf").stat().st_size > 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def shown_speedup(page: str, query: str, offline: list[str]) -> float:
    """The speedup the built page shows for the choices in `query`, read from its DOM after its script ran in
    headless Chromium, with no network."""
    proc = subprocess.run(
        [
            *offline,
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
            f"file://{page}?{query}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'id="forecast-answer"[^>]*data-speedup="([^"]+)"', proc.stdout)
    assert found, proc.stderr[-2000:]
    return float(found[1])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium (make test installs it as root)")
def test_the_built_page_answers_offline_in_a_browser_and_follows_what_the_reader_picks(project, offline):
    page = project / "_build" / "html" / "forecast.html"
    shape = forecast.workload(project / "book" / "results")
    for choice in ({}, {"gpus": 16, "interconnect": "ethernet"}, {"preset": "small", "batch_per_gpu": 8}):
        picked = forecast.DEFAULT | choice
        query = "&".join(f"{key}={value}" for key, value in choice.items())
        expected = cluster_forecast(Cluster(**picked), shape)["speedup"]
        assert shown_speedup(page, query, offline) == float(f"{expected:.4g}"), picked
