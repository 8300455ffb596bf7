"""The reference results shipped in the repository: they load, they carry their provenance, a fresh clone
builds the whole book from them without training, and a rebuild pointed at other runs (the PDF) shows those."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.single_device import LOOPS
from conftest import REPO, copy_project
from ddp_core.report import discussion, prediction, provenance, scaling
from ddp_core.report.results import load_experiment, load_measurements, load_study, tidy_runs
from ddp_core.report.single_device import throughput_table
from ddp_core.studies.study_list import load_study_list

REFERENCE = REPO / "reference" / "scaling"


def test_the_reference_results_load_and_every_chapter_computes_from_them():
    experiment = load_experiment(REFERENCE)
    assert list(experiment.runs) == [1, 2, 4] and list(experiment.allreduce) == [2, 4]
    for chapter in (scaling.findings, prediction.findings, discussion.findings, provenance.setup_findings):
        assert chapter(experiment)
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


@pytest.fixture(scope="module")
def clone(tmp_path_factory, isolated_env) -> tuple[Path, Path]:
    """A copy of the project as a fresh clone has it, its book built from the reference results alone; and
    what its link to the strong-scaling runs pointed at after that build."""
    clone = copy_project(tmp_path_factory.mktemp("clone"))
    assert not (clone / "book" / "results").exists()
    build = subprocess.run([str(clone / ".venv" / "bin" / "jupyter-book"), "build", "book", "-W", "--keep-going"],
                           cwd=clone, env=isolated_env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return clone, (clone / "book" / "results" / "scaling").resolve()


@pytest.mark.slow
def test_a_fresh_clone_builds_the_book_from_the_reference_results_without_training(clone):
    clone, scaling_shown = clone
    assert scaling_shown == (clone / "reference" / "scaling").resolve()
    site = clone / "_build" / "html"
    assert "reference results shipped with the report" in (site / "setup.html").read_text()
    assert all((site / "results" / "scaling" / f"n{n}" / "run_experiment.html").is_file() for n in (1, 2, 4))
    assert [p.name for p in site.glob("_downloads/*/all_runs.csv")] == ["all_runs.csv"]
    assert not (clone / "results").exists(), "building the book must never train"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("latexmk") is None and os.geteuid() != 0,
                    reason="TeX is absent and installing it (make pdf runs apt-get) needs root")
def test_the_pdf_rebuilt_from_other_runs_shows_them_with_its_equations_and_figures(clone, tmp_path, isolated_env):
    clone, _ = clone
    other = tmp_path / "other"  # the strong-scaling study as if its 4-rank run had stopped after epoch 1
    for name in ("n1", "n4", "allreduce-n2", "allreduce-n4"):
        shutil.copytree(REFERENCE / name, other / "scaling" / name)
    killed = pd.read_csv(other / "scaling" / "n4" / "metrics.csv").iloc[:1]
    killed.to_csv(other / "scaling" / "n4" / "metrics.csv", index=False)
    proc = subprocess.run(["make", "-o", ".venv/.installed", "pdf", f"RESULTS_DIR={other}"], cwd=clone,
                          env=isolated_env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (clone / "book" / "results" / "scaling").resolve() == other / "scaling"
    latex = clone / "_build" / "latex"
    tex = (latex / "book.tex").read_text()
    glued_as_text = re.sub(r"\\DUrole\{pasted-text\}\{([^}]*)\}", r"\1", tex)
    assert f"one epoch takes {killed['epoch_time_s'].iloc[0]:.2f} s" in glued_as_text
    assert tex.count(r"\begin{equation*}") + tex.count(r"\[") >= 8
    assert r"T_\text{ring}(S, N) = 2(N-1)\,\alpha" in tex
    figures = re.findall(r"\\sphinxincludegraphics(?:\[[^\]]*\])?\{\{?([^}]+?)\}?\.png\}", tex)
    assert len(figures) >= 4 and all((latex / f"{name}.png").is_file() for name in figures)
    assert re.search(r"Output written on book\.pdf \(\d+ pages", (latex / "book.log").read_text())
