"""Steps to a target accuracy against the global batch size (Shallue et al., JMLR 2019), and the critical batch
size past which a larger batch stops saving steps (McCandlish et al., 2018).

McCandlish et al.'s model of training speed: the steps S and samples E = B·S to reach a target satisfy
(S/S_min - 1)(E/E_min - 1) = 1. With E = B·S this is S = S_min + E_min / B: perfect scaling (S halves as B doubles)
while B is far below B_crit = E_min / S_min, no saving far above it. S is linear in 1/B, so a least-squares line
through the measured (1/B, S) gives S_min (its intercept) and E_min (its slope).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def steps_to_target(evals: pd.DataFrame, target: float) -> float:
    """The optimizer step of the first evaluation at or past `target` (rows of evals.csv: step, val_accuracy);
    NaN for a run that never reached it, never its last step."""
    reached = evals.loc[evals["val_accuracy"] >= target, "step"]
    return float(reached.min()) if len(reached) else math.nan


def critical_batch(batch_sizes, steps) -> dict[str, float]:
    """S_min, E_min and B_crit = E_min / S_min from steps to target at each global batch size (runs that never
    reached it left out), by least squares of S = S_min + E_min / B. NaN where fewer than two batch sizes reached
    it or the fit has no positive S_min and E_min (no bend in the measured range)."""
    data = pd.DataFrame({"batch": batch_sizes, "steps": steps}).dropna()
    if data["batch"].nunique() < 2:
        return dict.fromkeys(["s_min", "e_min", "b_crit"], math.nan)
    e_min, s_min = np.polyfit(1.0 / data["batch"].to_numpy(float), data["steps"].to_numpy(float), 1)
    if s_min <= 0 or e_min <= 0:
        return {"s_min": float(s_min), "e_min": float(e_min), "b_crit": math.nan}
    return {"s_min": float(s_min), "e_min": float(e_min), "b_crit": float(e_min / s_min)}
