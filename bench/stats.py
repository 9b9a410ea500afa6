"""Medians with spreads: every timed figure is reported as a distribution, never one number."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, quartiles, min/max and count of ``values`` (None fields when empty)."""
    vals = sorted(float(v) for v in values)
    if not vals:
        return {"n": 0, "median": None, "p25": None, "p75": None, "min": None, "max": None}
    if len(vals) >= 2:
        q = statistics.quantiles(vals, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25 = p75 = vals[0]
    return {"n": len(vals), "median": statistics.median(vals), "p25": p25, "p75": p75,
            "min": vals[0], "max": vals[-1]}


def ratio(num: float | None, den: float | None) -> float | None:
    """num/den, None when either side is missing or the denominator is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return num / den


def fmt(v: float | int | None, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}g}"


def fmt_spread(s: dict, digits: int = 3, unit: str = "") -> str:
    """``median [min–max] (n)`` for a table cell."""
    if not s or s.get("median") is None:
        return "n/a"
    return (f"{fmt(s['median'], digits)}{unit} [{fmt(s['min'], digits)}–{fmt(s['max'], digits)}] "
            f"(n={s['n']})")
