"""Steps to a target accuracy, and the critical batch size fitted to them."""

import math

import pandas as pd
import pytest

from ddp_core.report.time_to_accuracy import critical_batch, steps_to_target


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
