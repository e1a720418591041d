"""A model's pass@1-coverage curve over sampling temperatures, read as a frontier. The model sampled at temperatures
T_1 < ... < T_n gives points (pass@1, coverage); between them the curve is interpolated in temperature, each
coordinate by a monotone cubic (Fritsch-Carlson PCHIP), because a chord between two points cuts under a concave curve
(bench/frontier_interpolation.py measures the bias by leaving each temperature out). The envelope at pass@1 p is the
best coverage the model reaches at pass@1 p or higher: temperatures that are worse on both axes than another (too hot
to help) drop out, so an arm below a hot temperature's pass@1 is compared with the best the model does, not with its
worst. Above the highest pass@1 sampled there is no curve: the reading is flagged `outside`, and is either the
highest-pass@1 point's coverage or (extend=True) the line through the two highest-pass@1 points of those no other
point beats on both axes (flat where they lie less than MIN_STEP apart in pass@1, or where only one is left): a line
through a dominated point could rise past the curve's end, which the envelope, never rising with pass@1, cannot)."""
from __future__ import annotations

import numpy as np

GRID = 32  # interpolated points per temperature interval
MIN_STEP = 0.01  # pass@1 apart the two points an extension leans on must be (a bootstrap draw can nearly tie them)


def pchip(x: np.ndarray, y: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """The monotone piecewise cubic through (x, y) (x increasing) at xs within [x[0], x[-1]]: no overshoot between
    points, slopes 0 at local extrema (scipy.interpolate.PchipInterpolator's values)."""
    x, y, xs = (np.asarray(v, dtype=float) for v in (x, y, xs))
    if len(x) < 3:
        return np.interp(xs, x, y)
    h, delta = np.diff(x), np.diff(y) / np.diff(x)
    d = np.zeros_like(y)
    w1, w2 = 2 * h[1:] + h[:-1], h[1:] + 2 * h[:-1]
    same = delta[:-1] * delta[1:] > 0  # a weighted harmonic mean of the neighbouring slopes; 0 at an extremum
    with np.errstate(divide="ignore", invalid="ignore"):
        d[1:-1] = np.where(same, (w1 + w2) / (w1 / delta[:-1] + w2 / delta[1:]), 0.0)
    d[0], d[-1] = _end_slope(h[0], h[1], delta[0], delta[1]), _end_slope(h[-1], h[-2], delta[-1], delta[-2])
    i = np.clip(np.searchsorted(x, xs, side="right") - 1, 0, len(x) - 2)
    t = (xs - x[i]) / h[i]
    return ((1 + 2 * t) * (1 - t) ** 2 * y[i] + t * (1 - t) ** 2 * h[i] * d[i] + t * t * (3 - 2 * t) * y[i + 1]
            + t * t * (t - 1) * h[i] * d[i + 1])


def _end_slope(h0: float, h1: float, d0: float, d1: float) -> float:
    """A one-sided three-point slope at an end, kept shape-preserving."""
    s = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
    if np.sign(s) != np.sign(d0):
        return 0.0
    if np.sign(d0) != np.sign(d1) and abs(s) > abs(3 * d0):
        return 3 * d0
    return s


def curve(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows (temperature, pass@1, coverage), any order -> (pass@1, coverage) on a grid of GRID points per
    temperature interval, each coordinate interpolated in temperature."""
    pts = points[np.argsort(points[:, 0], kind="stable")]
    t = pts[:, 0]
    if len(t) == 1:
        return pts[:, 1], pts[:, 2]
    grid = np.concatenate([np.linspace(t[i], t[i + 1], GRID, endpoint=False) for i in range(len(t) - 1)] + [t[-1:]])
    return pchip(t, pts[:, 1], grid), pchip(t, pts[:, 2], grid)


def envelope_at(points: np.ndarray, targets: np.ndarray, extend: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The envelope's coverage at each pass@1 of `targets` (the best coverage on the curve at that pass@1 or higher),
    and a mask of the targets above the curve's highest pass@1 (see the module's note for their reading)."""
    targets = np.atleast_1d(np.asarray(targets, dtype=float))
    p, c = curve(points)
    order = np.argsort(-p, kind="stable")
    best = np.maximum.accumulate(c[order])  # best[j]: the most coverage among the j+1 highest-pass@1 grid points
    n_at_or_above = np.searchsorted(-p[order], -targets, side="right")
    outside = n_at_or_above == 0
    values = best[np.maximum(n_at_or_above - 1, 0)]
    if extend and outside.any():
        front = points[~dominated(points)]  # the envelope's own points: a dominated one would tilt the line upward
        top = front[np.argsort(-front[:, 1], kind="stable")[:2]]
        dp = top[0, 1] - top[1, 1] if len(top) > 1 else 0.0
        slope = (top[0, 2] - top[1, 2]) / dp if dp >= MIN_STEP else 0.0  # two points closer than that: no slope
        values = np.where(outside, top[0, 2] + slope * (targets - top[0, 1]), values)
    return values, outside


def dominated(points: np.ndarray) -> np.ndarray:
    """Per row (temperature, pass@1, coverage): whether another row is at least as good on both axes and better on
    one (that temperature is off the envelope)."""
    p, c = points[:, 1], points[:, 2]
    ge = (p[None, :] >= p[:, None]) & (c[None, :] >= c[:, None])
    gt = (p[None, :] > p[:, None]) | (c[None, :] > c[:, None])
    return (ge & gt).any(axis=1)
