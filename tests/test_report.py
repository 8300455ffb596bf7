"""The report: notebooks run under papermill, the book builds with warnings as errors, and what it
shows is what the CSVs say."""

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jupytext
import pandas as pd
import papermill
import pytest

from conftest import REPO, WORLD_SIZES
from ddp_core.launch.local import ExperimentError, prepare, run_local



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
    runs = {n: pd.read_csv(project / "results" / "scaling" / f"n{n}" / "metrics.csv") for n in WORLD_SIZES}
    steady = {n: df[df["epoch"] > 1] for n, df in runs.items()}
    per_sample = {n: (df["epoch_time_s"] / df["train_samples"]).mean() for n, df in steady.items()}
    largest = max(WORLD_SIZES)
    speedup = per_sample[1] / per_sample[largest]
    text = page_text(project / "_build" / "html", "notebooks/scaling_analysis")
    assert f"one epoch takes {steady[largest]['epoch_time_s'].mean():.2f} s" in text
    assert f"against {steady[1]['epoch_time_s'].mean():.2f} s on one rank" in text
    assert f"a speedup of {speedup:.2f}" in text
    assert f"efficiency of {speedup / largest:.1%}" in text
    assert f"it is {runs[1]['val_accuracy'].iloc[-1]:.3f} on one rank" in text
    discussion = page_text(project / "_build" / "html", "discussion")
    assert f"the speedup is {speedup:.2f} for an efficiency of {speedup / largest:.1%}" in discussion


def test_a_finished_run_is_reused_and_one_with_other_settings_refused(project):
    common = dict(world_size=1, launcher="local", results_dir=str(project / "results"), experiment="scaling",
                  profile="tiny")
    assert prepare(**common).action == "reuse"
    with pytest.raises(ExperimentError, match="holds a run with other settings \\(--lr\\)"):
        prepare(**common, overrides={"lr": 0.01})


def test_a_run_stopped_before_its_first_checkpoint_is_left_alone(project, tmp_path):
    run_dir = tmp_path / "results" / "scaling" / "n1"
    run_dir.mkdir(parents=True)
    info = json.loads((project / "results" / "scaling" / "n1" / "run.json").read_text()) | {"end_time": None}
    (run_dir / "run.json").write_text(json.dumps(info))
    plan = prepare(world_size=1, launcher="local", results_dir=str(tmp_path / "results"), experiment="scaling",
                   profile="tiny")
    assert plan.action == "interrupted"
    with pytest.raises(ExperimentError, match="stopped before its first checkpoint"):
        run_local(plan)
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]


@pytest.mark.parametrize("parameters,message", [
    ({"world_size": 0}, "world_size must be a positive integer, got 0"),
    ({"launcher": "mpi"}, "unknown launcher 'mpi'; choose from local, slurm"),
    ({"overrides": {"dataset": "mnist"}}, "invalid choice: 'mnist'"),
], ids=["world_size 0", "unknown launcher", "unknown dataset"])
def test_a_bad_parameter_fails_the_first_cell_in_one_line(tmp_path, parameters, message):
    notebook = as_ipynb(REPO / "notebooks" / "run_experiment.md", tmp_path)
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        papermill.execute_notebook(notebook, tmp_path / "out.ipynb", cwd=tmp_path, progress_bar=False,
                                   parameters={"results_dir": str(tmp_path / "results"), **parameters})
    assert failure.value.ename == "ExperimentError"
    assert message in failure.value.evalue and "\n" not in failure.value.evalue
    executed = [c for c in jupytext.read(tmp_path / "out.ipynb").cells if c.cell_type == "code"]
    failed = next(i for i, c in enumerate(executed) if any(o.get("output_type") == "error" for o in c.outputs))
    assert "prepare(" in executed[failed].source
    parameter_tags = {"parameters", "injected-parameters"}
    assert all(parameter_tags & set(executed[i].metadata.get("tags", [])) for i in range(failed))
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("damage,reason", [
    (lambda run: (run / "metrics.csv").unlink(), "metrics.csv: missing"),
    (lambda run: (run / "metrics.csv").write_text("epoch,world_size\n1,1\n"), "metrics.csv: missing column(s)"),
    (lambda run: (run / "metrics.csv").write_bytes(b'epoch,"world\n\x00\x01'), "metrics.csv: unreadable CSV"),
], ids=["missing CSV", "CSV without its columns", "corrupt CSV"])
def test_analysis_names_the_bad_file_and_the_reason(project, tmp_path, damage, reason):
    results = tmp_path / "experiment"
    shutil.copytree(project / "results" / "scaling", results)
    damage(results / "n4")
    notebook = as_ipynb(REPO / "notebooks" / "scaling_analysis.md", tmp_path)
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        papermill.execute_notebook(notebook, tmp_path / "out.ipynb", cwd=tmp_path, progress_bar=False,
                                   parameters={"results": str(results)})
    assert failure.value.ename == "ResultsError"
    assert str(results / "n4" / reason.split(":")[0]) in failure.value.evalue and reason.split(": ")[1] in failure.value.evalue


@pytest.mark.skipif(shutil.which("latexmk") is None and os.geteuid() != 0,
                    reason="TeX is absent and installing it (make pdf runs apt-get) needs root")
def test_pdf_holds_the_equations_and_the_figures(project, isolated_env):
    proc = subprocess.run(["make", "-o", ".venv/.installed", "pdf"], cwd=project, env=isolated_env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latex = project / "_build" / "latex"
    tex = (latex / "book.tex").read_text()
    assert tex.count(r"\begin{equation*}") + tex.count(r"\[") >= 8
    assert r"T_\text{ring}(S, N) = 2(N-1)\,\alpha" in tex
    figures = re.findall(r"\\sphinxincludegraphics(?:\[[^\]]*\])?\{\{?([^}]+?)\}?\.png\}", tex)
    assert len(figures) >= 4 and all((latex / f"{name}.png").is_file() for name in figures)
    assert re.search(r"Output written on book\.pdf \(\d+ pages", (latex / "book.log").read_text())


def test_pointing_the_book_at_other_runs_changes_what_a_plain_rebuild_shows(project, tmp_path, isolated_env):
    other = tmp_path / "other"
    shutil.copytree(project / "results", other, ignore=shutil.ignore_patterns("checkpoint.pt"))
    killed = pd.read_csv(other / "scaling" / "n4" / "metrics.csv").iloc[:1]  # as if the 4-rank run had stopped
    killed.to_csv(other / "scaling" / "n4" / "metrics.csv", index=False)  # after epoch 1
    build = subprocess.run([str(project / ".venv" / "bin" / "jupyter-book"), "build", "book"], cwd=project,
                           env=isolated_env | {"DDP_CORE_RESULTS_DIR": str(other)}, capture_output=True, text=True,
                           timeout=600)
    assert build.returncode == 0, build.stdout[-3000:]
    assert (project / "book" / "results" / "scaling").resolve() == other / "scaling"
    text = page_text(project / "_build" / "html", "notebooks/scaling_analysis")
    assert f"one epoch takes {killed['epoch_time_s'].iloc[0]:.2f} s" in text
