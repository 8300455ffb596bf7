"""The forecast page: what a reader picks is looked up in forecasts the book's build computed with the same model the
other chapters quote (the built page in a browser: tests/test_report.py)."""

from __future__ import annotations

import itertools

import pytest

from conftest import REPO
from ddp_core.analysis.cluster_forecast import CHOICES, INTERCONNECTS, Cluster, cluster_forecast, forecast_grid
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
        found = cluster_forecast(Cluster("large", WORKLOAD["max_len"], batch // gpus, 0.4, interconnect, gpus),
                                 WORKLOAD)
        low, high = CONFIGURATIONS[name].speedup_range(WORKLOAD, batch, gpus)
        assert (found["speedup_no_overlap"], found["speedup_last_bucket"]) == pytest.approx((low, high), rel=1e-12)


def test_every_choice_is_forecast_between_no_overlap_and_the_last_bucket_only_and_flagged_past_the_publication():
    grid = forecast_grid(WORKLOAD)
    assert len(grid) == len(list(itertools.product(*CHOICES.values())))
    for row in grid:
        assert row["speedup_no_overlap"] * (1 - 1e-9) <= row["speedup"] <= row["speedup_last_bucket"] * (1 + 1e-9)
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["gpus"])
        assert row["outcome"] == ("faster" if row["speedup"] > 1 else "slower")
        assert row["validated"] == (row["gpus"] <= INTERCONNECTS[row["interconnect"]][1])
        assert row["buckets_ms"][-1][1] == pytest.approx(row["backward_ms"][1] + row["exposed_ms"])


def test_a_faster_interconnect_or_more_work_per_gpu_never_forecasts_a_lower_speedup():
    def speedup(**choice):
        return cluster_forecast(Cluster(**forecast.DEFAULT | choice), WORKLOAD)["speedup"]

    for gpus in CHOICES["gpus"]:
        assert speedup(gpus=gpus, interconnect="nvlink") > speedup(gpus=gpus, interconnect="ethernet")
        batches = [speedup(gpus=gpus, batch_per_gpu=batch) for batch in CHOICES["batch_per_gpu"]]
        assert batches == sorted(batches)
