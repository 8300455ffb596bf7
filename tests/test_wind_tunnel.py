"""The wind tunnel: each modelled variant's links are set on this host so that its compute-to-communication ratio is
the real configuration's; a target the host cannot reach is refused in one line, leaving nothing behind."""

import json
import os
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import REPO, TINY_STUDIES, ddp_variants
from ddp_core.engine.model_cost import bucket_sizes
from ddp_core.engine.model_shape import ModelConfig
from ddp_core.engine.wind_tunnel_file import LinkModel
from ddp_core.launch.emulated import leftovers
from ddp_core.analysis.nvlink_forecast import forecast, nvlink_fit
from ddp_core.analysis.similarity import CONFIGURATIONS, ETHERNET_FILE, H200_MEASUREMENT, large_model
from ddp_core.studies.run import main as runner_main
from ddp_core.studies.study_list import StudyError, parse_study
from ddp_core.studies.wind_tunnel import FASTEST_RATE, link_rate_for, ring_bits

BUCKETS = [1_000_000, 10_000_000]
WORKLOAD = vars(ModelConfig.from_preset("small", vocab_size=20000, max_len=128, num_classes=2))  # the nodes study's


def test_a_ring_sends_twice_the_gradient_less_one_nth_of_it_from_each_node():
    assert ring_bits(BUCKETS, 2) == 11_000_000 * 8
    assert ring_bits(BUCKETS, 4) == 2 * 3 / 4 * 11_000_000 * 8


def test_the_link_rate_leaves_the_all_reduce_the_time_the_target_ratio_gives_it():
    bits = ring_bits(BUCKETS, 4)  # 132 Mbit
    rate = link_rate_for(target_ratio=2.0, rank_compute_s=0.5, fixed_s=0.05, wire_bits=bits)
    assert rate == pytest.approx(132e6 / (0.25 - 0.05))  # T* = 0.5 / 2 s, of which 0.05 s no rate changes
    assert 0.5 / (0.05 + bits / rate) == pytest.approx(2.0)  # at that rate, the target R


@pytest.mark.parametrize(
    "fixed_s, bits, fragment",
    [
        (0.3, 132e6, "needs the all-reduce of a step in 250 ms, but on this host it takes 300 ms over any link"),
        (0.2499, 132e6, "outside the 1 Mbit/s to 5 Gbit/s"),
    ],
)
def test_a_target_out_of_reach_is_refused_in_one_line(fixed_s, bits, fragment):
    with pytest.raises(StudyError) as refused:
        link_rate_for(target_ratio=2.0, rank_compute_s=0.5, fixed_s=fixed_s, wire_bits=bits)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)
    assert link_rate_for(
        target_ratio=2.0, rank_compute_s=0.5, fixed_s=0.25 - bits / FASTEST_RATE, wire_bits=bits
    ) == pytest.approx(FASTEST_RATE)  # the fastest settable link: not refused


def test_the_a100_configuration_is_the_prediction_chapters_forecast_at_40_percent_of_the_peak():
    for n in (2, 4):
        ahead = forecast(WORKLOAD, 32, n).loc["large"]
        expected = ahead["compute_bound_ms"] / 0.4 / n / ahead["comm_ms"]
        assert CONFIGURATIONS["a100_nvlink"].ratio(WORKLOAD, 32, n) == pytest.approx(expected)


def test_the_ethernet_configuration_sends_the_large_models_buckets_at_the_published_bus_bandwidth():
    busbw = pd.read_csv(ETHERNET_FILE, comment="#")["busbw_gbit_s"].median() * 1e9 / 8
    gradient = sum(bucket_sizes(large_model(WORKLOAD)))
    step = forecast(WORKLOAD, 256, 4).loc["large", "compute_bound_ms"] / 1e3 / 0.4  # its own batch: 256
    assert CONFIGURATIONS["a100_ethernet"].ratio(WORKLOAD, 32, 4) == pytest.approx(
        (step / 4) / (2 * 3 / 4 * gradient / busbw)
    )


def test_the_h200_configuration_divides_the_measured_step_of_the_whole_batch():
    epochs = pd.read_csv(H200_MEASUREMENT / "epochs.csv").query(
        "preset == 'large' and amp == 'bf16' and batch_size == 128 and loop == 'ddp_core'"
    )
    step = epochs["seconds"].sum() / epochs["samples"].sum() * 128
    fit = nvlink_fit(4)
    allreduce = sum(fit.allreduce_s(size) for size in bucket_sizes(large_model(WORKLOAD)))
    assert CONFIGURATIONS["h200_nvlink"].ratio(WORKLOAD, 32, 4) == pytest.approx(step / 4 / allreduce)


def test_the_h200s_own_forecast_steps_a_quarter_batch_as_measured_then_waits_for_the_all_reduce():
    """What the pages set beside an emulated result that borrows the H200s' ratio: four real H200s, each stepping 32
    sequences as measured inside DDP, then waiting for every bucket (lowest) or for the last one only (highest)."""
    epochs = pd.read_csv(H200_MEASUREMENT / "epochs.csv").query("preset == 'large' and amp == 'bf16'")

    def step(batch, loop):
        rows = epochs.query("batch_size == @batch and loop == @loop")
        return rows["seconds"].sum() / rows["samples"].sum() * batch

    fit = nvlink_fit(4)
    buckets = [fit.allreduce_s(size) for size in bucket_sizes(large_model(WORKLOAD))]
    whole, share = step(128, "ddp_core"), step(32, "ddp_of_one")
    low, high = CONFIGURATIONS["h200_nvlink"].speedup_range(WORKLOAD, 32, 4)
    assert (low, high) == pytest.approx((whole / (share + sum(buckets)), whole / (share + buckets[-1])))
    assert low < 1  # a quarter of the batch takes more than a quarter of the time: below the emulated nodes' 2.6


@pytest.mark.parametrize(
    "variants, fragment",
    [
        (
            {
                "one_node": {"world_sizes": [1]},
                "a": {"models": "a100_nvlink", "link_rate": "1gbit", "world_sizes": [2]},
            },
            "models sets the links' rate on this host; drop link_rate",
        ),
        (
            {"one_node": {"world_sizes": [1]}, "a": {"models": "tpu_pod", "world_sizes": [2]}},
            "models 'tpu_pod' is no configuration; they are: h200_nvlink, a100_nvlink, a100_ethernet",
        ),
        (
            {"a": {"models": "a100_nvlink", "world_sizes": [2]}, "one_node": {"world_sizes": [1]}},
            "needs a one-node variant (world_sizes [1]) of its cpus_per_node listed before it",
        ),
    ],
)
def test_a_modelled_variant_that_cannot_be_dimensioned_is_refused_when_the_list_is_read(variants, fragment):
    entry = {"title": "t", "profile": "tiny", "ranks_per_node": 1, "cpus_per_node": 0.5, "variants": variants}
    with pytest.raises(StudyError, match=re.escape(fragment)):
        parse_study("nodes", entry)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the wind tunnel calibrates on emulated nodes, which need root")
def test_a_target_this_host_cannot_reach_stops_the_study_before_the_variants_nodes_are_made(tmp_path, capsys):
    """The tiny model at 2 samples a step on a core of its own computes a step in about a millisecond: R = 9.4 of
    H200s would leave its all-reduce 2 nodes' half of that over 9.4, under the 88 us its gradient's 438 kbit take on
    the fastest link a node can be given."""
    tiny = yaml.safe_load(TINY_STUDIES.read_text())["nodes"]
    tiny |= {"cpus_per_node": 1.0, "settings": {"global_batch_size": 2, "train_samples": 32}}
    tiny["variants"] = {"one_node": {"world_sizes": [1]}, "h200s": {"models": "h200_nvlink", "world_sizes": [2]}}
    study_list = tmp_path / "studies.yml"
    study_list.write_text(yaml.safe_dump({"nodes": tiny}, sort_keys=False))
    code = runner_main(["--study-list", str(study_list), "--results-dir", str(tmp_path / "results"), "nodes"])
    error = capsys.readouterr().err.strip()
    assert code == 2
    assert error.startswith("ddp_core.studies.run: error: study 'nodes', variant 'h200s' at 2 nodes: R = 9.42 needs")
    assert "\n" not in error
    assert not (tmp_path / "results" / "nodes" / "h200s").exists()  # no benchmark, no run of the variant
    assert not (tmp_path / "results" / "nodes" / "wind_tunnel.json").exists()
    assert (tmp_path / "results" / "nodes" / "one_node" / "n1" / "run.json").exists()  # the compute it measured
    mine = f"{os.getpid():06x}"
    assert not [name for names in leftovers(owner_alive=lambda owner: True).values() for name in names if mine in name]


def test_a_one_node_run_out_of_line_with_the_others_or_disturbed_is_set_aside():
    """The runs of the issue that found one run setting every link: 1.155 s a step against 0.817 and 0.845."""
    from ddp_core.studies.wind_tunnel import set_aside

    runs = [{"compute_per_step_s": s, "disturbed": False} for s in (1.155, 0.817, 0.845)]
    assert set_aside(runs, tolerance=0.05) == ["out of line", None, None]
    assert set_aside(runs[1:] + [{"compute_per_step_s": 0.83, "disturbed": True}], 0.05) == [None, None, "disturbed"]
    assert set_aside(runs, tolerance=0.3) == [None, None, None]  # 37 % off: within twice a tolerance of 30 %
    busy = [runs[0], *({"compute_per_step_s": s, "disturbed": True} for s in (0.817, 0.845))]
    assert set_aside(busy, 0.05) == ["out of line", "disturbed", "disturbed"]  # not the median of itself alone


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0, reason="the wind tunnel's one-node runs train on emulated nodes, which need root"
)
def test_a_slow_one_node_run_is_set_aside_before_it_sets_the_links_and_another_trained(tmp_path):
    """One disturbed one-node run once set every link of the nodes study (its step 1.43 times its repeats'): the links
    are set by the median of several, and a run far out of line with the others is set aside and replaced."""
    from ddp_core.studies.wind_tunnel import CALIBRATION_RUNS, MAX_CALIBRATION_RUNS, calibration_compute

    tiny = yaml.safe_load(TINY_STUDIES.read_text())["nodes"]
    tiny["variants"] = {"one_node": {"world_sizes": [1]}, "a100s": {"models": "a100_ethernet", "world_sizes": [2]}}
    study, results = parse_study("nodes", tiny), str(tmp_path / "results")
    first = calibration_compute(study, 0.5, results)
    assert len(first.runs) >= CALIBRATION_RUNS
    planted = tmp_path / "results" / "nodes" / first.runs[0].run
    metrics = pd.read_csv(planted / "metrics.csv")
    for column in ("forward_time_s", "backward_time_s", "optimizer_time_s"):
        metrics[column] *= 4  # a run whose node computed at a quarter of its speed
    metrics.to_csv(planted / "metrics.csv", index=False)

    again = calibration_compute(study, 0.5, results)
    runs = again.runs
    assert runs[0].set_aside is not None  # the planted run: out of line (or disturbed, on a busy machine)
    counted = [run for run in runs if run.set_aside is None]
    assert len(counted) >= CALIBRATION_RUNS or len(runs) == MAX_CALIBRATION_RUNS  # others trained in its place
    others = [run.compute_per_step_s for run in runs[1:]]
    assert min(others) <= again.compute_per_step_s <= max(others)  # the links' compute is not the slow run's
    if again.quiet:
        assert again.compute_per_step_s == pytest.approx(np.median([run.compute_per_step_s for run in counted]))


def test_the_reference_nodes_study_shows_each_configurations_target_and_what_the_nodes_reached():
    from ddp_core.analysis.comparisons import WARMUP_STEPS
    from ddp_core.analysis.emulated import similarity_table
    from ddp_core.analysis.results import load_study

    folder = REPO / "reference" / "nodes"
    record = json.loads((folder / "wind_tunnel.json").read_text())
    table = similarity_table(load_study(folder)).set_index(["variant", "nodes"])

    def median_steps(variant, n):
        runs = sorted(folder.glob(f"{variant}/n{n}*"), key=lambda run: (len(run.name), run.name))  # n4, n4-r2, ...
        return [pd.read_csv(run / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median() for run in runs]

    ones = {
        variant: json.loads((folder / variant / "n1" / "network.json").read_text())["cpus_per_node"]
        for variant in ("one_node", "one_node_half_share")
    }
    ddp = ddp_variants(folder, record)
    assert list(ddp) == ["h200_nvlink", "a100_nvlink", "a100_ethernet", "a100_nvlink_half_share"]
    for variant, modelled in ddp.items():
        one = next(name for name, share in ones.items() if share == modelled["cpus_per_node"])
        for n, entry in modelled["by_nodes"].items():
            row = table.loc[(variant, int(n))]
            assert row["borrowed"] == modelled["configuration"] and row["share"] == modelled["cpus_per_node"]
            assert (row["target_ratio"], row["achieved_ratio"]) == (entry["target_ratio"], entry["achieved_ratio"])
            paired = [t1 / tn for t1, tn in zip(median_steps(one, 1), median_steps(variant, n))]  # same global batch
            assert row["efficiency"] == pytest.approx(pd.Series(paired).median() / int(n))


def test_each_forecast_was_written_before_the_run_it_forecast_and_its_error_is_against_their_median_step():
    """The key findings' forecast errors: the median of the rounds' forecast steps in wind_tunnel.json, against the
    median over the runs of each run's median step after the warm-up, read from steps.csv; each round's forecast
    written before that round's run started."""
    from ddp_core.analysis.comparisons import WARMUP_STEPS
    from ddp_core.analysis.emulated import FORECAST_BAR, forecasts
    from ddp_core.analysis.results import load_study

    folder = REPO / "reference" / "nodes"
    errors, rounds = {}, []
    for variant, modelled in ddp_variants(folder, json.loads((folder / "wind_tunnel.json").read_text())).items():
        for n, entry in modelled["by_nodes"].items():
            runs = sorted(folder.glob(f"{variant}/n{n}*"))  # n4, n4-r2, n4-r3: round by round
            medians = [pd.read_csv(run / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median() for run in runs]
            starts = [json.loads((run / "run.json").read_text())["start_time"] for run in runs]
            assert sorted(ahead["repeat"] for ahead in entry["forecasts"]) == list(range(1, len(runs) + 1))
            for ahead in entry["forecasts"]:
                assert ahead["at"] < starts[ahead["repeat"] - 1]
            forecast = pd.Series([ahead["step_s"] for ahead in entry["forecasts"]]).median()
            errors[(variant, modelled["configuration"], int(n))] = forecast / pd.Series(medians).median() - 1
            rounds += [ahead["step_s"] / medians[ahead["repeat"] - 1] - 1 for ahead in entry["forecasts"]]
    found = forecasts(load_study(folder))
    assert found.error_range == f"{min(errors.values()):+.0%} to {max(errors.values()):+.0%}"
    assert found.count == len(errors)
    assert found.within == sum(abs(error) <= FORECAST_BAR for error in errors.values())
    assert found.rounds == len(rounds)
    assert found.rounds_within == sum(abs(error) <= FORECAST_BAR for error in rounds)
    negative = sum(error < 0 for error in errors.values())
    assert found.errors in {f"{negative} of {len(errors)} negative", "all negative", "all positive"}


def test_each_rounds_forecast_is_held_against_its_own_rounds_run_not_the_median(tmp_path):
    """The reference's forecasts replaced by 8 % under each round's own run: every round within the bar, though
    some runs lie far enough from their configuration's median that 8 % under them is more than 10 % under it."""
    from ddp_core.analysis.comparisons import WARMUP_STEPS
    from ddp_core.analysis.emulated import FORECAST_BAR, forecasts
    from ddp_core.analysis.results import load_study

    folder = tmp_path / "nodes"
    shutil.copytree(REPO / "reference" / "nodes", folder)
    record = json.loads((folder / "wind_tunnel.json").read_text())
    off_the_median = []
    for variant, modelled in ddp_variants(folder, record).items():
        for n, entry in modelled["by_nodes"].items():
            runs = sorted(folder.glob(f"{variant}/n{n}*"))
            medians = [pd.read_csv(run / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median() for run in runs]
            for ahead in entry["forecasts"]:
                ahead["step_s"] = 0.92 * medians[ahead["repeat"] - 1]
                off_the_median.append(ahead["step_s"] / pd.Series(medians).median() - 1 < -FORECAST_BAR)
    (folder / "wind_tunnel.json").write_text(json.dumps(record))
    assert any(off_the_median)
    found = forecasts(load_study(folder))
    assert found.rounds_within == found.rounds == len(off_the_median)


def test_the_signs_of_errors_are_counted_in_outcome_words():
    from ddp_core.analysis.emulated import signs

    assert signs(pd.Series([-0.08, -0.01, 0.02])) == "2 of 3 negative"
    assert signs(pd.Series([-0.08, -0.01])) == "all negative" and signs(pd.Series([0.1])) == "all positive"
    assert signs(pd.Series([0.1, 0.0])) == "0 of 2 negative"


def test_the_replay_runs_each_buckets_all_reduce_when_it_is_ready_and_the_one_before_is_done():
    """A one-node step of 10 ms data, 100 ms forward, 400 ms backward whose three buckets are ready 100, 200 and
    400 ms into it, 10 ms before the optimizer and 50 ms of optimizer; on 2 nodes each all-reduce takes 60, 150 and
    30 ms."""
    from ddp_core.analysis.replay import one_node_step_s, replay_step

    timeline = pd.DataFrame(
        [
            ("data", 0.0, 0.01),
            ("forward", 0.01, 0.11),
            ("backward", 0.11, 0.51),
            ("gradients ready, bucket 1", 0.21, 0.21),
            ("gradients ready, bucket 2", 0.31, 0.31),
            ("gradients ready, bucket 3", 0.51, 0.51),
            ("optimizer", 0.52, 0.57),
        ],
        columns=["what", "start_s", "end_s"],
    )
    step = replay_step(timeline, nodes=2, allreduce_s=[0.06, 0.15, 0.03])
    # within a backward of 200 ms: bucket 1 ready at 50, reduced 50-110; bucket 2 ready at 100, waits, 110-260;
    # bucket 3 ready at 200, waits, 260-290: 90 ms after backward ends
    assert step["exposed_s"] == pytest.approx(0.09)
    assert step["compute_s"] == pytest.approx(0.05 + 0.2 + 0.06)  # forward and backward halved, what follows not
    assert step["step_s"] == pytest.approx(0.01 + 0.05 + 0.2 + 0.09 + 0.06)
    assert one_node_step_s(timeline) == pytest.approx(0.57)
    same = replay_step(timeline, nodes=1, allreduce_s=[0.0, 0.0, 0.0])  # a timeline at each rank's batch, no link
    assert same["step_s"] == pytest.approx(one_node_step_s(timeline)) and same["exposed_s"] == 0
    quick = replay_step(timeline, nodes=2, allreduce_s=[0.01, 0.01, 0.01])  # each done before the next is ready
    assert quick["exposed_s"] == pytest.approx(0.01)  # only the last bucket, ready as backward ends


def test_the_link_model_is_fitted_through_every_point_and_never_sends_fewer_bits_than_the_ring():
    from ddp_core.studies.wind_tunnel import fit_link

    exact = [(rate, 0.05 + 1.32e8 / rate) for rate in (2e8, 1e9, 1.5e9)]
    assert fit_link(exact, wire_bits=1e8) == pytest.approx((0.05, 1.32e8))
    noisy = [(2e8, 0.70), (1e9, 0.19), (1.5e9, 0.13), (1.5e9, 0.15)]  # two tries at one rate: their mean counts
    fixed, bits = fit_link(noisy, wire_bits=1e8)
    assert bits / 2e8 + fixed == pytest.approx(0.70, rel=0.05) and bits / 1.5e9 + fixed == pytest.approx(0.14, rel=0.1)
    backwards = [(2e8, 0.9), (1e9, 1.0)]  # the slower link looked faster: B is the ring's bits, A what is left
    assert fit_link(backwards, wire_bits=1e8) == pytest.approx(((0.9 - 0.5 + 1.0 - 0.1) / 2, 1e8))


# Links far below the calibration rates, where a bit costs about half what the calibration's line says (the tiny
# study's half-share nodes at 18 Mbit/s), and links where the fixed part is off instead; each also with a benchmark
# that errs by 4 % one way and the other, try after try.
@pytest.mark.parametrize("noise", [0.0, 0.04], ids=["exact", "noisy"])
@pytest.mark.parametrize("true_fixed_s, true_bits", [(0.0018, 0.55 * 8e5), (0.006, 8e5)], ids=["bits", "fixed"])
def test_the_rate_search_reaches_the_target_within_a_few_tries_where_the_calibration_line_misses(
    tmp_path, monkeypatch, true_fixed_s, true_bits, noise
):
    from ddp_core.launch.plan import rate_bits_per_s
    from ddp_core.studies import wind_tunnel

    errors = iter([noise, -noise] * wind_tunnel.MAX_TRIES)

    def links(study, n, rate, cpus, buckets, out):  # the all-reduce as links of the true A and B take it
        return [(true_fixed_s + true_bits / rate_bits_per_s(rate)) * (1 + next(errors))]

    monkeypatch.setattr(wind_tunnel, "benchmark_buckets", links)
    monkeypatch.setattr(wind_tunnel, "accept_benchmark", lambda benchmark, accepted: None)
    rank_compute_s, target = 0.0063, 0.23  # the all-reduce must take 27 ms
    study = SimpleNamespace(name="nodes", ratio_tolerance=0.05)
    links = wind_tunnel.NodeLinks(LinkModel([], fixed_s=0.0018, bits=8e5), [54792], 0.25)
    found = wind_tunnel.dimension(study, "a100_ethernet", 2, target, rank_compute_s, links, tmp_path)
    assert found.achieved_ratio == pytest.approx(target, rel=study.ratio_tolerance)
    assert len(found.tries) <= 3
