"""Axis units and curves for plots: readable time and byte units, memory as a step function."""

from __future__ import annotations

import numpy as np
import pandas as pd


def time_unit(span_seconds: float) -> tuple[str, float]:
    """A readable unit for an axis spanning `span_seconds`: (label, factor to multiply seconds by)."""
    for label, factor in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if span_seconds * factor >= 1.0:
            return label, factor
    return "ns", 1e9


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """A binary-prefixed unit for a memory axis reaching `max_bytes`: (label, divisor)."""
    for label, divisor in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if max_bytes >= divisor:
            return label, divisor
    return "bytes", 1.0


def memory_steps(memory: pd.DataFrame, rank: int, until: float) -> tuple[np.ndarray, np.ndarray]:
    """A rank's memory curve as step-function vertices (x, y), held until `until`."""
    rows = memory[memory["rank"] == rank].sort_values("time", kind="stable")
    # Several changes at one instant (a B frees as the next F allocates) would draw as a
    # zero-width spike: keep the value held after the last of them.
    rows = rows.groupby("time", sort=True, as_index=False).last()
    t = rows["time"].to_numpy(dtype=float)
    b = rows["bytes"].to_numpy(dtype=float)
    if t.size == 0:
        return np.array([0.0, until]), np.array([0.0, 0.0])
    x = np.repeat(np.append(t, max(until, t[-1])), 2)[1:-1]
    y = np.repeat(b, 2)
    if t[0] > 0:  # nothing held before the first change
        x = np.concatenate(([0.0, t[0]], x))
        y = np.concatenate(([0.0, 0.0], y))
    return x, y
