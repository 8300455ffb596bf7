"""The report's analysis, as functions of an experiment: runs this machine made (the reference strong-scaling
study's first seed at 1 and 4 ranks, copied as a user's results folder), checked against their CSVs by an
independent computation; never against a stored value."""

import json
import shutil

import pandas as pd
import pytest
from matplotlib.container import BarContainer

from conftest import REPO
from ddp_core.report import discussion, prediction, scaling
from ddp_core.report.results import ResultsError, load_experiment


WORLD_SIZES = (1, 4)


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


def test_speedup_and_efficiency_are_time_per_sample_of_one_rank_over_n_ranks(folder, experiment):
    steady = {n: csv_of(folder, n).query("epoch > 1") for n in WORLD_SIZES}
    per_sample = {n: (df["epoch_time_s"] / df["train_samples"]).mean() for n, df in steady.items()}
    found = scaling.findings(experiment)
    largest = max(WORLD_SIZES)
    assert found["speedup_nmax"] == pytest.approx(per_sample[1] / per_sample[largest], rel=1e-12)
    assert found["efficiency_nmax"] == pytest.approx(per_sample[1] / per_sample[largest] / largest, rel=1e-12)
    assert found["epoch_time_s_n1"] == pytest.approx(steady[1]["epoch_time_s"].mean(), rel=1e-12)
    assert found["final_val_accuracy_nmax"] == csv_of(folder, largest)["val_accuracy"].iloc[-1]


def test_compute_per_step_leaves_out_the_exposed_communication(folder, experiment):
    run = csv_of(folder, max(WORLD_SIZES)).query("epoch > 1")
    expected = ((run["forward_time_s"] + run["backward_time_s"] - run["comm_exposed_s"] + run["optimizer_time_s"])
                / run["steps"]).mean()
    assert scaling.findings(experiment)["compute_per_step_s_nmax"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("speedups,sentence", [
    ((0.8, 0.8), "Against one rank, DDP made training slower at 4 ranks."),
    ((1.25, 1.25), "Against one rank, DDP made training faster at 4 ranks."),
    ((0.9, 1.1), "At 4 ranks the speedup (0.99 at 4 ranks, between 0.90 and 1.10 over the epochs) is within the "
                 "spread between epochs: no gain or loss can be told from it."),
], ids=["4 ranks lose", "4 ranks gain", "within the spread"])
def test_the_verdict_sentence_reads_right_for_every_outcome(experiment, speedups, sentence):
    metrics, one_epoch = experiment.metrics, 10.0
    assert list(metrics.query("world_size == 4")["epoch"]) == [1, 2, 3]
    metrics.loc[metrics["world_size"] == 1, "epoch_time_s"] = one_epoch
    for epoch, speedup in zip((2, 3), speedups):
        metrics.loc[(metrics["world_size"] == 4) & (metrics["epoch"] == epoch), "epoch_time_s"] = one_epoch / speedup
    assert discussion.findings(experiment)["verdict_sentence"] == sentence


def test_prediction_is_judged_against_the_measured_speedup_of_the_same_runs(experiment):
    table = scaling.scaling_table(experiment.metrics)
    found = prediction.findings(experiment)
    predicted = prediction.predict(experiment)
    assert list(predicted.index) == [n for n in WORLD_SIZES if n > 1]
    assert (predicted["measured_speedup"] == table.loc[predicted.index, "speedup"]).all()
    error = predicted["predicted_speedup"] / predicted["measured_speedup"] - 1
    assert found["max_error"] == pytest.approx(error.abs().max())
    assert found["target_verdict"] == ("meets" if error.abs().max() <= 0.10 else "misses")


def test_figures_draw_each_world_size_from_its_csv(folder, experiment):
    accuracy = scaling.accuracy_figure(experiment)
    lines = accuracy.axes[0].get_lines()
    assert [list(line.get_ydata()) for line in lines] == [list(csv_of(folder, n)["val_accuracy"]) for n in WORLD_SIZES]
    speedup = scaling.speedup_figure(experiment)
    measured = next(c for c in speedup.axes[0].containers if isinstance(c, BarContainer))
    table = scaling.scaling_table(experiment.metrics)
    assert [bar.get_height() for bar in measured] == pytest.approx(list(table["speedup"]))


def test_tables_have_a_column_per_world_size_and_words_with_units_as_headers(folder, experiment):
    header, _, *rows = scaling.results_markdown(experiment).splitlines()
    assert [cell.strip() for cell in header.strip("|").split("|")[1:]] == ["1 rank", "4 ranks"]
    labels = [row.split("|")[1].strip() for row in rows]
    assert "Epoch time (s)" in labels and "Peak memory, largest rank (MB)" in labels
    epoch_time = rows[labels.index("Epoch time (s)")].split("|")[2].strip()
    assert epoch_time == f"{csv_of(folder, 1).query('epoch > 1')['epoch_time_s'].mean():.2f}"


def test_repeats_are_averaged_and_their_spread_is_the_yardstick(folder):
    for n in WORLD_SIZES:  # a second seed of every world size, 10 % slower and 0.05 less accurate
        repeat = folder / f"n{n}-r2"
        shutil.copytree(folder / f"n{n}", repeat)
        info = json.loads((repeat / "run.json").read_text())
        info["config"]["seed"] = 1
        (repeat / "run.json").write_text(json.dumps(info))
        rows = pd.read_csv(repeat / "metrics.csv")
        rows.assign(epoch_time_s=rows["epoch_time_s"] * 1.1, val_accuracy=rows["val_accuracy"] - 0.05) \
            .to_csv(repeat / "metrics.csv", index=False)
    experiment = load_experiment(folder)
    assert [run.name for run in experiment.repeats[4]] == ["n4", "n4-r2"]
    table = scaling.scaling_table(experiment.metrics)
    assert list(table["runs"]) == [2, 2] and set(table["spread_over"]) == {"repeats"}
    per_sample = {(n, k): (csv_of(folder, n).query("epoch > 1")["epoch_time_s"] / csv_of(folder, n)
                           .query("epoch > 1")["train_samples"]).mean() * k for n in WORLD_SIZES for k in (1, 1.1)}
    assert table.loc[4, "speedup_low"] == pytest.approx(per_sample[1, 1] / per_sample[4, 1.1])
    assert table.loc[4, "speedup_high"] == pytest.approx(per_sample[1, 1.1] / per_sample[4, 1])
    final = {n: csv_of(folder, n)["val_accuracy"].iloc[-1] for n in WORLD_SIZES}
    assert table.loc[4, "final_val_accuracy"] == pytest.approx(final[4] - 0.025)
    sentence = discussion.findings(experiment)["accuracy_sentence"]
    assert "against up to 0.050 between the seeds of one world size" in sentence
    gap = abs(final[4] - final[1])
    assert sentence.endswith("so it is noise." if gap <= 0.05 + 1e-9 else "of one world size.")
