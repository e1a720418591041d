"""Readings at matched KL: under a learned reward an arm that moves less from its start keeps more (on the task track
about 1.07 right answers per unit of log KL along the RM arm), so an arm is read against its control where the
control's line through its runs at two steps (two learning rates), in log KL, reaches the arm's own KL (docs/method.md,
"Readings at matched KL"). Every comparison under the RM is read so beside the same-step reading."""
from __future__ import annotations

import math


def kl_weight(kl: float, k_lo: float, k_hi: float) -> float:
    """Where kl lies between k_lo (0) and k_hi (1) in log KL; outside [0, 1] a reading there extrapolates."""
    if min(kl, k_lo, k_hi) <= 0 or k_lo == k_hi:
        raise ValueError(f"KL {kl} against a line through {k_lo} and {k_hi}: needs positive KLs at two steps")
    return (math.log(kl) - math.log(k_lo)) / (math.log(k_hi) - math.log(k_lo))


def on_line(kl: float, a: tuple[float, float], b: tuple[float, float]) -> float:
    """The value at kl on the line, in log KL, through the (KL, value) points a and b (the control's two steps)."""
    w = kl_weight(kl, a[0], b[0])
    return (1 - w) * a[1] + w * b[1]


def at_control_kl(kl: float, value: float, a: tuple[float, float], b: tuple[float, float]) -> dict:
    """An arm's value (at its KL) minus the control's line at that KL, and whether the line was extrapolated."""
    w = kl_weight(kl, a[0], b[0])
    return {"value": value - on_line(kl, a, b), "weight": w, "extrapolated": not 0 <= w <= 1}
