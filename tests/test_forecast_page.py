"""The forecast page: what a reader picks is looked up in forecasts the book's build computed with the same model the
other chapters quote (the built page in a browser: tests/test_report.py)."""

from __future__ import annotations

import itertools

import pytest

from conftest import REPO
from ddp_core.analysis.cluster_forecast import (
    CHOICES,
    INTERCONNECTS,
    Cluster,
    cluster_forecast,
    forecast_grid,
    proportional_check,
)
from ddp_core.analysis.gpu_measurements import forecast_word
from ddp_core.analysis.nvlink_forecast import FORECAST_GPUS, load_timelines, replay_forecast
from ddp_core.analysis.similarity import CONFIGURATIONS
from ddp_core.report import forecast

WORKLOAD = forecast.workload(REPO / "reference")


@pytest.mark.parametrize("interconnect", list(INTERCONNECTS))
def test_the_pages_bounds_are_the_forecasts_the_book_quotes_for_the_clusters_it_models(interconnect):
    """The nodes chapter and the first page quote each modelled cluster's speedup range at its own global batch
    (`Configuration.speedup_range`); the page, at that cluster's choices, gives the same two numbers."""
    name = INTERCONNECTS[interconnect][0]
    batch = CONFIGURATIONS[name].batch(32)  # the clusters that take the study's batch: the reference's 32
    for gpus in (2, 4):
        found = cluster_forecast(
            Cluster("large", WORKLOAD["max_len"], batch // gpus, 0.4, interconnect, gpus), WORKLOAD
        )
        low, high = CONFIGURATIONS[name].speedup_range(WORKLOAD, batch, gpus)
        assert (found["speedup_no_overlap"], found["speedup_last_bucket"]) == pytest.approx((low, high), rel=1e-12)


def test_every_choice_is_forecast_between_no_overlap_and_the_last_bucket_only_and_flagged_past_the_publication():
    grid = forecast_grid(WORKLOAD)
    assert len(grid) == len(list(itertools.product(*CHOICES.values())))
    for row in grid:
        assert row["speedup_no_overlap"] * (1 - 1e-9) <= row["speedup"] <= row["speedup_last_bucket"] * (1 + 1e-9)
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["gpus"])
        assert row["outcome"] == forecast_word(row["speedup_no_overlap"], row["speedup_last_bucket"])
        assert row["validated"] == (row["gpus"] <= INTERCONNECTS[row["interconnect"]][1])
        assert row["buckets_ms"][-1][1] == pytest.approx(row["backward_ms"][1] + row["exposed_ms"])


def test_a_faster_interconnect_or_more_work_per_gpu_never_forecasts_a_lower_speedup():
    def speedup(**choice):
        return cluster_forecast(Cluster(**forecast.DEFAULT | choice), WORKLOAD)["speedup"]

    for gpus in CHOICES["gpus"]:
        assert speedup(gpus=gpus, interconnect="nvlink") > speedup(gpus=gpus, interconnect="ethernet")
        batches = [speedup(gpus=gpus, batch_per_gpu=batch) for batch in CHOICES["batch_per_gpu"]]
        assert batches == sorted(batches)


def test_the_check_on_a_measured_gpu_pairs_each_share_with_its_own_whole_batch():
    """The page's caveat: for each batch per GPU whose four-times batch one GPU also stepped, the speedup forecast from
    the measured share (the GPU chapter's) beside the one from the whole batch divided (this page's assumption), which
    can at most reach the ideal."""
    timelines = load_timelines(REPO / "reference" / "gpu_timeline")
    measured = {t.key for t in timelines}
    check = proportional_check(timelines)
    assert {(row.amp, row.batch_per_gpu) for row in check.itertuples()} == {
        (amp, batch) for amp, batch in measured if (amp, batch * FORECAST_GPUS) in measured
    }
    forecast_by_key = replay_forecast(timelines).set_index(["amp", "batch_per_gpu"])["speedup"]
    for row in check.itertuples():
        assert row.measured_share == forecast_by_key[(row.amp, row.batch_per_gpu)]
        assert 1 < row.divided_share <= FORECAST_GPUS
