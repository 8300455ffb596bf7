"""The timers' timeline: the step a reader sees drawn is a typical one."""

import time

import torch

from ddp_core.engine.timers import EpochTimer


def test_the_timeline_kept_is_the_epochs_median_step_not_its_last():
    timer = EpochTimer(torch.device("cpu"))
    # The median step 0.4 s, the last 0.02 s; steps 0.2 s apart, so that late wake-ups on a loaded machine do not
    # reorder them (a sleep of 0.1 s once took more than 0.15 s there).
    for seconds in (0.01, 0.8, 0.4, 0.6, 0.02):
        timer.begin_step()
        with timer.phase("forward"):
            time.sleep(seconds)
        with timer.phase("optimizer"):
            pass
    timer.summary()
    forward = [row for row in timer.median_step_timeline if row["what"] == "forward"]
    assert len(forward) == 1
    assert 0.4 <= forward[0]["end_s"] - forward[0]["start_s"] < 0.6
