"""The one yardstick: two sides' repeats, paired by the time they ran, give a ratio, its range and a verdict."""

import math
import random
import statistics

import pytest

from ddp_core.analysis.verdict import MIN_REPEATS, Z, compare, degrees_of_freedom, error_rates, noise_floor


def test_a_ratio_every_pair_agrees_on_and_beyond_the_floor_gets_a_direction():
    faster = compare([80, 90, 85], [100, 100, 100], floor=0.05)
    assert (faster.ratio, faster.low, faster.high, faster.pairs) == (0.85, 0.8, 0.9, 3)
    assert faster.verdict == "lower" and faster.says("faster", "slower") == "faster"
    slower = compare([120, 110, 130], [100, 100, 100], floor=0.05)
    assert slower.verdict == "higher" and slower.says("faster", "slower") == "slower"


def test_pairs_that_disagree_or_a_ratio_inside_the_floor_are_no_visible_difference():
    """Each condition of each side on its own: a median beyond the floor with one pair on the other side of 1, and
    every pair on one side with the median inside the floor."""
    assert compare([80, 90, 105], [100, 100, 100], floor=0.05).verdict == "no visible difference"
    assert compare([97, 98, 96], [100, 100, 100], floor=0.05).verdict == "no visible difference"
    assert compare([97, 98, 96], [100, 100, 100], floor=0.01).verdict == "lower"
    assert compare([120, 110, 95], [100, 100, 100], floor=0.05).verdict == "no visible difference"
    assert compare([103, 102, 104], [100, 100, 100], floor=0.05).verdict == "no visible difference"
    assert compare([103, 102, 104], [100, 100, 100], floor=0.01).verdict == "higher"


@pytest.mark.parametrize("a, floor", [([80, 84, 78], 0.2), ([70, 90, 75], 0.3), ([120, 130, 125], 0.25)])
def test_one_side_against_the_other_gets_the_mirrored_verdict_of_the_other_against_the_one(a, floor):
    """A speedup is the inverse of a ratio of times: a floor held in log-ratio calls both the same way (1/1.25 =
    0.8 lies as far below 1 as 1.25 above it)."""
    b = [100, 100, 100]
    mirrored = {"lower": "higher", "higher": "lower", "no visible difference": "no visible difference"}
    assert compare(b, a, floor).verdict == mirrored[compare(a, b, floor).verdict]
    assert compare([80, 80, 80], b, floor=0.25).verdict == "no visible difference"  # 0.8 = 1/1.25: not beyond it
    assert compare([79, 79, 79], b, floor=0.25).verdict == "lower"


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


def test_a_round_that_slows_every_configuration_leaves_the_noise_floor_at_zero():
    # round 2 ran while the machine was twice as slow: pairing cancels it, so it is no noise
    assert noise_floor([[1.0, 2.0, 1.0], [3.0, 6.0, 3.0], [5.0, 10.0, 5.0]]) == pytest.approx(0.0, abs=1e-12)


def test_with_two_configurations_the_floor_is_z_standard_deviations_of_their_pairs_log_ratios():
    a, b = [100.0, 130.0, 90.0, 120.0], [110.0, 125.0, 100.0, 115.0]
    log_ratios = [math.log(x / y) for x, y in zip(a, b)]
    assert noise_floor([a, b]) == pytest.approx(math.exp(Z * statistics.stdev(log_ratios)) - 1)


def test_the_floor_pools_the_noise_of_every_configuration_round_by_round():
    """Three configurations, a round effect and noise: the residual of a configuration + round fit, by hand."""
    table = [[10.0, 12.0, 11.0], [20.0, 26.0, 21.0], [40.0, 47.0, 45.0]]
    logs = [[math.log(v) for v in row] for row in table]
    grand = sum(map(sum, logs)) / 9
    rows = [sum(row) / 3 for row in logs]
    cols = [sum(row[j] for row in logs) / 3 for j in range(3)]
    residual_ss = sum((logs[i][j] - rows[i] - cols[j] + grand) ** 2 for i in range(3) for j in range(3))
    s = math.sqrt(residual_ss / 4)  # (3 - 1) * (3 - 1) degrees of freedom
    assert noise_floor(table) == pytest.approx(math.exp(Z * math.sqrt(2) * s) - 1)


def test_no_floor_without_two_configurations_and_two_rounds():
    assert math.isnan(noise_floor([[100, 110, 120]]))
    assert math.isnan(noise_floor([[100], [7]]))


def test_a_quantity_a_configuration_does_not_have_leaves_the_noise_floor_alone():
    """One rank has no all-reduce: its zeros (or NaN ratios) are no noise of repeats."""
    runs = [[90.0, 100.0, 110.0], [100.0, 104.0, 102.0]]
    assert noise_floor([[0.0, 0.0, 0.0], *runs]) == pytest.approx(noise_floor(runs))
    assert noise_floor([[math.nan] * 3, *runs]) == pytest.approx(noise_floor(runs))


def test_the_rule_rarely_calls_identical_configurations_different_and_finds_a_large_planted_effect():
    rng = random.Random(1)
    runs = [[100 * (1 + 0.5 * k) * rng.lognormvariate(0, 0.03) for k in range(3)] for _ in range(4)]
    rates = error_rates(runs, [0.0, 0.05, 0.5], draws=1000)
    assert rates[0.0] < 0.05  # identical configurations: a direction in fewer than 1 comparison in 20
    assert rates[0.05] < rates[0.5]
    assert rates[0.5] > 0.9  # 1.5 times as long, against a noise of about 3 %: found nearly always


def test_a_ratio_of_two_speedups_needs_the_floor_of_four_runs_to_be_called_different_as_rarely_as_two_times():
    """A ratio of two speedups holds four runs' noise, a ratio of two times two: against the floor of a pair it is
    called different when nothing differs several times as often; against the floor of four runs, about as rarely
    as two times are (`error_rates` measures the comparison it is told to plant)."""
    from ddp_core.analysis.comparisons import SPEEDUP_RUNS, slower_speedup

    rng = random.Random(1)
    runs = [[100 * (1 + 0.5 * k) * rng.lognormvariate(0, 0.03) for k in range(3)] for _ in range(6)]
    times = error_rates(runs, [0.0], draws=2000)[0.0]
    pair_floor = error_rates(runs, [0.0], draws=2000, planted=slower_speedup)[0.0]
    four_runs_floor = error_rates(runs, [0.0], draws=2000, planted=slower_speedup, runs=SPEEDUP_RUNS)[0.0]
    assert pair_floor > 2 * times
    assert four_runs_floor < 1.5 * times
    assert noise_floor(runs, runs=4) == pytest.approx((1 + noise_floor(runs)) ** math.sqrt(2) - 1)


def test_a_floor_rests_on_configurations_less_one_times_rounds_less_one():
    assert degrees_of_freedom([[1.0, 1.1, 0.9], [1.2, 1.3, 1.1]]) == 2
    assert degrees_of_freedom([[1.0, 1.1, 0.9, 1.0], [1.2, 1.3, 1.1, 1.2], [2.0, 2.1, 1.9, 2.2]]) == 6
    assert degrees_of_freedom([[1.0, 1.1, 0.9], [1.2, 1.3]]) == 1  # the rounds every configuration ran
    assert degrees_of_freedom([[1.0, 1.1, 0.9]]) == 0 and math.isnan(noise_floor([[1.0, 1.1, 0.9]]))
