"""Steps to a target accuracy, and the critical batch size fitted to them."""

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from ddp_core.analysis import critical_batch as cb
from ddp_core.analysis.critical_batch import critical_batch_study
from ddp_core.report import time_to_accuracy as tta
from ddp_core.analysis.results import load_study
from ddp_core.analysis.critical_batch import critical_batch, steps_to_target


def test_steps_to_target_is_the_first_evaluation_at_or_past_it():
    evals = pd.DataFrame({"step": [10, 20, 30, 40], "val_accuracy": [0.55, 0.70, 0.65, 0.72]})
    assert steps_to_target(evals, 0.70) == 20  # at the target counts; a later dip does not move it
    assert steps_to_target(evals, 0.71) == 40


def test_a_run_that_never_reached_the_target_is_not_given_its_last_step():
    evals = pd.DataFrame({"step": [10, 20, 30], "val_accuracy": [0.55, 0.60, 0.62]})
    assert math.isnan(steps_to_target(evals, 0.70))


def test_the_fit_recovers_the_critical_batch_of_steps_that_follow_mccandlishs_model():
    s_min, e_min = 40.0, 2560.0  # B_crit = 64
    batches = [8, 16, 32, 64, 128, 256, 512]
    steps = [s_min + e_min / b for b in batches]
    fit = critical_batch(batches, steps)
    assert fit["s_min"] == pytest.approx(s_min) and fit["e_min"] == pytest.approx(e_min)
    assert fit["b_crit"] == pytest.approx(64.0)
    # (S/S_min - 1)(E/E_min - 1) = 1 at every measured batch size
    for b, s in zip(batches, steps):
        assert (s / fit["s_min"] - 1) * (b * s / fit["e_min"] - 1) == pytest.approx(1.0)


def test_runs_that_never_reached_the_target_are_left_out_of_the_fit_and_one_batch_size_fits_nothing():
    batches, steps = [8, 16, 32, 64], [40 + 640 / 8, 40 + 640 / 16, math.nan, 40 + 640 / 64]
    assert critical_batch(batches, steps)["b_crit"] == pytest.approx(16.0)
    assert math.isnan(critical_batch([8, 8, 16], [50, 52, math.nan])["b_crit"])


def test_no_bend_in_the_measured_range_gives_no_critical_batch():
    """Steps that fall faster than 1/B (or not at all) fit a negative S_min or E_min: B_crit is not measured."""
    assert math.isnan(critical_batch([8, 16, 32], [100, 40, 10])["b_crit"])
    assert math.isnan(critical_batch([8, 16, 32], [30, 31, 32])["b_crit"])


# The page's functions, on the reference study's runs copied as a user's results folder, checked against the runs'
# CSVs by an independent computation.


@pytest.fixture
def study(tmp_path):
    shutil.copytree(
        REPO / "reference" / "time_to_accuracy", tmp_path / "time_to_accuracy", ignore=shutil.ignore_patterns("*.ipynb")
    )
    return tmp_path / "time_to_accuracy"


def run_dirs(study):
    return sorted(p.parent for p in study.glob("*/*/run.json"))


def test_each_run_s_steps_to_target_are_read_from_its_evaluations_and_b_simple_from_its_epochs(study):
    table = cb.runs_table(load_study(study)).set_index(["variant", "seed"])
    assert len(table) == len(run_dirs(study))
    for run_dir in run_dirs(study):
        info = json.loads((run_dir / "run.json").read_text())
        evals = pd.read_csv(run_dir / "evals.csv")
        reached = evals[evals["val_accuracy"] >= info["config"]["target_accuracy"]]
        row = table.loc[(run_dir.parent.name, info["config"]["seed"])]
        if reached.empty:  # a run that missed the target: no steps, never its last one
            assert math.isnan(row["steps"]) and math.isnan(row["samples"])
        else:
            assert row["steps"] == reached["step"].iloc[0]
            assert row["samples"] == reached["step"].iloc[0] * info["global_batch_size"]
        metrics = pd.read_csv(run_dir / "metrics.csv")
        trace = sum(metrics["grad_noise_trace"] * metrics["steps"])
        signal = sum(metrics["grad_sq_norm"] * metrics["steps"])
        assert row["b_simple"] == pytest.approx(trace / signal, rel=1e-9)


def test_a_run_that_missed_the_target_is_shown_as_missing_it_and_left_out_of_the_fit(study):
    before = critical_batch_study(load_study(study))
    missed = next(p for p in run_dirs(study) if p.parent.name == f"b{before.smallest}")
    evals = pd.read_csv(missed / "evals.csv")
    evals.assign(val_accuracy=0.3).to_csv(missed / "evals.csv", index=False)
    variants = load_study(study)
    after = critical_batch_study(variants)
    assert after.unreached == before.unreached + 1
    smallest = cb.per_batch(cb.runs_table(variants)).iloc[0]
    assert smallest["reached"] == smallest["runs"] - 1
    table = cb.runs_table(variants)
    rule = table[cb.follows_rule(table)].dropna(subset=["steps"])
    slope, intercept = np.polyfit(1 / rule["batch"], rule["steps"], 1, w=1 / rule["steps"])
    assert after.b_crit == pytest.approx(slope / intercept)


def test_the_rule_s_neighbours_are_the_runs_off_the_square_root_rule_and_a_better_neighbour_fails_the_rule(study):
    variants = load_study(study)
    table = cb.runs_table(variants)
    off = table[~cb.follows_rule(table)]
    assert set(off["variant"]) == {"b512_half_lr", "b512_double_lr"}
    # a neighbour that reaches the target at its first evaluation in every repeat beats the rule's rate
    for run_dir in (study / "b512_double_lr").iterdir():
        if (run_dir / "evals.csv").exists():
            pd.read_csv(run_dir / "evals.csv").assign(val_accuracy=0.9).to_csv(run_dir / "evals.csv", index=False)
    neighbours = tta.lr_neighbours(load_study(study)).set_index("times_rule")
    assert neighbours.loc[2.0, "outcome"] == "more steps"  # the rule's rate takes more steps than its double
    assert tta.rule_outcome(neighbours) == "did not hold"


def test_the_projected_time_to_target_is_the_fitted_steps_times_the_measured_step(study):
    variants = load_study(study)
    table = cb.runs_table(variants)
    fit = critical_batch(table.loc[cb.follows_rule(table), "batch"], table.loc[cb.follows_rule(table), "steps"])
    projection = tta.time_to_target(table).set_index(["per_rank_batch", "ranks"])
    b128 = [p for p in run_dirs(study) if p.parent.name == "b128"]
    per_rank = json.loads((b128[0] / "run.json").read_text())["per_rank_batch_size"]
    # a run's compute: the median of its steps less their exposed all-reduce, after the first five steps; its
    # all-reduce: the median exposed one; the batch's: the medians over its repeats
    steps = [pd.read_csv(p / "steps.csv").iloc[5:] for p in b128]
    compute = np.median([(s["step_time_s"] - s["comm_exposed_s"]).median() for s in steps])
    exposed = np.median([s["comm_exposed_s"].median() for s in steps])
    for ranks, ring in ((1, 0.0), (2, 1.0), (8, 2 * 7 / 8)):  # bytes per rank of a ring: 2(N-1)/N, 1 on 2 ranks
        assert projection.loc[(per_rank, ranks), "seconds"] == pytest.approx(
            (fit["s_min"] + fit["e_min"] / (ranks * per_rank)) * (compute + exposed * ring)
        )
    # the projection is solid only where N·b lies among the global batches measured
    measured = projection.reset_index().set_index("batch")["measured"]
    assert measured[measured].index.min() >= 8 and not measured.loc[4].any()


def test_the_critical_batch_s_interval_comes_from_resampled_seeds_and_holds_the_fit(study):
    table = cb.runs_table(load_study(study))
    rule = table[cb.follows_rule(table)]
    fit = critical_batch(rule["batch"], rule["steps"])
    interval = cb.critical_batch_interval(rule, draws=300)
    assert interval.b_crit.low <= fit["b_crit"] <= interval.b_crit.high
    # one seed a batch leaves nothing to resample: the interval is the fit itself
    single = cb.critical_batch_interval(rule.groupby("batch").head(1), draws=50)
    alone = critical_batch(*rule.groupby("batch").head(1)[["batch", "steps"]].T.to_numpy())
    assert single.b_crit.low == pytest.approx(alone["b_crit"]) == single.b_crit.high


def test_the_fit_is_least_squares_in_relative_error():
    """The spread of steps over seeds grows with the steps: the fit minimises the squared relative misses, so no
    nearby (S_min, E_min) misses the runs by less."""
    batches = np.array([8, 8, 32, 32, 128, 512, 512])
    steps = np.array([352.0, 288.0, 80.0, 96.0, 28.0, 13.0, 14.0])
    fit = critical_batch(batches, steps)
    misses = lambda s_min, e_min: (((s_min + e_min / batches) - steps) / steps) ** 2  # noqa: E731
    best = misses(fit["s_min"], fit["e_min"]).sum()
    for ds, de in ((0.1, 0), (-0.1, 0), (0, 10), (0, -10)):
        assert misses(fit["s_min"] + ds, fit["e_min"] + de).sum() > best
