"""The one yardstick: two sides' repeats, paired by the time they ran, give a ratio, its range and a verdict."""

import math

import pytest

from ddp_core.report.verdict import MIN_REPEATS, compare, noise_floor


def test_a_ratio_every_pair_agrees_on_and_beyond_the_floor_gets_a_direction():
    faster = compare([80, 90, 85], [100, 100, 100], floor=0.05)
    assert (faster.ratio, faster.low, faster.high, faster.pairs) == (0.85, 0.8, 0.9, 3)
    assert faster.verdict == "lower" and faster.says("faster", "slower") == "faster"
    slower = compare([120, 110, 130], [100, 100, 100], floor=0.05)
    assert slower.verdict == "higher" and slower.says("faster", "slower") == "slower"


def test_pairs_that_disagree_or_a_ratio_inside_the_floor_are_no_visible_difference():
    assert compare([80, 90, 105], [100, 100, 100], floor=0.05).verdict == "no visible difference"
    assert compare([97, 98, 96], [100, 100, 100], floor=0.05).verdict == "no visible difference"
    assert compare([97, 98, 96], [100, 100, 100], floor=0.01).verdict == "lower"


def test_the_ratio_pairs_repeat_k_with_repeat_k_not_means():
    # the second round ran on a slow machine: both sides twice as slow, their ratio unchanged
    paired = compare([80, 160, 80], [100, 200, 100], floor=0.05)
    assert paired.ratio == pytest.approx(0.8) and paired.high == pytest.approx(0.8) and paired.verdict == "lower"


def test_fewer_repeats_than_the_minimum_give_no_verdict():
    few = compare([50] * (MIN_REPEATS - 1), [100] * (MIN_REPEATS - 1), floor=0.0)
    assert few.verdict == "too few repeats" and few.ratio == 0.5


def test_sides_with_unequal_repeats_are_refused():
    with pytest.raises(ValueError, match="3 repeats against 2"):
        compare([1, 2, 3], [1, 2], floor=0.05)


def test_the_noise_floor_is_the_typical_spread_of_repeats_of_one_configuration():
    assert noise_floor([[90, 100, 110], [100, 104, 102], [50, 60, 70]]) == pytest.approx(0.2)
    assert noise_floor([[100, 110], [7]]) == pytest.approx(10 / 105)
    assert math.isnan(noise_floor([[100], [7]]))


def test_a_quantity_a_configuration_does_not_have_leaves_the_noise_floor_alone():
    """One rank has no all-reduce: its zeros (or NaN ratios) are no spread of repeats."""
    assert noise_floor([[0.0, 0.0, 0.0], [90, 100, 110]]) == pytest.approx(0.2)
    assert noise_floor([[math.nan] * 3, [90, 100, 110]]) == pytest.approx(0.2)
