"""The gradient noise scale, measured from the two gradients DDP already has at every step.

The simple noise scale B_simple = tr(Σ) / |G|² predicts where a larger batch stops saving steps (McCandlish et al.,
2018). A rank's gradient before the all-reduce and the average after it are two batch sizes, enough to estimate both.
It needs the exact, unscaled average, so one rank, PowerSGD and fp16 autocast leave the columns empty.
"""

from __future__ import annotations

import math

import torch


class GradientNoise:
    """The squared norms of this rank's gradient and of the averaged one, per bucket, since `begin_epoch`."""

    def __init__(self):
        self.begin_epoch()

    def begin_epoch(self) -> None:
        # Lists of device tensors: summed without synchronising, and the trainer reduces the sums over ranks once.
        # The process group's threads may run two buckets' callbacks at once: an append is atomic, a += is not.
        self.local_sq, self.averaged_sq = [], []

    def measured(self, hook):
        """DDP communication hook `hook` (state, bucket) -> future, with the bucket's squared norms recorded."""

        # Summed over buckets, the norms are the step's |G_small|² (this rank's) and |G_big|² (the average).
        def measured_hook(state, bucket):
            self.local_sq.append(squared_norm(bucket.buffer()))  # before `hook`, which may average it in place

            def arrived(fut):
                averaged = fut.value()
                self.averaged_sq.append(squared_norm(averaged))
                return averaged

            return hook(state, bucket).then(arrived)

        return measured_hook

    def sums(self) -> tuple[float, float]:
        """(Σ |G_small|², Σ |G_big|²) over the steps since `begin_epoch` (0 where none was measured)."""
        return tuple(float(sum(values).item()) if values else 0.0 for values in (self.local_sq, self.averaged_sq))


def squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    """The squared norm of `tensor`, summed pairwise in its own precision and returned as float64."""
    # Within 1e-7 of the float64 sum, in a third of its CPU time. vector_norm in float32 errs by 1e-4, which the
    # difference of two squared norms would magnify.
    return tensor.square().sum().double()


def noise_scale(
    local_sq_sum: float, averaged_sq_sum: float, steps: int, world_size: int, samples_per_rank: int
) -> dict[str, float]:
    """The unbiased |G|² and tr(Σ), and B_simple = tr(Σ) / |G|², from the squared norms before and after averaging.
    Each sum runs over `steps` steps and `world_size` ranks. A rank's gradient averages `samples_per_rank` samples,
    its batch times accumulation."""
    if world_size < 2:
        raise ValueError("the noise scale needs two batch sizes: one rank has only its own")
    # Averaging over steps and ranks before dividing is the paper's smoothing. It smooths |G|² and tr Σ apart, but the
    # estimates are linear in the squared norms, so the result is the same.
    small_sq, big_sq = local_sq_sum / (world_size * steps), averaged_sq_sum / (world_size * steps)
    b_small, b_big = samples_per_rank, samples_per_rank * world_size
    # tr Σ: the summed variance of one sample's gradient. |G|²: the true gradient's squared norm.
    # A gradient averaged over B samples has E|G_B|² = |G|² + tr(Σ) / B. Two batch sizes give both (appendix A).
    signal = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    noise = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return {
        "grad_sq_norm": signal,
        "grad_noise_trace": noise,
        "noise_scale": noise / signal if signal > 0 else math.nan,  # too few steps to tell the signal from noise
    }
