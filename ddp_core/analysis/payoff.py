"""When DDP pays off, from the runs and the cost model; the discussion and the key findings quote it.

It sets the theory's break-even f/(N-1) against the ratio R_N the runs reached, and checks the measured speedup's
side. It also shows how tokens per rank, model size and hardware move R_N, for ranks like these and A100s on NVLink.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_core.analysis.comparisons import speedup_comparisons
from ddp_core.analysis.cost_model import AlphaBeta, fit_alpha_beta, model_compute_to_comm_ratio, predict
from ddp_core.analysis.nvlink_forecast import nvlink_fit, peak_gemm_flops_per_s
from ddp_core.analysis.results import Experiment
from ddp_core.analysis.speedups import scaling_table
from ddp_core.analysis.verdict import Comparison
from ddp_core.engine.model_cost import parameter_counts, preset_configs, training_flops

CPU, GPU = "ranks like these", "A100 + NVLink"  # CPU: the runs' own ranks, on a CPU or GPUs


def benchmarked(experiment: Experiment) -> tuple[int, AlphaBeta]:
    """The largest world size with an all-reduce benchmark, and its fit."""
    n = max(experiment.allreduce)
    return n, fit_alpha_beta(experiment.allreduce[n])


def _hardware(experiment: Experiment) -> dict[str, tuple[float, AlphaBeta]]:
    """Compute rate and all-reduce fit of ranks like the 1-rank run here, and of A100s on NVLink.

    Ranks like these each get cores of their own at the measured rate. The A100 figures are published ones.
    """
    n, cpu_fit = benchmarked(experiment)
    one = experiment.runs[1]
    compute_1 = scaling_table(experiment).loc[1, "compute_per_step_s"]
    cpu_rate = training_flops(one.model, one.global_batch_size * one.model["max_len"]) / compute_1
    return {CPU: (cpu_rate, cpu_fit), GPU: (peak_gemm_flops_per_s(), nvlink_fit(n))}


def ratio_per_token(experiment: Experiment) -> dict[tuple[str, str], float]:
    """R_N at one token per rank, per kind of rank and preset, since R_N grows linearly with the tokens per rank."""
    models = preset_configs(experiment.baseline.model)
    return {
        (name, preset): model_compute_to_comm_ratio(model, 1, rate, fit)
        for name, (rate, fit) in _hardware(experiment).items()
        for preset, model in models.items()
    }


@dataclass(frozen=True)
class Payoff:
    """The theory's break-even against the measured R_N, whether the theory's verdict held, and what moves R_N."""

    n_model: int
    exposed_fraction: float
    break_even_ratio: float
    ratio_n_model: float
    theory_speedup: float
    theory_side: str
    theory_prediction: str
    measured_speedup_value: str
    theory_outcome: str
    cost_model_speedup: float
    ideal_consequence: str
    cpu_gflops: float
    cpu_bytes_per_kflop: float
    gpu_bytes_per_kflop: float
    link_per_flop_ratio: float
    link_per_flop_word: str
    fewest_cpu: str
    fewest_gpu: str
    most_cpu: str
    tokens_spread_cpu: float
    run_preset: str
    run_embedding_share: float
    smallest_embedding_share: float
    smallest_embedding_preset: str
    model_ratio_at_runs: float
    allreduce_in_training_factor: float
    allreduce_vs_benchmark_factor: float


def payoff(experiment: Experiment) -> Payoff:
    """`Payoff` of a study's runs at the most ranks with an all-reduce benchmark."""
    table = scaling_table(experiment)
    n, _ = benchmarked(experiment)
    one = experiment.baseline
    exposed_fraction = float(table.loc[n, "exposed_share"])
    break_even_ratio = exposed_fraction / (n - 1)
    ratio = float(table.loc[n, "compute_to_comm_ratio"])
    hardware, ratios = _hardware(experiment), ratio_per_token(experiment)
    models = preset_configs(one.model)
    fewest = {name: max(models, key=lambda preset: ratios[name, preset]) for name in hardware}
    most = min(models, key=lambda preset: ratios[CPU, preset])  # the preset that needs the most tokens on the CPU
    embedding_share = {
        preset: model["vocab_size"] * model["d_model"] / sum(parameter_counts(model).values())
        for preset, model in models.items()
    }
    # The bytes the all-reduce carries while a rank computes a thousand FLOPs: a plain number on a CPU and a GPU alike,
    # where per FLOP both would open with two or three zeros after the point.
    link_per_kflop = {name: float(fit.bus_bandwidth_GBps * 1e9 / rate * 1e3) for name, (rate, fit) in hardware.items()}
    model_ratio = ratios[CPU, one.config["preset"]] * experiment.runs[n].tokens_per_rank  # same T_c/N: same compute
    predicts_gain = ratio > break_even_ratio
    measured = speedup_comparisons(experiment)[n]
    predicted = predict(experiment).loc[n]
    return Payoff(
        n_model=n,
        exposed_fraction=exposed_fraction,
        break_even_ratio=break_even_ratio,
        ratio_n_model=ratio,
        theory_speedup=n * ratio / (ratio + exposed_fraction),
        theory_side="above" if predicts_gain else "below",
        theory_prediction="a speedup above 1" if predicts_gain else "a slowdown",
        measured_speedup_value=measured.value(),
        theory_outcome=theory_outcome(predicts_gain, measured),
        cost_model_speedup=float(predicted["predicted_speedup"]),
        ideal_consequence="DDP would pay off" if predicts_gain else "DDP would not pay off",
        cpu_gflops=float(hardware[CPU][0] / 1e9),
        cpu_bytes_per_kflop=link_per_kflop[CPU],
        gpu_bytes_per_kflop=link_per_kflop[GPU],
        link_per_flop_ratio=max(link_per_kflop.values()) / min(link_per_kflop.values()),
        link_per_flop_word="fewer" if link_per_kflop[CPU] >= link_per_kflop[GPU] else "more",
        fewest_cpu=fewest[CPU],
        fewest_gpu=fewest[GPU],
        most_cpu=most,
        tokens_spread_cpu=ratios[CPU, fewest[CPU]] / ratios[CPU, most],
        run_preset=one.config["preset"],
        run_embedding_share=embedding_share[one.config["preset"]],
        smallest_embedding_share=min(embedding_share.values()),
        smallest_embedding_preset=min(embedding_share, key=embedding_share.get),
        model_ratio_at_runs=float(model_ratio),
        allreduce_in_training_factor=float(model_ratio / ratio),
        allreduce_vs_benchmark_factor=float(predicted["measured_comm_s"] / predicted["predicted_comm_s"]),
    )


def theory_outcome(predicts_gain: bool, measured: Comparison) -> str:
    """Whether the measured speedup, judged by the one verdict, bears the theory's prediction out, in words.

    When the verdict is undecided, the words say why the runs cannot tell.
    """
    if not measured.decided:
        return f"so the runs can neither confirm nor refute the prediction: {measured.why_undecided()}"
    borne_out = (measured.verdict == "higher") == predicts_gain
    return "as the theory predicts" if borne_out else "contrary to the theory's prediction"
