"""The single-device benchmark: what it measures on this machine's device, and the figures the book derives."""

import json
from dataclasses import replace
import subprocess
import sys

import pandas as pd
import pytest
import torch

from benchmarks.single_device import LOOPS, main as single_device_main
from conftest import REPO, run_in_process
from ddp_core.engine.config import TrainConfig
from ddp_core.engine.model_cost import bucket_sizes
from ddp_core.engine.model_shape import ModelConfig
from ddp_core.analysis.comparisons import WARMUP_STEPS
from ddp_core.analysis.nvlink_forecast import measured_forecast, nvlink_fit
from ddp_core.analysis.results import Measurement, load_experiment, read_measurement
from ddp_core.report.precision import CpuCrossref, crossref
from ddp_core.analysis.throughput import (
    RATIOS,
    ratio_comparison,
    ratio_overview,
    ratio_table,
    throughput_table,
    verdict_table,
)
from ddp_core.report.single_device import (
    baseline_comparison,
    baseline_markdown,
    baseline_outcome,
    measurements_markdown,
    ratio_markdown,
    throughput_markdown,
    verdict_markdown,
)

BENCHMARK = [sys.executable, str(REPO / "benchmarks" / "single_device.py")]
TINY = [
    "--presets",
    "tiny",
    "--batch-sizes",
    "4",
    "8",
    "--amp",
    "off",
    "--seq-len",
    "16",
    "--steps",
    "3",
    "--rounds",
    "2",
    "--device",
    "cpu",
]


def run_benchmark(args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCHMARK, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, isolated_env):
    folder = tmp_path_factory.mktemp("bench")
    proc = run_benchmark([*TINY, "--results-dir", "out"], folder, isolated_env)
    assert proc.returncode == 0, proc.stderr
    return proc, folder / "out" / "single_device" / "cpu"


def test_every_loop_is_timed_every_round_for_every_configuration(measured):
    _, folder = measured
    epochs = pd.read_csv(folder / "epochs.csv")
    counts = epochs.groupby(["preset", "amp", "batch_size", "loop"]).size()
    assert set(counts.index.get_level_values("loop")) == set(LOOPS)
    assert len(counts) == 2 * len(LOOPS) and (counts == 2).all()
    assert (epochs["seconds"] > 0).all()
    assert set(epochs.groupby("batch_size")["samples"].first().items()) == {(4, 12), (8, 24)}


def test_a_measurement_at_a_batch_and_twice_it_forecasts_two_gpus_for_the_model_it_trained(measured):
    _, folder = measured
    ahead = measured_forecast(read_measurement(folder), world_size=2)
    assert list(ahead["batch_per_gpu"]) == [4]
    trained = ModelConfig.from_preset("tiny", vocab_size=TrainConfig().vocab_size, max_len=16, num_classes=2)
    expected = sum(nvlink_fit(2).allreduce_s(size) for size in bucket_sizes(vars(trained))) * 1e3
    assert ahead["comm_ms"].iloc[0] == pytest.approx(expected)


def test_the_measurement_names_its_device_code_and_ceiling(measured):
    proc, folder = measured
    info = json.loads((folder / "device.json").read_text())
    assert info["device"] == "cpu" and info["backend"] == "gloo" and info["end_time"] and info["git_commit"]
    assert info["matmul_tflops"]["off"] > 0
    assert "measured into out/single_device/cpu" in proc.stdout
    summary = subprocess.run(
        [sys.executable, "-m", "ddp_core.report.single_device", str(folder)], capture_output=True, text=True, check=True
    )
    assert "the project's trainer / plain loop" in summary.stdout and "timers on / off" in summary.stdout


def test_a_device_measured_before_is_never_overwritten(measured, isolated_env):
    _, folder = measured
    before = (folder / "epochs.csv").read_text()
    proc = run_benchmark([*TINY, "--results-dir", "out"], folder.parents[2], isolated_env)
    assert proc.returncode == 2 and "already holds a measurement" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (folder / "epochs.csv").read_text() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_gpu_where_there_is_none_is_refused_before_measuring(tmp_path, isolated_env):
    proc = run_in_process(
        [*TINY[:-2], "--device", "cuda", "--results-dir", "out"],
        cwd=tmp_path,
        env=isolated_env,
        main=single_device_main,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("single_device: error: --device cuda needs a CUDA GPU per local rank"), (
        proc.stderr
    )
    assert not (tmp_path / "out").exists()


def test_a_bad_option_is_refused_in_one_line_before_measuring(tmp_path, isolated_env):
    proc = run_in_process(
        ["--batch-sizes", "32", "0", "--results-dir", "out"], cwd=tmp_path, env=isolated_env, main=single_device_main
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "single_device: error: argument --batch-sizes: must be at least 1, got 0"
    assert not (tmp_path / "out").exists()


def made_up(
    seconds: dict[str, list[float]], device_name: str = "NVIDIA H100 80GB HBM3", preset: str = "large"
) -> Measurement:
    """A measurement with the given seconds per loop and round, 100 samples per epoch."""
    rows = [
        dict(
            preset=preset,
            amp="bf16",
            batch_size=64,
            seq_len=256,
            flops_per_sample=2e12,
            loop=loop,
            round=r,
            samples=100,
            seconds=s,
        )
        for loop, per_round in seconds.items()
        for r, s in enumerate(per_round)
    ]
    info = {"device": "cuda:0", "device_name": device_name, "matmul_tflops": {"bf16": 800.0}}
    return Measurement("made-up", info, pd.DataFrame(rows))


def test_throughput_and_mfu_follow_from_samples_seconds_and_flops():
    m = made_up({"plain": [1.0, 1.0], "ddp_core": [1.0, 1.0], "timed": [0.5, 1.0], "ddp_of_one": [1.0, 1.0]})
    row = throughput_table(m).iloc[0]
    assert row["samples_per_s_timed"] == pytest.approx(200 / 1.5)
    tflops = 200 / 1.5 * 2e12 / 1e12
    assert row["tflops"] == pytest.approx(tflops)
    assert row["mfu"] == pytest.approx(tflops / 989.4)
    assert row["share_of_matmul"] == pytest.approx(tflops / 800)
    assert pd.isna(throughput_table(made_up({loop: [1.0] for loop in LOOPS}, "AMD EPYC")).iloc[0]["mfu"])


def test_a_ratio_is_the_median_over_rounds_with_its_range_and_noise_is_called_noise():
    slower = made_up(
        {
            "plain": [1.0, 1.0, 1.0],
            "ddp_core": [1.25, 1.25, 1.0 / 0.9],
            "timed": [1.0, 1.0, 1.0],
            "ddp_of_one": [1.0, 1.0, 1.0],
        }
    )
    row = ratio_table(slower).iloc[0]
    assert (row["trainer_median"], row["trainer_low"], row["trainer_high"]) == pytest.approx((0.8, 0.8, 0.9))
    verdicts = ["faster", "slower", "no visible difference", "too few repeats"]
    assert verdict_table(slower).loc[RATIOS["trainer"][2], verdicts].tolist() == [0, 1, 0, 0]
    one = ratio_comparison(slower, "trainer", ("large", "bf16", 64))  # the configuration's own verdict, as counted
    assert (one.ratio, one.low, one.high, one.says("slower", "faster")) == pytest.approx((0.8, 0.8, 0.9, "slower"))
    noisy = made_up(
        {"plain": [1.0, 1.0, 1.0], "ddp_core": [0.9, 1.1, 1.0], "timed": [1.0, 1.0, 1.0], "ddp_of_one": [1.0, 1.0, 1.0]}
    )
    assert verdict_table(noisy).loc[RATIOS["trainer"][2], verdicts].tolist() == [0, 0, 1, 0]
    two_rounds = made_up({"plain": [1.0, 1.0], "ddp_core": [1.25, 1.25], "timed": [1.0, 1.0], "ddp_of_one": [1.0, 1.0]})
    assert verdict_table(two_rounds).loc[RATIOS["trainer"][2], verdicts].tolist() == [0, 0, 0, 1]


def test_each_configuration_is_judged_against_its_own_noise_not_the_noisiest_configurations():
    """A steady configuration whose trainer is 5 % slower every round is called slower, though beside it a small
    model's epochs spread by a third: a floor pooled over both would hide the steady one's difference."""
    steady = {
        "plain": [1.0, 1.01, 0.99, 1.0],
        "ddp_core": [1.05, 1.06, 1.04, 1.05],
        "timed": [1.0, 1.01, 0.99, 1.0],
        "ddp_of_one": [1.0, 1.01, 0.99, 1.0],
    }
    noisy = {
        "plain": [1.0, 1.3, 0.8, 1.2],
        "ddp_core": [1.2, 0.9, 1.3, 0.8],
        "timed": [0.8, 1.2, 1.0, 1.3],
        "ddp_of_one": [1.3, 0.8, 1.2, 1.0],
    }
    large, tiny = made_up(steady), made_up(noisy, preset="tiny")
    m = replace(large, epochs=pd.concat([large.epochs, tiny.epochs], ignore_index=True))
    assert ratio_comparison(m, "trainer", ("large", "bf16", 64)).says("slower", "faster") == "slower"
    assert ratio_comparison(m, "trainer", ("tiny", "bf16", 64)).says("slower", "faster") == "no visible difference"
    row = verdict_table(m).loc[RATIOS["trainer"][2]]
    assert (row["slower"], row["no visible difference"]) == (1, 1)
    assert row["lowest_floor"] < 0.05 < 0.3 < row["highest_floor"]
    table = cells(ratio_markdown(m))  # every count readable off a row: each configuration's verdict and floor
    header = f"{RATIOS['trainer'][2]} (median, range), and the verdict where the rule tells a difference"
    assert table["large, bf16, batch 64"][header].endswith(": slower")
    assert table["tiny, bf16, batch 64"][header].endswith(")")  # no visible difference: no word
    assert (
        float(table["large, bf16, batch 64"]["Noise floor (%)"])
        < 5
        < 30
        < float(table["tiny, bf16, batch 64"]["Noise floor (%)"])
    )


def test_the_first_page_gives_each_ratio_over_the_configurations_with_its_verdict_counts():
    slower = made_up(
        {
            "plain": [1.0, 1.0, 1.0],
            "ddp_core": [1.25, 1.25, 1.0 / 0.9],
            "timed": [1.0, 1.0, 1.0],
            "ddp_of_one": [1.0, 1.0, 1.0],
        }
    )
    found = ratio_overview(slower)
    assert found.configurations == 1 and found.overview_name == "NVIDIA H100 80GB HBM3"
    assert (found.trainer.low, found.trainer.high) == pytest.approx((0.8, 0.8))
    counts = verdict_table(slower).loc[:, ["faster", "slower", "no visible difference", "too few repeats"]]
    assert counts.loc[RATIOS["trainer"][2]].tolist() == [0, 1, 0, 0]
    assert counts.loc[RATIOS["ddp"][2]].tolist() == [1, 0, 0, 0]  # the same seconds against the trainer's
    assert (found.trainer.verdicts, found.ddp.verdicts) == ("slower in 1 configuration", "faster in 1 configuration")


def cells(markdown: str) -> dict[str, dict[str, str]]:
    """A Markdown table's cells: first column -> {header: cell}."""
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in markdown.splitlines()]
    return {row[0]: dict(zip(header[1:], row[1:])) for row in rows}


def test_a_ratios_medians_over_one_configuration_read_as_the_one_value():
    slower = made_up(
        {
            "plain": [1.0, 1.0, 1.0],
            "ddp_core": [1.25, 1.25, 1.0 / 0.9],
            "timed": [1.0, 1.0, 1.0],
            "ddp_of_one": [1.0, 1.0, 1.0],
        }
    )
    row = cells(verdict_markdown(slower))[RATIOS["trainer"][2]]
    assert row["Median per configuration, lowest to highest"] == "0.800"  # not "0.800 to 0.800"
    two = replace(
        slower,
        epochs=pd.concat(
            [
                slower.epochs,
                slower.epochs.assign(
                    batch_size=128, seconds=slower.epochs["seconds"].where(slower.epochs["loop"] != "ddp_core", 1.0)
                ),
            ]
        ),
    )
    assert (
        cells(verdict_markdown(two))[RATIOS["trainer"][2]]["Median per configuration, lowest to highest"]
        == "0.800 to 1.000"
    )


def test_a_share_of_the_matrix_product_rate_below_one_percent_shows_its_first_decimal():
    m = made_up({loop: [1.0, 1.0] for loop in LOOPS})  # 100 samples/s; 1.6e10 FLOPs a sample: 1.6 of 800 TFLOP/s
    tiny = replace(m, epochs=m.epochs.assign(flops_per_sample=1.6e10))
    row = cells(throughput_markdown(tiny))["large, bf16, batch 64"]
    assert row["Share of the matrix-product rate (%)"] == "0.2"  # as the GPU page gives it, not "0"
    assert row["MFU, of the bf16 datasheet peak (%)"] == "0.2"


def test_the_benchmark_is_set_beside_the_strong_scaling_studys_one_rank_runs():
    folder = REPO / "reference" / "scaling"
    runs = sorted(folder.glob("n1*"))
    per_sample = [
        pd.read_csv(run / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
        / json.loads((run / "run.json").read_text())["global_batch_size"]
        for run in runs
    ]
    experiment = load_experiment(folder)
    measured = read_measurement(REPO / "reference" / "single_device" / "cpu")
    same_cpu = replace(
        measured,
        info=measured.info
        | {"device_name": experiment.baseline.device_name, "cpu_extensions": experiment.baseline.raw["cpu_extensions"]},
    )
    beside = baseline_comparison(same_cpu, experiment)
    assert beside["outcome"] == "comparable"
    assert beside["runs_samples_per_s"] == pytest.approx(1 / pd.Series(per_sample).median())
    assert beside["repeats"] == f"{len(runs)} repeats"
    other_cpu = replace(same_cpu, info=same_cpu.info | {"cpu_extensions": ["avx2", "amx_bf16"]})
    assert baseline_comparison(other_cpu, experiment)["outcome"] == "other CPU"
    elsewhere = replace(measured, info=measured.info | {"device_name": "NVIDIA H100"})
    assert baseline_comparison(elsewhere, experiment) == {"outcome": "none"}
    table = cells(baseline_markdown([elsewhere, same_cpu], experiment))["Throughput (samples/s)"]
    assert float(table["The strong-scaling study's 1-rank runs"].replace(",", "")) == pytest.approx(
        1 / pd.Series(per_sample).median(), abs=0.05
    )
    assert float(table["This chapter"].replace(",", "")) == pytest.approx(beside["samples_per_s"], abs=0.05)
    assert [baseline_outcome(ms, experiment) for ms in ([same_cpu], [other_cpu], [elsewhere])] == [
        "the same CPU",
        "two CPUs of the same name",
        "not timed here",
    ]
    assert baseline_markdown([elsewhere], experiment) == ""


def test_the_page_says_what_each_measurement_ran_on_from_its_device_json():
    measured = read_measurement(REPO / "reference" / "single_device" / "cpu")
    gpu = replace(
        measured,
        info=measured.info
        | {
            "device": "cuda:0",
            "device_name": "NVIDIA H100 80GB HBM3",
            "cuda": "12.8",
            "git_commit": "0123456789abcdef",
        },
    )
    table = cells(measurements_markdown([measured, gpu]))
    assert table["Code commit"]["NVIDIA H100 80GB HBM3"] == "0123456789"
    assert table["Measured on"]["AMD EPYC"] == measured.info["start_time"][:10]
    assert table["PyTorch"]["NVIDIA H100 80GB HBM3"].endswith(", CUDA 12.8")
    assert table["Datasheet's dense bf16 peak (TFLOP/s)"] == {"AMD EPYC": "–", "NVIDIA H100 80GB HBM3": "989.4"}
    assert table["Timed epochs of each loop per configuration"]["AMD EPYC"] == str(measured.epochs["round"].nunique())


def test_the_precision_study_says_whether_the_one_device_chapter_timed_its_cpu():
    run = load_experiment(REPO / "reference" / "scaling").baseline
    measured = read_measurement(REPO / "reference" / "single_device" / "cpu")
    same = replace(
        measured, info=measured.info | {"device_name": run.device_name, "cpu_extensions": run.raw["cpu_extensions"]}
    )
    assert crossref([same], run).relation == "the same CPU"
    other = replace(same, info=same.info | {"cpu_extensions": ["avx512_bf16"]})
    found = crossref([other], run)  # the reference's machines differ from one remaking to the next
    assert found.relation == "two different CPUs" and found.cpu.endswith(" (avx512_bf16)")
    assert crossref([other, same], run).relation == "the same CPU"  # the run's CPU where measured
    gpu = replace(same, info=same.info | {"device": "cuda:0", "device_name": "NVIDIA H100"})
    assert crossref([gpu], run) == CpuCrossref("GPUs only", "not comparable")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("part", ["trainer", "studies"])
def test_the_gpu_sessions_trainings_ask_for_a_gpu_in_one_line_on_a_machine_without(tmp_path, isolated_env, part):
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_session.sh", part, str(tmp_path / "results")],
        cwd=REPO,
        env=isolated_env | {"PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "--device cuda needs a CUDA GPU per local rank: 1 local "
            "rank(s), 0 GPU(s) (on a machine without, use --device cpu "
            "and --backend gloo, or auto)"
        )
    )
    assert not (tmp_path / "results").exists()


def test_the_gpu_session_refuses_a_part_it_does_not_have(tmp_path):
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_session.sh", "everything", str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "gpu_session.sh: no part 'everything' (trainer, measure, studies, compiled, profile or timeline)\n",
    )
