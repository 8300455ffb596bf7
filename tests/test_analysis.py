"""The report's analysis, as functions of an experiment: runs this machine made (the reference strong-scaling
study's first seed at 1 and 4 ranks, copied as a user's results folder), checked against their CSVs by an
independent computation; never against a stored value."""

import functools
import json
import math
import shutil

import pandas as pd
import pytest
from matplotlib.container import BarContainer

from conftest import REPO
from ddp_core.report import discussion, prediction
from ddp_core.report import scaling_analysis as scaling
from ddp_core.analysis import cost_model, payoff, provenance
from ddp_core.analysis.speedups import scaling_table
from ddp_core.analysis.comparisons import (
    WARMUP_STEPS,
    accuracy_floor,
    compare_accuracies,
    compare_times,
    final_accuracies,
    out_of_line,
    paired_sides,
    run_times,
    speedup_comparisons,
)
from ddp_core.analysis.nvlink_forecast import load_timelines
from ddp_core.analysis.results import ResultsError, load_experiment, load_study
from ddp_core.analysis.tables import difference_text, median_range, range_text
from ddp_core.analysis.verdict import compare, noise_floor


WORLD_SIZES = (1, 4)


@functools.cache
def reference_nodes():
    """The results chapter's page quotes the emulated nodes beside any runs: here, the shipped ones as its input."""
    return load_study(REPO / "reference" / "nodes")


@pytest.fixture
def folder(tmp_path):
    for name in [f"n{n}" for n in WORLD_SIZES] + ["allreduce-n4"]:
        shutil.copytree(REPO / "reference" / "scaling" / name, tmp_path / "scaling" / name)
    return tmp_path / "scaling"


@pytest.fixture
def experiment(folder):
    return load_experiment(folder)


def csv_of(folder, n: int) -> pd.DataFrame:
    return pd.read_csv(folder / f"n{n}" / "metrics.csv")


def test_an_experiment_holds_one_run_per_world_size_with_its_benchmarks(experiment):
    assert list(experiment.runs) == list(WORLD_SIZES)
    assert all(run.world_size == n and run.name == f"n{n}" for n, run in experiment.runs.items())
    assert list(experiment.allreduce) == [n for n in WORLD_SIZES if n > 1]
    assert sorted(experiment.metrics["world_size"].unique()) == list(WORLD_SIZES)


def test_two_runs_of_one_world_size_are_refused_by_name(folder):
    shutil.copytree(folder / "n4", folder / "n4-again")
    with pytest.raises(ResultsError, match="runs n4 and n4-again both have world size 4"):
        load_experiment(folder)


def median_step(folder, n: int, repeat: str = "") -> float:
    """A run's median step after its warm-up steps, computed here from its steps.csv."""
    return pd.read_csv(folder / f"n{n}{repeat}" / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()


def test_speedup_and_efficiency_are_the_median_step_per_sample_of_one_rank_over_n_ranks(folder, experiment):
    per_sample = {n: median_step(folder, n) / csv_of(folder, n)["global_batch_size"].iloc[0] for n in WORLD_SIZES}
    found, table = scaling.findings(experiment, None, reference_nodes()), scaling_table(experiment)
    largest = max(WORLD_SIZES)
    assert table.loc[largest, "speedup"] == pytest.approx(per_sample[1] / per_sample[largest], rel=1e-12)
    assert found.nmax.efficiency == pytest.approx(per_sample[1] / per_sample[largest] / largest, rel=1e-12)
    assert found.n1.samples_per_s == pytest.approx(1 / per_sample[1], rel=1e-12)
    assert table.loc[1, "epoch_time_s"] == pytest.approx(csv_of(folder, 1).query("epoch > 1")["epoch_time_s"].mean())
    assert found.nmax.final_val_accuracy == csv_of(folder, largest)["val_accuracy"].iloc[-1]


def test_a_run_stopped_after_its_first_epoch_is_shown_with_that_epoch(folder):
    stopped = csv_of(folder, 4).iloc[:1]
    stopped.to_csv(folder / "n4" / "metrics.csv", index=False)
    experiment = load_experiment(folder)
    assert scaling_table(experiment).loc[4, "epoch_time_s"] == stopped["epoch_time_s"].iloc[0]
    found = scaling.findings(experiment, None, reference_nodes())
    assert found.nmax.final_val_accuracy == stopped["val_accuracy"].iloc[0]


def add_repeats(folder, step_times: dict[int, list[float]]):
    """Repeats 2.. of every world size as copies of the first with other seeds, and each repeat k's every step
    set to step_times[n][k - 1] seconds."""
    for n, times in step_times.items():
        for k, seconds in enumerate(times, 1):
            run = folder / (f"n{n}" if k == 1 else f"n{n}-r{k}")
            if k > 1:
                shutil.copytree(folder / f"n{n}", run)
                info = json.loads((run / "run.json").read_text())
                info["config"]["seed"] = k - 1
                (run / "run.json").write_text(json.dumps(info))
            steps = pd.read_csv(run / "steps.csv")
            steps.assign(step_time_s=seconds).to_csv(run / "steps.csv", index=False)
    return load_experiment(folder)


def test_compute_per_step_leaves_out_the_exposed_communication(folder, experiment):
    run = csv_of(folder, max(WORLD_SIZES)).query("epoch > 1")
    expected = (
        (run["forward_time_s"] + run["backward_time_s"] - run["comm_exposed_s"] + run["optimizer_time_s"])
        / run["steps"]
    ).mean()
    found = scaling.findings(experiment, None, reference_nodes())
    assert found.nmax.compute_per_step_s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "speedups,value,verdict",
    [
        ((0.8, 0.8, 0.8), "0.80 (the same in each of 3 repeats)", "slower (beyond the noise floor of 0.0%)"),
        ((1.25, 1.2, 1.3), "1.25 (1.20 to 1.30 over 3 repeats)", "faster (beyond the noise floor of"),
        ((0.9, 1.1, 1.0), "1.00 (0.90 to 1.10 over 3 repeats)", "no visible difference (within the noise floor of"),
        ((0.8,), "0.80 (one run each)", "no verdict (1 of each side; a verdict needs 3 repeats)"),
    ],
    ids=["4 ranks lose", "4 ranks gain", "within the noise", "too few repeats"],
)
def test_the_speedup_verdict_reads_right_for_every_outcome(folder, speedups, value, verdict):
    # the 1-rank repeats take 0.1 s a step; so do all repeats of the 4-rank run but for its speedup
    experiment = add_repeats(folder, {1: [0.1] * len(speedups), 4: [0.1 / s for s in speedups]})
    found = discussion.findings(experiment, reference_nodes())
    assert found.speedup_nmax.value == value
    assert found.speedup_nmax.verdict.startswith(verdict)


def test_prediction_is_judged_against_the_measured_speedup_of_the_same_runs(experiment):
    table = scaling_table(experiment)
    found = prediction.findings(experiment, load_timelines(REPO / "reference" / "gpu_timeline"))
    predicted = prediction.predict(experiment)
    assert list(predicted.index) == [n for n in WORLD_SIZES if n > 1]
    assert (predicted["measured_speedup"] == table.loc[predicted.index, "speedup"]).all()
    error = predicted["predicted_speedup"] / predicted["measured_speedup"] - 1
    assert found.max_error == pytest.approx(error.abs().max())
    parts = pd.concat(
        [
            predicted["predicted_compute_s"] / predicted["measured_compute_s"] - 1,
            predicted["predicted_comm_s"] / predicted["measured_comm_s"] - 1,
        ]
    ).abs()
    null = (1 / predicted["measured_speedup"] - 1).abs()
    assert found.target.parts_max_error == pytest.approx(parts.max())
    meets = error.abs().max() <= 0.10 and parts.max() <= 0.10 and error.abs().max() < null.max()
    assert found.target.outcome == ("meets" if meets else "misses")
    worst = predicted.loc[found.worst.n]
    for part in ("step", "comm", "compute"):
        assert getattr(found.worst, f"{part}_gap_ms") == pytest.approx(
            (worst[f"predicted_{part}_s"] - worst[f"measured_{part}_s"]) * 1e3
        )
    assert found.target.null_max_error == pytest.approx((1 / predicted["measured_speedup"] - 1).abs().max())


def test_a_prediction_without_a_benchmark_at_any_run_s_world_size_says_so_in_one_line(experiment):
    with pytest.raises(ResultsError) as refused:
        prediction.predict(experiment, allreduce={8: experiment.allreduce[max(experiment.allreduce)]})
    assert "needs a run and an all-reduce benchmark at the same world size" in str(refused.value)
    assert "benchmarks at [8]" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "predicted, measured, comm_error, meets, inside, against_null",
    [
        ([1.05, 0.95], [1.0, 1.0], 0.0, "misses", 2, "no smaller than"),  # no speedup measured: the null model is exact
        ([1.2, 0.95], [1.0, 1.0], 0.0, "misses", 1, "no smaller than"),
        (
            [1.9, 3.2],
            [2.0, 3.0],
            0.05,
            "meets",
            2,
            "smaller than",
        ),  # a real speedup: the null model errs by 50 and 67 %
        ([1.9, 3.2], [2.0, 3.0], 0.5, "misses", 2, "smaller than"),  # the all-reduce part missed by 50 %
    ],
)
def test_the_prediction_is_judged_against_its_target_the_spread_of_the_repeats_and_a_null_model(
    predicted, measured, comm_error, meets, inside, against_null
):
    frame = pd.DataFrame(
        {"predicted_speedup": predicted, "measured_speedup": measured, "compute_error": 0.02, "comm_error": comm_error},
        index=[2, 4],
    )
    frame["measured_speedup_low"] = frame["measured_speedup"] * 0.9
    frame["measured_speedup_high"] = frame["measured_speedup"] * 1.1
    frame["error"] = frame["predicted_speedup"] / frame["measured_speedup"] - 1
    found = prediction.target_check(frame)
    assert (found.outcome, found.inside, found.model_vs_null) == (meets, inside, against_null)
    assert found.parts_max_error == pytest.approx(max(0.02, comm_error))
    assert found.null_max_error == pytest.approx(max(abs(1 / m - 1) for m in measured))
    null_better = [n for n, p, m in zip((2, 4), predicted, measured) if abs(1 / m - 1) < abs(p / m - 1)]
    assert found.null_better_at == (", ".join(f"{n} ranks" for n in null_better) or "no world size")


def test_figures_draw_each_world_size_from_its_csv(folder, experiment):
    accuracy = scaling.accuracy_figure(experiment)
    *runs, chance = accuracy.axes[0].get_lines()
    assert [list(line.get_ydata()) for line in runs] == [list(csv_of(folder, n)["val_accuracy"]) for n in WORLD_SIZES]
    classes = json.loads((folder / "n1" / "run.json").read_text())["model"]["num_classes"]
    assert list(chance.get_ydata()) == [1 / classes] * 2 and chance.get_label().startswith("chance")
    speedup = scaling.speedup_figure(experiment)
    measured = next(c for c in speedup.axes[0].containers if isinstance(c, BarContainer))
    table = scaling_table(experiment)
    assert [bar.get_height() for bar in measured] == pytest.approx(list(table["speedup"]))


def test_tables_have_a_column_per_world_size_and_words_with_units_as_headers(folder, experiment):
    header, _, *rows = scaling.results_markdown(experiment).splitlines()
    assert [cell.strip() for cell in header.strip("|").split("|")[1:]] == ["1 rank", "4 ranks"]
    labels = [row.split("|")[1].strip() for row in rows]
    assert "Epoch time, median of the repeats (s)" in labels and "Peak memory, largest rank and repeat (MiB)" in labels
    epoch_time = rows[labels.index("Epoch time, median of the repeats (s)")].split("|")[2].strip()
    assert epoch_time == f"{csv_of(folder, 1).query('epoch > 1')['epoch_time_s'].mean():.2f}"


@pytest.mark.parametrize(
    "low, high, fmt, reads, with_median",
    [
        (1.2, 1.59, "{:.2f}", "1.20 to 1.59", "1.59 (1.20 to 1.59)"),
        (1.4109, 1.4112, "{:.3f}", "1.411", "1.411"),
        (0.95, 0.95, "{:.0%}", "95%", "95%"),
    ],
)
def test_a_range_whose_ends_read_the_same_is_given_as_its_one_value(low, high, fmt, reads, with_median):
    assert range_text(low, high, fmt, " to ") == reads
    assert median_range(high, low, high, fmt, " to ") == with_median


@pytest.mark.parametrize(
    "gap, reads",
    [
        (0.0, "0"),
        (3.2e-8, "1e-7"),
        (1e-7, "1e-7"),
        (9.9e-9, "1e-8"),
        (0.0032, "0.0032"),
        (0.15, "0.15"),
        (2.5, "2.5"),
        (1234.5, "1,234"),
    ],
)
def test_a_difference_reads_as_a_number_and_one_at_float_rounding_as_the_power_of_ten_it_lies_within(gap, reads):
    assert difference_text(gap) == reads
    assert difference_text(gap, "below ") == (f"below {reads}" if "e" in reads else reads)


def test_the_discussion_gives_the_bytes_a_link_carries_while_a_rank_computes_a_thousand_flops(experiment):
    """Per thousand FLOPs, so that a CPU's and an A100 node's both read as plain numbers, not 0.000798."""
    found = payoff.payoff(experiment)
    hardware = payoff._hardware(experiment)
    for kind, name in (("cpu", payoff.CPU), ("gpu", payoff.GPU)):
        rate, fit = hardware[name]
        assert getattr(found, f"{kind}_bytes_per_kflop") == pytest.approx(fit.bus_bandwidth_GBps * 1e9 / rate * 1e3)
    assert found.link_per_flop_ratio == pytest.approx(found.cpu_bytes_per_kflop / found.gpu_bytes_per_kflop)
    assert 0.1 < found.gpu_bytes_per_kflop < 10  # an A100 node's, from published figures: no zeros to count


def test_the_setup_table_says_a_gpu_runs_driver_is_unknown_where_it_was_not_recorded(folder):
    def setup_row(label: str) -> str:
        rows = provenance.shared_markdown(load_experiment(folder)).splitlines()
        return next(row.split("|")[2].strip() for row in rows if row.split("|")[1].strip() == label)

    assert setup_row("GPU driver") == "none"  # runs on CPUs
    assert setup_row("`--dataset`") == "imdb"  # settings in code, so that LaTeX keeps the two dashes
    for n in WORLD_SIZES:
        info = json.loads((folder / f"n{n}" / "run.json").read_text())
        (folder / f"n{n}" / "run.json").write_text(json.dumps(info | {"device": "cuda:0", "gpu_driver": None}))
    assert setup_row("GPU driver") == "unknown"


def test_the_setup_table_names_the_cpus_extensions_and_a_run_says_what_else_the_machine_did(folder):
    rows = provenance.shared_markdown(load_experiment(folder)).splitlines()
    extensions = next(row.split("|")[2].strip() for row in rows if "extensions" in row)
    recorded = json.loads((folder / "n1" / "run.json").read_text())["cpu_extensions"]
    assert extensions == (", ".join(f"`{name}`" for name in recorded) or "none of AVX2, AVX-512, AMX")
    machine = {"wall_s": 10.0, "run_cpu_s": 15.0, "other_cpu_s": 5.0, "steal_cpu_s": 0.4, "cores": 2}
    summary = provenance.run_markdown(json.loads((folder / "n1" / "run.json").read_text()) | {"machine": machine})
    rows = {row.split("|")[1].strip(): row.split("|")[2].strip() for row in summary.splitlines()[2:]}
    assert rows["Other processes while it trained (cores)"] == "0.50 of 2"
    assert rows["Taken by the hypervisor (% of the cores)"] == "2.0%"


def test_the_set_up_names_every_machine_and_day_the_shown_results_were_made_on(folder):
    """The book's results may come from several machines and days (studies on one CPU, benchmarks on another, a GPU
    lease): the set-up names each, a CPU with its extensions and cores, and the days from first to last."""
    results = folder.parent
    info = json.loads((folder / "n4" / "run.json").read_text())
    (folder / "n4" / "run.json").write_text(json.dumps(info | {"start_time": "2026-12-03T08:00:00+00:00"}))
    benchmark = results / "single_device" / "cuda-nvidia-h200"  # a benchmark's folder per device
    benchmark.mkdir(parents=True)
    (benchmark / "device.json").write_text(
        json.dumps(
            {
                "device": "cuda:0",
                "device_name": "NVIDIA H200",
                "cpu_count": 16,
                "start_time": "2026-11-20T01:00:00+00:00",
            }
        )
    )
    made = provenance.made(results)
    assert made.days == "2026-11-20 to 2026-12-03"
    cpu = f"{info['device_name']} ({', '.join(info['cpu_extensions'])}), {info['cpu_count']} cores"
    assert made.machines == "; ".join(sorted([cpu, "NVIDIA H200"]))


def test_a_slow_round_slows_both_sides_of_its_pairs_and_leaves_the_speedup_as_it_was(folder):
    # round 2 ran while the machine was 30 % slower: both world sizes' repeat 2 took 1.3 times as long
    one, four = median_step(folder, 1), median_step(folder, 4)
    experiment = add_repeats(folder, {1: [one, one * 1.3, one], 4: [four, four * 1.3, four]})
    table = scaling_table(experiment)
    assert list(table["runs"]) == list(table["pairs"]) == [3, 3]
    assert table.loc[4, "speedup_low"] == pytest.approx(table.loc[4, "speedup_high"]) == pytest.approx(one / four)
    assert table.loc[4, "noise_floor"] == pytest.approx(0.0, abs=1e-12)  # both sides slowed: pairing cancels it
    assert table.loc[4, "step_time_s"] == pytest.approx(four)  # a median of the repeats: the slow one is left out


def test_a_run_its_repeats_call_out_of_line_is_named_and_changes_no_verdict(folder):
    """One 4-rank repeat ran 1.6 times as long as its two others (something else used the machine): its repeats
    call it out of line, and the speedup, a median of paired ratios, stays what the other rounds say."""
    steady = add_repeats(folder, {1: [0.2, 0.2, 0.2], 4: [0.1, 0.1, 0.1]})
    before = speedup_comparisons(steady)[4]
    steps = pd.read_csv(folder / "n4-r2" / "steps.csv")
    steps.assign(step_time_s=0.16).to_csv(folder / "n4-r2" / "steps.csv", index=False)
    slowed = load_experiment(folder)
    times = run_times(slowed)
    flagged = out_of_line(times["step_time_s"], times["world_size"])
    assert flagged.dropna().to_dict() == {times.index[times["run"] == "n4-r2"][0]: pytest.approx(1.6)}
    after = speedup_comparisons(slowed)[4]
    assert (after.verdict, after.ratio) == (before.verdict, pytest.approx(before.ratio)) and after.verdict == "higher"


def test_only_a_run_far_from_the_median_of_at_least_three_repeats_is_out_of_line():
    times = pd.Series([1.0, 1.4, 1.0, 1.0, 0.6, 1.0, 1.0, 2.0])
    configurations = pd.Series(["a", "a", "a", "b", "b", "b", "c", "c"])
    flagged = out_of_line(times, configurations)
    assert flagged.dropna().to_dict() == {4: pytest.approx(0.6)}  # 1.4x is in line; two repeats have no majority


def test_each_repeat_is_divided_by_the_repeat_of_its_own_round(folder):
    drift, speedups = (1.0, 1.5, 1.2), (1.0, 2.0, 0.8)  # the rounds' slowness, and the 4-rank speedup in each
    experiment = add_repeats(folder, {1: [0.1 * d for d in drift], 4: [0.1 * d / s for d, s in zip(drift, speedups)]})
    table = scaling_table(experiment)
    assert table.loc[4, ["speedup", "speedup_low", "speedup_high"]].tolist() == pytest.approx([1.0, 0.8, 2.0])


@pytest.mark.parametrize(
    "target, verdict", [(1.3, "slower (beyond"), (0.7, "faster (beyond"), (1.0, "no visible difference (within")]
)
def test_the_ranks_compute_is_judged_against_the_one_rank_compute_divided_among_the_cores(folder, target, verdict):
    add_repeats(folder, {1: [0.1] * 3, 4: [0.1] * 3})
    found = discussion.findings(load_experiment(folder), reference_nodes())
    scale = target * found.divided_compute_ms / found.compute_nmax_ms
    for k, repeat_scale in enumerate((scale, scale * 1.01, scale * 0.99), 1):  # three repeats, 1 % apart
        run = folder / ("n4" if k == 1 else f"n4-r{k}")
        rows = pd.read_csv(run / "metrics.csv")
        compute = ["forward_time_s", "backward_time_s", "comm_exposed_s", "optimizer_time_s"]
        rows[compute] *= repeat_scale
        rows.to_csv(run / "metrics.csv", index=False)
    found = discussion.findings(load_experiment(folder), reference_nodes())
    assert found.compute_nmax_ms / found.divided_compute_ms == pytest.approx(target)
    assert found.divided.value.startswith(f"{target:.2f} (")
    assert found.divided.verdict.startswith(verdict)


def test_accuracy_is_compared_seed_by_seed_between_world_sizes(folder):
    add_repeats(folder, {1: [0.1] * 3, 4: [0.1] * 3})
    for n in WORLD_SIZES:  # accuracies of the repeats (seeds) 0.70, 0.72, 0.74 at one rank; 4 ranks 0.15 lower
        for k, accuracy in enumerate((0.70, 0.72, 0.74), 1):
            run = folder / (f"n{n}" if k == 1 else f"n{n}-r{k}")
            rows = pd.read_csv(run / "metrics.csv")
            rows.assign(val_accuracy=accuracy - (0.15 if n == 4 else 0)).to_csv(run / "metrics.csv", index=False)
    found = discussion.findings(load_experiment(folder), reference_nodes())
    assert found.accuracy_nmax.value == "0.79 (0.79 to 0.80 over 3 repeats)"
    assert found.accuracy_nmax.verdict.startswith("lower (beyond the noise floor of")


@pytest.mark.parametrize(
    "one_rank, four_ranks, verdict",
    [
        ((0.70, 0.72, 0.74), (0.67, 0.69, 0.71), "no visible difference"),  # 4 % apart, within what 500 samples resolve
        ((0.50, 0.51, 0.49), (0.47, 0.48, 0.46), "at chance"),  # every pair lower, but both sides guess
    ],
)
def test_no_accuracy_verdict_where_the_evaluation_set_cannot_resolve_it_or_both_sides_guess(
    folder, one_rank, four_ranks, verdict
):
    add_repeats(folder, {1: [0.1] * 3, 4: [0.1] * 3})
    set_final_accuracies(folder, 1, one_rank)
    set_final_accuracies(folder, 4, four_ranks)
    experiment = load_experiment(folder)
    samples = json.loads((folder / "n1" / "run.json").read_text())["config"]["eval_samples"]
    c = compare_accuracies(experiment, experiment, 4, 1)
    assert c.verdict == verdict
    p = pd.Series(one_rank + four_ranks).median()
    assert c.floor >= math.exp(2 * math.sqrt(2 * p * (1 - p) / samples) / p) - 1 - 1e-12


def set_final_accuracies(folder, n: int, accuracies):
    for k, accuracy in enumerate(accuracies, 1):
        run = folder / (f"n{n}" if k == 1 else f"n{n}-r{k}")
        pd.read_csv(run / "metrics.csv").assign(val_accuracy=accuracy).to_csv(run / "metrics.csv", index=False)


@pytest.mark.parametrize(
    "accuracies, says",
    [
        ((0.50, 0.51, 0.49), "at chance in every repeat"),
        ((0.50, 0.70, 0.80), "above chance in 2 of 3 repeats"),
        ((0.70, 0.75, 0.80), "above chance in every repeat"),
    ],
)
def test_an_accuracy_a_guess_could_reach_on_the_evaluation_set_is_called_at_chance(folder, accuracies, says):
    add_repeats(folder, {1: [0.1] * 3, 4: [0.1] * 3})
    set_final_accuracies(folder, 1, accuracies)
    found = scaling.findings(load_experiment(folder), None, reference_nodes())
    samples = json.loads((folder / "n1" / "run.json").read_text())["config"]["eval_samples"]
    assert found.accuracy.chance == 0.5  # IMDB: two classes
    assert found.accuracy.chance_bar == pytest.approx(0.5 + 2 * (0.25 / samples) ** 0.5)
    assert found.accuracy.vs_chance == says


def steady_per_step(folder, n: int, columns) -> float:
    """A run's mean over its epochs after the first of sum(columns) / steps, computed here from its metrics.csv."""
    steady = csv_of(folder, n).query("epoch > 1")
    return float((steady[list(columns)].sum(axis=1) / steady["steps"]).mean())


def test_r_n_is_one_nth_of_the_one_rank_compute_over_the_all_reduce(folder, experiment):
    """The theory's R_N = (T_c/N) / T_comm(N), the same number on every page: not the N-rank run's own compute."""
    compute_1 = steady_per_step(folder, 1, ["forward_time_s", "backward_time_s", "optimizer_time_s"])
    comm_4 = steady_per_step(folder, 4, ["comm_total_s"])
    expected = compute_1 / 4 / comm_4
    assert scaling_table(experiment).loc[4, "compute_to_comm_ratio"] == pytest.approx(expected)
    found = payoff.payoff(experiment)
    assert found.ratio_n_model == pytest.approx(expected)
    assert found.break_even_ratio == pytest.approx(steady_per_step(folder, 4, ["comm_exposed_s"]) / comm_4 / (4 - 1))


def test_the_time_a_step_loses_is_split_into_parts_that_add_up_to_it(folder, experiment):
    found = discussion.findings(experiment, reference_nodes())
    lost = found.step_nmax_ms - found.ideal_step_ms
    assert found.ideal_step_ms == pytest.approx(steady_per_step(folder, 1, ["epoch_time_s"]) * 1e3 / 4)
    assert found.lost_ms == pytest.approx(lost)
    assert found.lost_compute_ms + found.lost_comm_ms + found.lost_other_ms == pytest.approx(lost)
    table = scaling_table(experiment)
    assert found.lost_comm_ms == pytest.approx(table.loc[4, "comm_exposed_per_step_s"] * 1e3)


@pytest.mark.filterwarnings("ignore:divide by zero")  # the fit's R² of a benchmark flat by construction
def test_the_all_reduce_in_flight_is_split_into_the_benchmarked_transfer_and_waiting(folder):
    """An all-reduce that the benchmark times at T for every size transfers a step's buckets in buckets x T; the
    rest of its time in flight is waiting, and a benchmark slower than training leaves no waiting at all."""
    in_flight = steady_per_step(folder, 4, ["comm_total_s"])
    buckets = json.loads((folder / "n4" / "run.json").read_text())["allreduces_per_step"]
    bench_csv = folder / "allreduce-n4" / "allreduce.csv"
    bench = pd.read_csv(bench_csv)
    for each_bucket, transfer in [(in_flight / (4 * buckets), in_flight / 4), (in_flight, in_flight)]:
        bench.assign(time_s=each_bucket).to_csv(bench_csv, index=False)
        split = cost_model.communication_split(load_experiment(folder)).loc[4]
        assert split["in_flight_s"] == pytest.approx(in_flight)
        assert split["transfer_s"] == pytest.approx(transfer)
        assert split["waiting_s"] == pytest.approx(in_flight - transfer)


def test_the_parts_of_the_mean_step_add_up_to_no_more_than_it(experiment):
    table = scaling_table(experiment)
    parts = table["compute_per_step_s"] + table["comm_exposed_per_step_s"] + table["data_per_step_s"]
    assert (parts <= table["mean_step_s"]).all()
    assert table.loc[4, "mean_step_s"] == pytest.approx(
        (experiment.metrics.query("world_size == 4 and epoch > 1").eval("epoch_time_s / steps")).mean()
    )


@pytest.mark.parametrize(
    "predicts_gain,ratios,says",
    [
        (True, [1.2, 1.3, 1.25], "as the theory predicts"),
        (True, [0.7, 0.72, 0.71], "contrary to the theory's prediction"),
        (False, [0.7, 0.72, 0.71], "as the theory predicts"),
        (False, [1.2, 1.3, 1.25], "contrary to the theory's prediction"),
        (True, [0.9, 1.1, 1.0], "so the runs can neither confirm nor refute the prediction: no visible difference"),
    ],
    ids=["gain predicted, gain", "gain predicted, loss", "loss predicted, loss", "loss predicted, gain", "noise"],
)
def test_the_discussion_says_whether_the_theory_held_for_every_outcome(predicts_gain, ratios, says):
    assert payoff.theory_outcome(predicts_gain, compare(ratios, [1.0] * 3, 0.05)).startswith(says)


@pytest.mark.parametrize(
    "exposed,last,says",
    [(0.5, 0.8, "the last bucket"), (0.9, 0.8, "the measured share")],
    ids=["less than the last bucket", "more than the last bucket"],
)
def test_the_prediction_says_which_exposure_it_used(exposed, last, says):
    assert prediction.exposure_source(pd.Series({"exposed_fraction": exposed, "last_bucket_share": last})) == says


@pytest.mark.parametrize("threads, says", [(4, "more than"), (2, "as many as"), (1, "fewer than")])
def test_the_chapter_says_whether_the_ranks_threads_outnumbered_the_cores(threads, says):
    assert prediction.threads_against_cores(threads, 2) == says


def test_the_predicted_exposure_is_never_below_the_last_bucket(experiment):
    predicted = prediction.predict(experiment).loc[4]
    exposed = predicted["predicted_step_s"] - predicted["predicted_compute_s"]
    assert exposed >= predicted["last_bucket_share"] * predicted["predicted_comm_s"] * (1 - 1e-9)
    assert exposed == pytest.approx(
        max(predicted["exposed_fraction"], predicted["last_bucket_share"]) * predicted["predicted_comm_s"]
    )


def test_the_ideal_speedup_for_the_cores_counts_the_cores_the_ranks_computed_on(folder, experiment):
    """Ranks that share a machine's cores add no compute: their ideal is the cores they had over one rank's."""

    def cores(n: int) -> float:
        info = json.loads((folder / f"n{n}" / "run.json").read_text())
        return min(info["threads_per_rank"], info["cpu_count"] / info["local_world_size"])

    table = scaling_table(experiment)
    assert table.loc[4, "cores_ideal"] == pytest.approx(4 * cores(4) / cores(1))
    assert table.loc[1, "cores_ideal"] == 1


def test_an_experiment_compared_with_itself_counts_its_configurations_once_in_the_floor(folder):
    add_repeats(folder, {1: [0.1, 0.12, 0.11], 4: [0.2, 0.21, 0.26]})
    set_final_accuracies(folder, 1, (0.70, 0.72, 0.74))
    set_final_accuracies(folder, 4, (0.69, 0.73, 0.70))
    experiment = load_experiment(folder)
    one, four = final_accuracies(experiment, 1), final_accuracies(experiment, 4)
    assert accuracy_floor(experiment, experiment) == pytest.approx(noise_floor([one, four]))
    times = paired_sides(experiment)
    assert compare_times(experiment, experiment, 4, 1).floor == pytest.approx(noise_floor([times[1], times[4]]))


def test_the_discussion_says_how_far_apart_the_presets_need_tokens_as_its_table_shows(experiment):
    """The model-size bullet quotes the spread of the table beside it: the preset that needs the most tokens on ranks
    like the results chapter's, the one that needs the fewest, and how many times as many."""
    lines = [line for line in discussion.tokens_needed_markdown(experiment).splitlines() if line.startswith("|")]
    presets = [cell.strip() for cell in lines[0].strip("|").split("|")][1:]
    row = next(line for line in lines if "ranks like these: break even" in line)
    needed = dict(zip(presets, (float(cell.replace(",", "")) for cell in row.strip("|").split("|")[1:])))
    found = payoff.payoff(experiment)
    assert found.most_cpu == max(needed, key=needed.get) and found.fewest_cpu == min(needed, key=needed.get)
    assert found.tokens_spread_cpu == pytest.approx(max(needed.values()) / min(needed.values()), rel=0.02)


def test_the_discussion_gives_the_theorys_own_speedup_from_the_runs_ratio_and_exposed_share(experiment):
    """N x/(1+x), x = R_N/f, with R_N and f the runs' own at the largest benchmarked world size."""
    found = payoff.payoff(experiment)
    n = found.n_model
    x = scaling_table(experiment).loc[n, "compute_to_comm_ratio"] / scaling_table(experiment).loc[n, "exposed_share"]
    assert found.theory_speedup == pytest.approx(n * x / (1 + x))


@pytest.mark.parametrize(
    "value, floor, shown",
    [
        (2.664, 0.07, "2.7"),  # 7 % of 2.66 is 0.19: the first decimal is the noise's
        (0.801, 0.04, "0.80"),  # 4 % of 0.80 is 0.03: the second decimal
        (12.3, 0.2, "12"),  # 20 % of 12 is 2.5: no decimal
        (1.234, 0.0001, "1.23"),  # never more than two decimals
        (1.234, float("nan"), "1.23"),  # no floor known: two decimals
    ],
)
def test_a_number_is_written_to_the_digit_its_noise_floor_allows(value, floor, shown):
    from ddp_core.analysis.tables import noise_format

    assert noise_format(value, floor).format(value) == shown


def test_the_pages_say_where_the_ranks_ran_in_words_that_hold_for_cpu_ranks_and_for_gpus():
    """The results chapter, the discussion and the first page take where the ranks ran from one place: runs on GPUs
    are never said to share a machine's CPU cores. The GPU runs here are the reference's CPU runs relabelled."""
    from dataclasses import replace

    from ddp_core.analysis.results import load_experiment
    from ddp_core.analysis.speedups import largest

    cpu = load_experiment(REPO / "reference" / "scaling")
    gpu = replace(cpu, repeats={n: [replace(run, device="cuda:0") for run in runs] for n, runs in cpu.repeats.items()})
    assert largest(cpu).placement == f"shared one machine's {cpu.baseline.cpu_count} CPU cores"
    assert largest(gpu).placement == "each had a GPU of its own"


@pytest.mark.parametrize(
    "value, fmt, scale, cell",
    [
        (-0.004, "{:+.0%}", 1, "0%"),  # a forecast error that rounds to nothing has no sign
        (-0.0004, "{:+.2f}", 100, "-0.04"),
        (0.0004, "{:+.1f}", 1, "0.0"),
        (-0.03, "{:+.0%}", 1, "-3%"),
        (float("nan"), "{:.2f}", 1, "–"),
    ],
)
def test_a_table_cell_gives_no_sign_to_a_number_that_rounds_to_zero(value, fmt, scale, cell):
    from ddp_core.analysis.tables import quantity_table

    table = quantity_table(pd.DataFrame({"x": [value]}), {"x": ("X", fmt, scale)})
    assert table.splitlines()[-1].strip(" |").split("|")[-1].strip() == cell
