"""The gradient noise scale (McCandlish et al., 2018) as the trainer measures it from DDP's all-reduce: the right
squared norms, and estimates that are unbiased."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ddp_core.engine.noise_scale import noise_scale
from hooked_gradients import STEPS, batch, fresh_model

RANKS, SAMPLES_PER_RANK = 2, 4  # as tests/hooked_gradients.py trains


def per_sample_gradients(step: int) -> list[list[torch.Tensor]]:
    """Each rank's samples' gradients at `step`, one flat float64 vector per sample, computed one sample at a time
    without DDP."""
    model = fresh_model()
    ranks = []
    for rank in range(RANKS):
        ids, labels = batch(rank, step)
        grads = []
        for i in range(len(labels)):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(ids[i : i + 1]), labels[i : i + 1]).backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
        ranks.append(grads)
    return ranks


def test_the_trainer_takes_each_ranks_and_the_averaged_gradients_squared_norms(hooked):
    """Before the all-reduce a rank holds the mean of its own samples' gradients; after it, the mean of all."""
    local_sum = averaged_sum = 0.0
    for step, (local_sq, averaged_sq) in enumerate(hooked["noise_sums"]):
        ranks = per_sample_gradients(step)
        rank_means = [torch.stack(grads).mean(0) for grads in ranks]
        everyone = torch.stack([g for grads in ranks for g in grads]).mean(0)
        assert local_sq == pytest.approx(sum(m.square().sum().item() for m in rank_means), rel=1e-6)
        assert averaged_sq == pytest.approx(RANKS * everyone.square().sum().item(), rel=1e-6)
        local_sum, averaged_sum = local_sum + local_sq, averaged_sum + averaged_sq
    # the estimates from the means at B_small = 4 and B_big = 8: E|G_B|^2 = |G|^2 + tr(Sigma)/B at both sizes
    small, big = local_sum / (RANKS * STEPS), averaged_sum / (RANKS * STEPS)
    trace = (small - big) / (1 / 4 - 1 / 8)
    signal = small - trace / 4
    measured = noise_scale(local_sum, averaged_sum, STEPS, RANKS, SAMPLES_PER_RANK)
    assert measured["grad_noise_trace"] == pytest.approx(trace, rel=1e-6)
    assert measured["grad_sq_norm"] == pytest.approx(signal, rel=1e-6)
    # three steps of 8 samples: too few to tell the signal from the noise, so no B_simple
    assert signal < 0 and math.isnan(measured["noise_scale"])


def test_the_estimates_are_unbiased_for_gradients_of_known_signal_and_noise():
    """Per-sample gradients drawn around a known G with a known covariance: averaged over many steps the estimates
    find |G|^2, tr(Sigma) and B_simple, at any number of ranks and per-rank batch."""
    rng = np.random.default_rng(0)
    true_gradient = np.full(16, 0.25)  # |G|^2 = 1
    scales = np.linspace(0.5, 1.5, 16)  # tr(Sigma) = sum of the variances
    trace = float((scales**2).sum())
    for ranks, per_rank in [(2, 4), (4, 2), (8, 16)]:
        steps = 20_000
        samples = true_gradient + scales * rng.standard_normal((steps, ranks, per_rank, 16))
        rank_means = samples.mean(axis=2)
        local_sum = float((rank_means**2).sum())
        averaged_sum = ranks * float((rank_means.mean(axis=1) ** 2).sum())
        measured = noise_scale(local_sum, averaged_sum, steps, ranks, per_rank)
        assert measured["grad_sq_norm"] == pytest.approx(1.0, rel=0.1), (ranks, per_rank)
        assert measured["grad_noise_trace"] == pytest.approx(trace, rel=0.05), (ranks, per_rank)
        assert measured["noise_scale"] == pytest.approx(trace, rel=0.1), (ranks, per_rank)


def test_no_signal_beyond_the_noise_gives_no_noise_scale_and_one_rank_none_at_all():
    assert math.isnan(
        noise_scale(local_sq_sum=2.0, averaged_sq_sum=0.2, steps=1, world_size=2, samples_per_rank=4)["noise_scale"]
    )
    with pytest.raises(ValueError, match="two batch sizes"):
        noise_scale(1.0, 1.0, steps=1, world_size=1, samples_per_rank=4)
