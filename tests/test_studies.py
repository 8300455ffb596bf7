"""The studies: one list drives the runs and the book; the runner refuses a bad entry before anything
runs, reuses a finished run and resumes an interrupted one; each study's findings are what its CSVs say."""

import json
from dataclasses import replace
import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
import yaml

from conftest import LEFT_OUT_OF_THE_TINY_REPORT, REPO, TINY_STUDIES, read_metrics, run_in_process
from ddp_core.engine.config import global_batch_size, load_profile, parse_args
from ddp_core.report import precision
from ddp_core.analysis.comparisons import WARMUP_STEPS, compare_times
from ddp_core.analysis.compute_ratio import cores_per_rank
from ddp_core.analysis.provenance import ResultsFrom, results_shown, study_setup
from ddp_core.analysis.results import load_experiment, load_study
from ddp_core.studies.run import main as runner_main, plan_runs
from ddp_core.studies.study_list import at_world_sizes, load_study_list

STUDIES = load_study_list()
RUNNER = [sys.executable, "-m", "ddp_core.studies.run"]


def run_studies(args, *, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        RUNNER + [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def test_the_runner_hands_the_run_notebook_exactly_the_parameters_it_declares_and_checks(tmp_path):
    """What a study's run is, said once (`Run.parameters`): the same names the notebook's parameters cell declares
    and `prepare_run` checks (`prepare`'s, and the placement's in the notebook's words), so a field added on one side
    and not the other fails here, not in a run."""
    import inspect

    import jupytext
    import papermill

    from ddp_core.launch.plan import PLACEMENT_PARAMETERS, Placement, SlurmOptions, prepare
    from ddp_core.studies.study_list import SlurmPlacement, on_slurm

    notebook = tmp_path / "run_experiment.ipynb"
    jupytext.write(jupytext.read(REPO / "notebooks" / "run_experiment.md"), notebook)
    declared = set(papermill.inspect_notebook(str(notebook)))
    assert set(PLACEMENT_PARAMETERS) <= set(inspect.signature(Placement).parameters) & declared
    accepted = set(inspect.signature(prepare).parameters) - {"placement"} | set(PLACEMENT_PARAMETERS)
    for run, _ in plan_runs(list(STUDIES.values()), str(tmp_path / "results")):
        handed = set(run.parameters(str(tmp_path / "results")))
        assert handed <= declared and handed <= accepted, handed - (declared & accepted)
    slurm_options = {"slurm_gpus_per_rank", "slurm_cpus_per_rank"}  # SlurmOptions' fields, in the notebook's words
    assert {f"slurm_{name}" for name in inspect.signature(SlurmOptions).parameters} >= slurm_options
    for run, _ in plan_runs(on_slurm([STUDIES["scaling"]], SlurmPlacement()), str(tmp_path / "results")):
        handed = set(run.parameters(str(tmp_path / "results")))
        assert handed <= declared and handed - slurm_options <= accepted, handed - (declared & accepted)


def test_every_study_of_the_list_passes_the_trainers_checks_and_has_a_book_page(tmp_path):
    planned = plan_runs(list(STUDIES.values()), str(tmp_path / "results"))
    assert {run.study for run, _ in planned} == set(STUDIES)
    assert all(plan.action == "train" for _, plan in planned)
    assert len({plan.run_dir for _, plan in planned}) == len(planned), "two runs would share a folder"
    toc = (REPO / "_toc.yml").read_text()
    for name in set(STUDIES) - {"scaling"}:  # the strong-scaling study has the results chapters
        assert f"studies/{name}\n" in toc and (REPO / "book" / "studies" / f"{name}.md").is_file()
    assert not (tmp_path / "results").exists()


def test_every_run_of_the_report_has_a_steady_epoch_and_a_dozen_timed_steps(tmp_path):
    """The per-epoch timers' averages leave out a run's first epoch, and its time is the median of its steps after
    the first WARMUP_STEPS: a run of one epoch, or of too few steps, would measure its own start-up."""
    for run, plan in plan_runs(list(STUDIES.values()), str(tmp_path / "results")):
        cfg = parse_args(plan.train_args, world_size=run.world_size)
        steps = cfg.epochs * (cfg.train_samples // global_batch_size(cfg, run.world_size))
        assert cfg.epochs >= 2, run.folder
        assert steps - WARMUP_STEPS >= 7, f"{run.folder}: {steps} steps"


def test_runs_alternate_in_time_round_by_round_never_in_blocks(tmp_path):
    study_list = tmp_path / "studies.yml"
    study_list.write_text(
        yaml.safe_dump(
            {
                "a": GOOD
                | {"repeats": 2, "world_sizes": [1, 2], "variants": {"x": {}, "y": {"settings": {"epochs": 2}}}},
                "b": GOOD | {"world_sizes": [1]},
            }
        )
    )
    order = [run.folder for run, _ in plan_runs(list(load_study_list(study_list).values()), str(tmp_path / "r"))]
    assert order == ["a/x/n1", "a/x/n2", "a/y/n1", "a/y/n2", "b/n1", "a/x/n1-r2", "a/x/n2-r2", "a/y/n1-r2", "a/y/n2-r2"]


def test_every_study_of_the_report_is_in_the_tests_study_list_or_left_out_for_a_study_of_its_shape():
    tiny = list(load_study_list(TINY_STUDIES))
    assert tiny == [name for name in STUDIES if name not in LEFT_OUT_OF_THE_TINY_REPORT]
    assert set(LEFT_OUT_OF_THE_TINY_REPORT) < set(STUDIES)
    assert all(kept.split(":")[0] in tiny for kept in LEFT_OUT_OF_THE_TINY_REPORT.values())


def test_a_machine_with_one_gpu_trains_the_one_rank_runs_of_every_repeat_and_no_all_reduce_benchmark(tmp_path):
    studies = at_world_sizes([STUDIES["scaling"], STUDIES["precision"]], [1])
    folders = [run.folder for run, _ in plan_runs(studies, str(tmp_path))]
    assert sorted(folders) == sorted(
        f"{study}/n1{repeat}"
        for study in ("scaling", "precision/fp32", "precision/bf16")
        for repeat in ("", "-r2", "-r3")
    )
    assert [study.allreduce_world_sizes for study in studies] == [[], []]


def test_world_sizes_no_chosen_study_has_are_refused_in_one_line(tmp_path, isolated_env):
    proc = run_studies(
        ["scaling", "ag_news", "--world-sizes", "3", "--results-dir", "results"], cwd=tmp_path, env=isolated_env
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ddp_core.studies.run: error: no run of scaling, ag_news has 3 rank(s)"
    assert not (tmp_path / "results").exists()


GOOD = {"title": "t", "profile": "tiny", "world_sizes": [1]}


@pytest.mark.parametrize(
    "entry,message",
    [
        (GOOD | {"settings": {"lr": -1}}, "study 'bad', run bad/n1: --lr must be a finite number above 0, got -1.0"),
        (GOOD | {"world_sizes": [0]}, "world_sizes must be a non-empty list of positive integers, got [0]"),
        (GOOD | {"epoch": 2}, "study 'bad': unknown key(s) epoch"),
        (
            GOOD | {"variants": {"v": {"link": "1gbit"}}},
            "unknown key(s) link; a variant has cpus_per_node, link_rate, models, settings, world_sizes",
        ),
        (GOOD | {"profile": "nope"}, "no profile 'nope'"),
        (GOOD | {"settings": {"optimiser": "sgd"}}, "unknown setting 'optimiser'"),
        (
            GOOD | {"world_sizes": [2], "variants": {"odd": {"settings": {"global_batch_size": 15}}}},
            "run bad/odd/n2: --global-batch-size 15 does not divide by world size 2",
        ),
        (GOOD | {"ratio_tolerance": 5}, "study 'bad': ratio_tolerance must be a fraction between 0 and 1, got 5"),
    ],
    ids=[
        "bad value",
        "bad world size",
        "unknown key",
        "unknown variant key",
        "unknown profile",
        "unknown setting",
        "batch per rank",
        "bad tolerance",
    ],
)
def test_a_bad_study_entry_is_refused_in_one_line_before_any_run_starts(tmp_path, isolated_env, entry, message):
    study_list = tmp_path / "studies.yml"
    study_list.write_text(yaml.safe_dump({"good": GOOD, "bad": entry}))
    proc = run_studies(["--study-list", study_list, "--results-dir", "results"], cwd=tmp_path, env=isolated_env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddp_core.studies.run: error:") and message in lines[0], proc.stderr
    assert not (tmp_path / "results").exists(), "the good study ran although the list had a bad entry"


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--world-sizes", "1", "good"],
            "argument --world-sizes: 'good' is not a number of ranks (name the studies before",
        ),
        (["--allreduce-args=--bogus"], "--allreduce-args '--bogus': unrecognized arguments: --bogus"),
        (
            ["--allreduce-args", "--min-bytes 4096 --max-bytes 16"],
            "no size to time from --min-bytes 4096 to --max-bytes 16",
        ),
        (["--allreduce-args", "--sizes '8"], "No closing quotation"),
        (["--results-dir", "afile"], "--results-dir afile is a file, not a directory"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    ],
    ids=[
        "studies after world sizes",
        "unknown benchmark option",
        "no benchmark size",
        "unclosed quote",
        "results in a file",
        "unknown option",
    ],
)
def test_a_bad_command_line_is_refused_in_one_line_before_any_run_starts(tmp_path, isolated_env, args, message):
    study_list = tmp_path / "studies.yml"
    study_list.write_text(yaml.safe_dump({"good": GOOD}))
    (tmp_path / "afile").write_text("mine\n")
    defaults = ["--study-list", study_list] + ([] if "--results-dir" in args else ["--results-dir", "results"])
    proc = run_studies([*defaults, *args], cwd=tmp_path, env=isolated_env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddp_core.studies.run: error:") and message in lines[0], proc.stderr
    assert not (tmp_path / "results").exists() and (tmp_path / "afile").read_text() == "mine\n"


def test_a_damaged_run_json_in_the_results_is_named_in_one_line(tmp_path, isolated_env):
    study_list = tmp_path / "studies.yml"
    study_list.write_text(yaml.safe_dump({"good": GOOD}))
    (tmp_path / "results" / "good" / "n1").mkdir(parents=True)
    (tmp_path / "results" / "good" / "n1" / "run.json").write_text("[]")
    proc = run_studies(
        ["--study-list", study_list, "--results-dir", "results", "--check"], cwd=tmp_path, env=isolated_env
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("ddp_core.studies.run: error: study 'good', run good/n1: ")
    assert "run.json is not a run's record (TypeError" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_check_plans_every_run_and_trains_none(tmp_path, isolated_env):
    proc = run_studies(
        ["--study-list", TINY_STUDIES, "--results-dir", "results", "--check"], cwd=tmp_path, env=isolated_env
    )
    planned = plan_runs(list(load_study_list(TINY_STUDIES).values()), str(tmp_path / "results"))
    assert proc.stdout.strip() == f"ddp_core.studies.run: check passed: {len(planned)} runs planned", proc.stderr
    assert not (tmp_path / "results").exists()


def test_making_the_reference_with_a_bad_setting_removes_nothing(tmp_path, isolated_env):
    reference = tmp_path / "reference"
    (reference / "scaling" / "n1").mkdir(parents=True)
    (reference / "scaling" / "n1" / "run.json").write_text("{}")
    (reference / "headline.png").write_bytes(b"png")
    before = sorted(reference.rglob("*"))
    proc = subprocess.run(
        [
            "make",
            "-o",
            ".venv/.installed",
            "reference",
            f"REFERENCE={reference}",
            "PROFILE=nosuch",
            f"QUIET_KERNELS={tmp_path / 'kernels.py'}",
        ],
        cwd=REPO,
        env=isolated_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "no profile 'nosuch'" in proc.stderr
    assert sorted(reference.rglob("*")) == before


def test_an_unknown_study_name_is_refused_with_the_names_there_are(tmp_path, isolated_env):
    proc = run_studies(["ag_news", "ag_nwes"], cwd=tmp_path, env=isolated_env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ddp_core.studies.run: error: no study 'ag_nwes'; the studies are: " + ", ".join(STUDIES)
    )


@pytest.mark.slow
def test_a_profile_given_to_the_runner_replaces_each_studys_own_and_the_study_settings_still_apply(
    tmp_path, isolated_env
):
    study_list = tmp_path / "studies.yml"
    study_list.write_text(yaml.safe_dump({"mine": GOOD | {"profile": "default", "settings": {"dropout": 0.0}}}))
    proc = run_studies(
        ["--study-list", study_list, "--results-dir", "results", "--profile", "tiny"], cwd=tmp_path, env=isolated_env
    )
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "results" / "mine" / "n1" / "run.json").read_text())["config"]
    assert (config["dataset"], config["preset"], config["dropout"]) == ("synthetic", "tiny", 0.0)


def test_a_cpu_sized_study_under_the_gpu_profile_is_refused_in_one_line_before_any_run(tmp_path, isolated_env):
    proc = run_in_process(
        ["scaling", "--profile", "gpu", "--results-dir", "results"], cwd=tmp_path, env=isolated_env, main=runner_main
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ddp_core.studies.run: error: study 'scaling' sets epochs, eval_samples, train_samples for its own profile "
        "'default', which "
        "profile 'gpu' sets too; run a study list sized for 'gpu' (make report PROFILE=gpu uses "
        "notebooks/studies-gpu.yml)"
    )
    assert not (tmp_path / "results").exists()


def test_the_gpu_study_list_trains_the_whole_imdb_training_split_at_the_gpu_profiles_scale():
    from ddp_core.studies.study_list import GPU_STUDY_LIST

    studies = load_study_list(GPU_STUDY_LIST)
    for run in (run for study in studies.values() for run in study.runs()):
        settings = load_profile(run.profile) | run.settings
        assert run.profile == "gpu" and settings["train_samples"] is None  # the whole split
        assert (settings["dataset"], settings["preset"], settings["device"]) == ("imdb", "large", "cuda")
    assert sorted({run.world_size for run in studies["scaling"].runs()}) == [1, 2, 4]
    assert studies["scaling"].repeats >= 3 and studies["scaling"].allreduce


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch is a CUDA build")
def test_gpu_jobs_from_a_torch_without_cuda_are_refused_in_one_line_before_any_is_queued(tmp_path, isolated_env):
    """On a login node the GPUs are not there to check, but the build is: a job would fail on its node."""
    proc = run_in_process(
        [
            "--study-list",
            str(REPO / "notebooks" / "studies-gpu.yml"),
            "--launcher",
            "slurm",
            "--results-dir",
            "results",
        ],
        cwd=tmp_path,
        env=isolated_env,
        main=runner_main,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"ddp_core.studies.run: error: study 'scaling', run scaling/n1: --device cuda on Slurm needs a CUDA build of "
        f"torch, and this one is {torch.__version__} without CUDA: install the build for the cluster's driver "
        f'(docs/using.md, "On a GPU cluster")'
    )
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["nodes", "--launcher", "slurm"],
            "study 'nodes' trains on nodes emulated on this machine: not on Slurm; name "
            "the studies to submit (e.g. scaling)",
        ),
        (
            ["scaling", "--launcher", "slurm", "--ranks-per-node", "3"],
            "study 'scaling': 4 ranks do not fill whole nodes of 3",
        ),
    ],
)
def test_runs_slurm_cannot_place_are_refused_in_one_line_before_any_is_queued(tmp_path, isolated_env, args, message):
    proc = run_in_process([*args, "--results-dir", "results"], cwd=tmp_path, env=isolated_env, main=runner_main)
    assert (proc.returncode, proc.stderr.strip()) == (2, f"ddp_core.studies.run: error: {message}")
    assert not (tmp_path / "results").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_gpu_profile_on_a_machine_without_gpus_is_refused_in_one_line_before_any_run(tmp_path, isolated_env):
    proc = run_in_process(
        ["--study-list", str(REPO / "notebooks" / "studies-gpu.yml"), "--profile", "gpu", "--results-dir", "results"],
        cwd=tmp_path,
        env=isolated_env,
        main=runner_main,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ddp_core.studies.run: error: study 'scaling', run scaling/n1: --device cuda needs a CUDA GPU per local rank: "
        "1 local rank(s), 0 GPU(s) (on a machine without, use --device cpu and --backend gloo, or auto)"
    )
    assert not (tmp_path / "results").exists()


def test_the_overview_says_which_results_are_the_readers_runs_and_which_the_reference(tmp_path):
    studies = {name: STUDIES[name] for name in ("scaling", "ag_news")}
    for made in (
        "reference/scaling",
        "mine/ag_news",
        "reference/cpu_period",
        "reference/single_device/amd-epyc",
        "mine/single_device/intel-xeon",
    ):
        (tmp_path / made).mkdir(parents=True)
    links = tmp_path / "book_results"
    (links / "single_device").mkdir(parents=True)
    for link, target in (
        ("scaling", "reference/scaling"),
        ("ag_news", "mine/ag_news"),
        ("cpu_period", "reference/cpu_period"),
        ("single_device/amd-epyc", "reference/single_device/amd-epyc"),
        ("single_device/intel-xeon", "mine/single_device/intel-xeon"),
    ):
        (links / link).symlink_to(tmp_path / target)
    assert results_shown(links, studies) == ResultsFrom(
        here="Strong scaling on AG News, throughput on one device (intel-xeon)",
        reference="Strong scaling on IMDB, the CPU quota period (emulated nodes), throughput on one device (amd-epyc)",
    )
    (links / "ag_news").unlink()
    (links / "ag_news").symlink_to(tmp_path / "reference" / "scaling")
    assert results_shown(links, studies).here == "throughput on one device (intel-xeon)"


def processes_working_in(folder) -> list[int]:
    """Processes whose working directory is `folder` (the runner, its notebook kernel and the trainer)."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            if proc.isdigit() and os.readlink(f"/proc/{proc}/cwd") == str(folder):
                found.append(int(proc))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_an_interrupted_study_leaves_no_process_behind_and_resumes_from_its_last_checkpoint(tmp_path, isolated_env):
    study_list = tmp_path / "studies.yml"
    # epochs of a few seconds, so that a trainer outliving the runner would be caught at it
    study_list.write_text(
        yaml.safe_dump({"long": GOOD | {"settings": {"preset": "small", "epochs": 4, "train_samples": 1536}}})
    )
    args = ["--study-list", study_list, "--results-dir", "results"]
    run_dir = tmp_path / "results" / "long" / "n1"
    first = subprocess.Popen(
        RUNNER + [str(a) for a in args],
        cwd=tmp_path,
        env=isolated_env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoint.pt").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the runner, as a crash or a killed job stops it: no clean-up runs
    first.wait()
    # The kernel sees its parent gone within a second; the trainer, sent SIGTERM then, ends its step and writes its
    # checkpoint first, which a loaded machine can stretch to seconds. A trainer that went on instead would finish
    # its epochs in this time and be caught below by its metrics.
    deadline = time.monotonic() + 30
    while processes_working_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_working_in(tmp_path), "training went on after the runner was killed"
    done = len(pd.read_csv(run_dir / "metrics.csv"))
    assert 1 <= done < 4, "the run was not interrupted mid-way"
    proc = run_studies(args, cwd=tmp_path, env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert "long/n1: resume" in proc.stdout
    assert list(pd.read_csv(run_dir / "metrics.csv")["epoch"]) == [1, 2, 3, 4]
    assert (run_dir / "run_experiment.ipynb").is_file()


# What the study pages compute, checked against the CSVs of the reference results (runs this machine made; computed
# from their CSVs, never compared with a stored value). What needs the tiny report's runs is in test_report.py.

REFERENCE = REPO / "reference"


def metrics_of(folder) -> pd.DataFrame:
    return pd.read_csv(folder / "metrics.csv")


def repeats(folder, n: int) -> list:
    """The run folders of `n` ranks under `folder`, repeat 1 first (n4, n4-r2, n4-r3, ...)."""
    return [folder / f"n{n}"] + sorted(folder.glob(f"n{n}-r*"), key=lambda path: int(path.name.split("-r")[1]))


def paired_median(a: list[float], b: list[float]) -> float:
    """The median over the repeats of a_k / b_k, computed here."""
    return float(pd.Series([x / y for x, y in zip(a, b)]).median())


def time_per_sample(folder) -> float:
    """A run's median step after its warm-up steps over its global batch, computed here from its files."""
    steps = pd.read_csv(folder / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:]
    return steps.median() / json.loads((folder / "run.json").read_text())["global_batch_size"]


def test_the_cost_model_gives_a_rank_its_part_of_the_shared_cores_or_its_emulated_nodes_share():
    scaling = load_experiment(REFERENCE / "scaling")
    for n, run in scaling.runs.items():
        assert cores_per_rank(run) == min(run.threads_per_rank, run.cpu_count / n)
    on_a_node = scaling.runs[4].raw | {"network": {"nodes": 2, "ranks_per_node": 2, "cpus_per_node": 0.5}}
    assert cores_per_rank(replace(scaling.runs[4], raw=on_a_node)) == 0.25


def test_precision_ratio_is_bf16_over_fp32_median_step():
    folder = REFERENCE / "precision"
    study = load_study(folder)
    found = precision.findings(study, [])
    ratio = paired_median(
        [time_per_sample(run) for run in repeats(folder / "bf16", 1)],
        [time_per_sample(run) for run in repeats(folder / "fp32", 1)],
    )
    assert compare_times(study["bf16"], study["fp32"]).ratio == pytest.approx(ratio)
    assert found.precision_speed.value.startswith(f"{ratio:.2f} (")


def test_the_bucket_table_gives_each_settings_step_with_its_range_over_the_repeats():
    from ddp_core.report.bucket_size import bucket_table

    folder = REFERENCE / "bucket_size"
    table = bucket_table(load_study(folder))
    for variant in ("one_bucket", "default_buckets", "one_mib_buckets"):
        steps = [
            pd.read_csv(run / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
            for run in repeats(folder / variant, 2)
        ]
        assert len(steps) == 3
        assert table.loc[variant, ["step_time_s", "step_low_s", "step_high_s"]].tolist() == pytest.approx(
            [pd.Series(steps).median(), min(steps), max(steps)]
        )


def test_the_quota_periods_step_is_held_against_the_studys_period_repeat_by_repeat():
    from ddp_core.analysis.cpu_period import STUDY_PERIOD_MS, load_periods, period_table
    from ddp_core.report.nodes import quota_periods

    folder = REFERENCE / "cpu_period"
    table = period_table(load_periods(folder)).set_index("period_ms")
    steps = {
        period: [
            pd.read_csv(run / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
            for run in repeats(folder / f"period-{period}ms", 4)
        ]
        for period in (5, 10, 100)
    }
    assert STUDY_PERIOD_MS == 10 and sorted(table.index) == [5, 10, 100]
    for period, times in steps.items():
        assert table.loc[period, "median_step_ms"] == pytest.approx(pd.Series(times).median() * 1e3)
        assert table.loc[period, "ratio_to_study"] == pytest.approx(paired_median(times, steps[10]))
        last = [pd.read_csv(run / "metrics.csv").iloc[-1] for run in repeats(folder / f"period-{period}ms", 4)]
        per_step = lambda row, *columns: sum(row[c] for c in columns) / row["steps"]  # noqa: E731
        assert table.loc[period, "mean_step_ms"] == pytest.approx(
            1e3 * pd.Series([per_step(row, "epoch_time_s") for row in last]).mean()
        )
        assert table.loc[period, "exposed_ms"] == pytest.approx(
            1e3 * pd.Series([per_step(row, "comm_exposed_s") for row in last]).mean()
        )
        assert table.loc[period, "compute_ms"] == pytest.approx(
            1e3
            * pd.Series(
                [
                    per_step(row, "forward_time_s", "backward_time_s", "optimizer_time_s")
                    - per_step(row, "comm_exposed_s")
                    for row in last
                ]
            ).mean()
        )
    found = quota_periods(folder)
    said = found.comparisons
    made = [
        json.loads((run / "run.json").read_text()) for p in (5, 10, 100) for run in repeats(folder / f"period-{p}ms", 4)
    ]
    assert found.commits.split(", ") == sorted({info["git_commit"][:10] for info in made})
    assert found.dates.split(", ") == sorted({info["start_time"][:10] for info in made})
    assert said.startswith(f"at 5 ms, {paired_median(steps[5], steps[10]):.2f} (") and "at 100 ms, " in said
    assert "at 10 ms" not in said


def test_each_studys_floor_in_the_methods_table_is_the_one_its_page_holds_comparisons_against():
    from ddp_core.analysis.comparisons import study_floor_power, time_floor

    for name in ("precision", "bucket_size", "nodes"):
        study = load_study(REFERENCE / name)
        configurations = sum(len(variant.world_sizes) for variant in STUDIES[name].variants)
        found = study_floor_power(study)
        assert found["floor"] == pytest.approx(time_floor(*study.values()))
        assert found["degrees"] == (configurations - 1) * (3 - 1)
        assert all(0 <= found[rate] <= 1 for rate in ("identical_called", "found_10", "found_20"))


@pytest.mark.parametrize(
    "on_gpu, extensions, says",
    [
        (False, ["avx2", "avx512f", "avx512_bf16"], "has bf16 instructions"),
        (False, ["avx2"], "has no bf16 instructions"),
        (False, [], "has no bf16 instructions"),
        (False, None, "did not record its extensions"),
        (True, None, "has bf16 instructions"),
    ],
)
def test_the_precision_page_says_whether_the_processor_computes_in_bf16(on_gpu, extensions, says):
    from types import SimpleNamespace

    from ddp_core.report.precision import bf16_support

    assert bf16_support(SimpleNamespace(on_gpu=on_gpu, raw={"cpu_extensions": extensions})) == says


def test_a_study_page_states_how_many_runs_of_how_many_epochs_ran_where(tmp_path, monkeypatch):
    folder = shutil.copytree(REFERENCE / "precision", tmp_path / "project" / "reference" / "precision")
    (tmp_path / "project" / "book").mkdir()
    (tmp_path / "project" / "_config.yml").write_text("")
    study = load_study(folder)
    runs = sorted(folder.glob("*/n1*/run.json"))
    info = json.loads(runs[0].read_text())
    epochs = {len(metrics_of(run.parent)) for run in runs}
    monkeypatch.chdir(tmp_path / "project")  # the page's project: its runs lie in its reference/
    found = study_setup(*study.values())
    assert found.runs == f"{len(runs)} runs" and found.repeats == "3"
    assert found.epochs == " to ".join(map(str, sorted(epochs))) + " epochs"
    assert (found.device, found.cores, found.torch) == (
        info["device_name"],
        info["cpu_count"],
        info["torch"],
    )
    assert found.shown.startswith("the reference results shipped with the report")


# The study runner, in a process that Ctrl-C interrupts as a terminal's does (a suite run in a background job would
# have it inherit SIGINT ignored).
RUNNER_UNDER_CTRL_C = """import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from ddp_core.studies.run import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ctrl_c_stops_the_study_runner_in_one_line_and_the_same_command_goes_on(tmp_path, isolated_env):
    study_list = tmp_path / "studies.yml"
    study_list.write_text(yaml.safe_dump({"mine": GOOD | {"settings": {"train_samples": 48000}, "world_sizes": [2]}}))
    command = [sys.executable, "-c", RUNNER_UNDER_CTRL_C, "--study-list", str(study_list), "--results-dir", "results"]
    run_dir = tmp_path / "results" / "mine" / "n2"
    with subprocess.Popen(
        command,
        cwd=tmp_path,
        env=isolated_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as runner:
        deadline = time.monotonic() + 120
        while not (run_dir / "steps.csv").exists():  # the run is training
            assert runner.poll() is None and time.monotonic() < deadline, runner.communicate()
            time.sleep(0.2)
        os.killpg(runner.pid, signal.SIGINT)
        out, err = runner.communicate(timeout=120)
    assert runner.returncode == 130 and "Traceback" not in out + err, out + err
    assert err.strip().splitlines()[-1] == (
        "ddp_core.studies.run: stopped by Ctrl-C; run the same command to go on: it reuses every finished run and "
        "continues a stopped one from its checkpoint"
    )

    again = subprocess.run(command, cwd=tmp_path, env=isolated_env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [row["epoch"] for row in read_metrics(run_dir)] == ["1", "2"]
