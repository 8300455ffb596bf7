"""The gradient noise scale, measured from the two gradients DDP already has at every step.

McCandlish et al. ("An empirical model of large-batch training", 2018) predict the batch size past which a
larger batch stops saving optimizer steps from the simple noise scale B_simple = tr(Σ) / |G|²: the gradient noise
(tr Σ, the summed variance of one sample's gradient) against the signal (|G|², the true gradient's squared norm).
A gradient averaged over B samples has E|G_B|² = |G|² + tr(Σ) / B, so the squared norms at two batch sizes give
unbiased estimates of both (their appendix A). Data-parallel training hands both over for free: before the
all-reduce each rank holds the gradient of its own B_small = per-rank batch × accumulation samples, after it the
average over the global batch B_big.

A DDP communication hook takes, for each gradient bucket, the squared norm of this rank's part before it is sent
and of the averaged part when it arrives; their sums over buckets are the step's |G_small|² and |G_big|². They are
summed over the epoch's steps on the device (no synchronisation) and reduced over the ranks once, with the epoch's
other metrics. Averaging over steps and ranks before dividing is the smoothing the paper applies (it smooths |G|²
and tr Σ separately; the estimates are linear in the squared norms, so the means give the same thing).

Measured only where the averaged gradient is the exact average and the gradients are unscaled: not on one rank
(one batch size), not under PowerSGD (its average is a low-rank approximation), not with fp16 autocast (the loss
scale multiplies every gradient and changes between steps). There the columns are empty.
"""

from __future__ import annotations

import math

import torch


class GradientNoise:
    """The squared norms of this rank's gradient and of the averaged one, per bucket, since `begin_epoch`.

    Kept as lists of device tensors: a bucket's averaged norm is taken in the all-reduce's callback, on the
    process group's threads, which may run two buckets' callbacks at once (an append is atomic, a += is not)."""

    def __init__(self):
        self.begin_epoch()

    def begin_epoch(self) -> None:
        self.local_sq, self.averaged_sq = [], []

    def measured(self, hook):
        """DDP communication hook `hook` (state, bucket) -> future, with the bucket's squared norms recorded."""

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
    """Summed in the tensor's precision, pairwise (1e-7 of the float64 sum, in a third of its time on a CPU;
    vector_norm in float32 errs by 1e-4, which the difference of two squared norms would magnify)."""
    return tensor.square().sum().double()


def noise_scale(
    local_sq_sum: float, averaged_sq_sum: float, steps: int, world_size: int, samples_per_rank: int
) -> dict[str, float]:
    """The unbiased |G|² and tr(Σ), and B_simple = tr(Σ) / |G|², from the squared norms of the ranks' own gradients
    (`local_sq_sum`) and of the averaged ones (`averaged_sq_sum`), each summed over `steps` steps and `world_size`
    ranks; a rank's gradient averages `samples_per_rank` samples (per-rank batch × accumulation). B_simple is NaN
    where the signal estimate is not positive: too few steps to tell it from the noise.

    From E|G_B|² = |G|² + tr(Σ)/B at B_small = samples_per_rank and B_big = world_size × B_small:
    tr(Σ) = (|G_small|² - |G_big|²) / (1/B_small - 1/B_big) and |G|² = (B_big |G_big|² - B_small |G_small|²) /
    (B_big - B_small)."""
    if world_size < 2:
        raise ValueError("the noise scale needs two batch sizes: one rank has only its own")
    small_sq, big_sq = local_sq_sum / (world_size * steps), averaged_sq_sum / (world_size * steps)
    b_small, b_big = samples_per_rank, samples_per_rank * world_size
    signal = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    noise = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return {
        "grad_sq_norm": signal,
        "grad_noise_trace": noise,
        "noise_scale": noise / signal if signal > 0 else math.nan,
    }
