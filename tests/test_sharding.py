"""Sharding the training state (--sharding: ZeRO-1, 2 and 3): the same training as DDP, a rank holding less of it."""

import json

import pytest
import torch

from conftest import TINY_SYNTHETIC, final_parameters, read_metrics

MODES = ("zero1", "zero2", "zero3")
# Two ranks, four micro-batches of 8 over two steps of two micro-batches each (accumulation on), no dropout: every
# mode takes the same optimizer steps on the same samples.
RUN = [
    *TINY_SYNTHETIC,
    "--dropout",
    "0",
    "--train-samples",
    "64",
    "--eval-samples",
    "21",
    "--global-batch-size",
    "32",
    "--grad-accum",
    "2",
    "--epochs",
    "2",
    "--lr",
    "0.01",
]


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory, isolated_env):
    """The same two-rank run in DDP and under each sharding mode."""
    from conftest import run_training

    home = tmp_path_factory.mktemp("sharding")
    for mode in ("none", *MODES):
        run_training(
            [*RUN, "--sharding", mode, "--count-collectives", "--out", home / mode], cwd=home, env=isolated_env, nproc=2
        )
    return home


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_trains_the_weights_ddp_trains(sharded_runs, mode):
    """After four optimizer steps with accumulation, the weights agree with DDP's to 1e-6 (the gradients are averaged
    over the ranks, not summed, and every shard is stepped), and so do the losses and the evaluation of each epoch."""
    ddp, sharded = final_parameters(sharded_runs / "none"), final_parameters(sharded_runs / mode)
    assert set(sharded) == set(ddp)
    worst = max((sharded[name].float() - ddp[name].float()).abs().max().item() for name in ddp)
    assert worst < 1e-6
    moved = max((ddp[name].float() - initial).abs().max().item() for name, initial in initial_weights().items())
    assert moved > 1e-3, "the runs sharded_runs"
    for ours, theirs in zip(read_metrics(sharded_runs / mode), read_metrics(sharded_runs / "none")):
        for column in ("train_loss", "val_loss", "val_accuracy"):
            assert float(ours[column]) == pytest.approx(float(theirs[column]), abs=1e-6)


def test_fsdp2s_collectives_are_not_timed_and_say_so(sharded_runs):
    """No DDP hook sees FSDP2's gathers and reduce-scatters: their time is not measured, and is not written as 0;
    the pages read such a run all the same."""
    import json
    import math

    from ddp_core.analysis.results import read_run, read_steps

    for mode, timed in (("zero1", True), ("zero2", False), ("zero3", False)):
        row = read_metrics(sharded_runs / mode)[-1]
        assert math.isnan(float(row["comm_total_s"] or "nan")) != timed
        assert (json.loads((sharded_runs / mode / "run.json").read_text())["allreduces_per_step"] is not None) == timed
        metrics, _ = read_run(sharded_runs / mode)
        assert metrics["train_loss"].notna().all() and read_steps(sharded_runs / mode)["step_time_s"].notna().all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.slow
def test_a_sharded_run_resumes_exactly(sharded_runs, mode, tmp_path, isolated_env):
    """One epoch, then --resume to the second from its checkpoint (the whole state gathered to rank 0, each rank's
    shard loaded back from it): the same weights as the run that never stopped."""
    from conftest import run_training

    args = [a if a != "2" or RUN[i - 1] != "--epochs" else "1" for i, a in enumerate(RUN)]
    run_training([*args, "--sharding", mode, "--out", tmp_path / "run"], cwd=tmp_path, env=isolated_env, nproc=2)
    run_training(
        [*RUN, "--sharding", mode, "--out", tmp_path / "run", "--resume"], cwd=tmp_path, env=isolated_env, nproc=2
    )
    resumed, straight = final_parameters(tmp_path / "run"), final_parameters(sharded_runs / mode)
    assert max((resumed[name] - straight[name]).abs().max().item() for name in straight) == 0.0


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--sharding", "zero1"],
            "--sharding zero1 needs 2 or more ranks: one rank holds the whole state whatever the mode",
        ),
        (
            ["--sharding", "zero3", "--comm-hook", "fp16", "--backend", "gloo"],
            "--sharding zero3 does not combine with --comm-hook fp16 (leave it none)",
        ),
        (
            ["--sharding", "zero2", "--compile"],
            "--sharding zero2 does not combine with --compile (FSDP2 here runs eager)",
        ),
    ],
    ids=["one rank", "a communication hook", "compiled"],
)
def test_what_sharding_cannot_combine_with_is_refused_in_one_line(refused, args, message):
    proc = refused(*TINY_SYNTHETIC, "--global-batch-size", "8", *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"ddp_core.train: error: {message}"]


def test_each_rank_holds_the_training_state_zero_s_formula_gives(sharded_runs):
    """The bytes of parameters, gradients and optimizer state a rank holds, counted from its tensors, are the
    formula's for 2 ranks: exactly under DDP; under ZeRO-1, which gives each rank whole tensors, at least the even
    split of the optimizer's state and at most one tensor more; under ZeRO-2 and ZeRO-3 exactly for gradients and
    optimizer state (the tiny model's tensors split evenly), while the parameters at their most are FSDP2's shards
    and, beside them, those it has gathered whole. DDP keeps its gradient buckets between steps, FSDP2 frees its
    shards."""
    from ddp_core.analysis.zero import formula_bytes
    from ddp_core.engine.model_cost import parameter_counts
    from ddp_core.engine.run_files import STATE_COLUMNS

    model = tiny_model()
    sizes = [p.numel() for p in model.parameters()]
    counts = parameter_counts(json.loads((sharded_runs / "none" / "run.json").read_text())["model"])
    assert sorted(counts.values()) == sorted(sizes)
    for mode in ("none", *MODES):
        measured = {kind: int(read_metrics(sharded_runs / mode)[-1][kind]) for kind in STATE_COLUMNS}
        formula = formula_bytes(sum(sizes), len(sizes), 2, mode)
        if mode in ("zero2", "zero3"):
            assert measured.pop("parameters_bytes") == fsdp2_parameter_bytes(counts, 2, mode), mode
            formula.pop("parameters_bytes")
        if mode == "zero1":
            assert (
                8 * sum(sizes) / 2
                <= measured.pop("optimizer_state_bytes")
                <= (formula.pop("optimizer_state_bytes") + 8 * max(sizes))
            )
        assert measured == formula, mode
    assert formula_bytes(sum(sizes), len(sizes), 2, "zero3")["gradients_kept_bytes"] == 0


def fsdp2_parameter_bytes(counts: dict[str, int], ranks: int, mode: str) -> float:
    """The parameters one rank holds at their most under FSDP2 as `ddp_core.engine.sharding` wraps the model (each
    block a unit, the rest the root's): its shards of every parameter, and beside them the parameters gathered
    whole at once, all of them under ZeRO-2 (kept from forward to the end of backward), the root's and one block's
    under ZeRO-3."""
    from ddp_core.analysis.zero import block_parameters

    total, blocks = sum(counts.values()), block_parameters(counts)
    gathered = total if mode == "zero2" else total - sum(blocks.values()) + max(blocks.values(), default=0)
    return 4 * total / ranks + 4 * gathered


def test_fsdp2_holds_a_units_shards_beside_the_parameters_it_has_gathered():
    """ZeRO-2 gathers every parameter; ZeRO-3 the root's (embeddings, head) and one block's, the largest."""
    counts = {"tok_emb.weight": 100, "blocks.0.w": 10, "blocks.0.b": 2, "blocks.1.w": 20, "head.weight": 8}
    assert fsdp2_parameter_bytes(counts, 4, "zero2") == 4 * 140 / 4 + 4 * 140
    assert fsdp2_parameter_bytes(counts, 4, "zero3") == 4 * 140 / 4 + 4 * (108 + 20)


def test_a_step_hands_its_collectives_the_bytes_each_mode_is_known_to_send(sharded_runs):
    """Counted where PyTorch dispatches them, the third step's collectives: DDP all-reduces the fp32 gradient (4Ψ
    bytes) once; ZeRO-1 then broadcasts every parameter from its owner; FSDP2 reduce-scatters the whole gradient once
    a step and gathers every parameter for each micro-batch's forward (two here), ZeRO-3 the blocks again for
    backward (the root stays gathered)."""
    from ddp_core.analysis.zero import block_parameters
    from ddp_core.engine.model_cost import parameter_counts

    counts = parameter_counts(json.loads((sharded_runs / "none" / "run.json").read_text())["model"])
    gradient, blocks = 4 * sum(counts.values()), 4 * sum(block_parameters(counts).values())

    def handed(mode):
        counted = json.loads((sharded_runs / mode / "run.json").read_text())["collectives_per_step"]
        by_kind = {}
        for name, entry in counted.items():
            kind = next(k for k in ("allreduce", "broadcast", "allgather", "reduce_scatter") if k in name)
            by_kind[kind] = by_kind.get(kind, 0) + entry["bytes"]
        return by_kind

    assert handed("none") == {"allreduce": gradient}
    assert handed("zero1") == {"allreduce": gradient, "broadcast": gradient}
    assert handed("zero2") == {"reduce_scatter": gradient, "allgather": 2 * gradient}
    assert handed("zero3") == {"reduce_scatter": gradient, "allgather": 2 * (gradient + blocks)}


def test_what_a_node_sends_for_its_collectives_follows_gloos_algorithms():
    """Over (N-1)/N of a collective's size: a ring all-reduce sends 2, gloo's reduce-scatter too (a whole
    all-reduce), an all-gather and a broadcast 1; a collective of no known algorithm is refused in one line."""
    from ddp_core.analysis.results import ResultsError
    from ddp_core.analysis.zero import gloo_sends

    counted = {
        "allreduce_": {"calls": 2, "bytes": 100},
        "broadcast_": {"calls": 3, "bytes": 40},
        "_reduce_scatter_base_": {"calls": 1, "bytes": 10},
        "_allgather_base_": {"calls": 1, "bytes": 8},
    }
    assert gloo_sends(counted, 4) == pytest.approx((2 * 100 + 40 + 2 * 10 + 8) * 3 / 4)
    with pytest.raises(ResultsError, match="alltoall_") as refused:
        gloo_sends({"alltoall_": {"calls": 1, "bytes": 8}}, 4)
    assert "\n" not in str(refused.value)


def tiny_model():
    """The tiny model of the runs, as they build it."""
    from ddp_core.engine.config import parse_args
    from ddp_core.engine.model import TransformerClassifier
    from ddp_core.train import model_config

    cfg = parse_args([*RUN, "--out", "unused"], world_size=2)
    torch.manual_seed(cfg.seed)
    return TransformerClassifier(model_config(cfg, 2))


def initial_weights() -> dict:
    """The tiny model's weights as every run starts from them (seed 0)."""
    return tiny_model().state_dict()


def test_the_bytes_a_parameter_costs_a_rank_are_what_it_holds_over_the_models_parameters():
    """Per mode, the bytes a parameter costs a rank (which set the largest model a device fits) are its parameters,
    gradients and optimizer state over the model's parameters, what it keeps between steps apart; the largest rank's
    of the repeats."""
    import pandas as pd

    from ddp_core.analysis.zero import formula_bytes, state_table

    held = {"parameters_bytes": 400, "gradients_bytes": 100, "optimizer_state_bytes": 300, "gradients_kept_bytes": 0}
    rows = pd.DataFrame([{"mode": "zero2", "ranks": 4, **held}, {"mode": "zero2", "ranks": 4, **held}])
    table = state_table(rows, parameters=100, tensors=2)
    assert table["per_parameter_measured"].tolist() == [8.0]
    assert table["per_parameter_formula"].tolist() == [(400 + 100 + 200 + 8) / 100]
    assert formula_bytes(100, 2, 4, "zero2") == {
        "parameters_bytes": 400,
        "gradients_bytes": 100,
        "optimizer_state_bytes": 208,
        "gradients_kept_bytes": 0,
    }
