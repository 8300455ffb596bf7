"""The chapter Over a network reads right for every outcome, and takes speedups against the one-node runs."""

import pytest


@pytest.mark.parametrize(
    "loss, classes, says",
    [
        (0.690, 2, "has barely learned"),
        (0.40, 2, "has learned"),
        (0.710, 2, "has not learned"),
        (1.34, 4, "has barely learned"),
        (1.0, 4, "has learned"),
    ],
)
def test_compression_accuracy_is_read_against_a_model_that_learned_nothing(loss, classes, says):
    from ddp_core.report.compression import learned

    assert learned(loss, classes) == says


def test_the_nodes_page_names_the_prediction_that_missed_most_and_counts_those_inside_the_repeats():
    from conftest import REPO
    from ddp_core.analysis.emulated import link_table
    from ddp_core.report.nodes import findings
    from ddp_core.analysis.results import load_study

    study = load_study(REPO / "reference" / "nodes")
    table, found = link_table(study), findings(study, REPO / "reference" / "cpu_period")
    worst = table.loc[table["prediction_error"].abs().idxmax()]
    assert (found.worst_prediction.error, found.worst_prediction.nodes, found.worst_prediction.link) == (
        worst["prediction_error"],
        worst["world_size"],
        worst["point"],
    )
    inside = (table["speedup_low"] <= table["predicted_speedup"]) & (
        table["predicted_speedup"] <= table["speedup_high"]
    )
    assert (found.predictions_inside, found.predictions) == (inside.sum(), len(table))
