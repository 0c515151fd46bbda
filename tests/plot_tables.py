"""Hand-built timeline and memory tables with known closed forms, for the plot and trace tests.

GPipe without communication delay: F of microbatch j on rank r runs in [(r + j) f, (r + j + 1) f];
the backward phase starts at T0 = (m + p - 1) f and B of microbatch j on rank r runs in
[T0 + (p - 1 - r + j) b, ... + b]. Makespan (m + p - 1)(f + b), bubble ratio (p - 1)/(m + p - 1).
Transfers are zero-length: SEND at the producer's end, RECV at the consumer's start.
"""

from __future__ import annotations

from schedules.timeline import memory_frame, timeline_frame


def gpipe_rows(p: int, m: int, f: float, b: float, *, comm: bool = True, step: int = 0, source: str = "sim"):
    rows = []
    t0 = (m + p - 1) * f
    for r in range(p):
        for j in range(m):
            fs = (r + j) * f
            if comm and r > 0:
                rows.append((step, r, r, 0, j, "RECV_F", f"{r}RECV_F{j}", fs, fs, r - 1, source))
            rows.append((step, r, r, 0, j, "F", f"{r}F{j}", fs, fs + f, -1, source))
            if comm and r < p - 1:
                rows.append((step, r, r, 0, j, "SEND_F", f"{r}SEND_F{j}", fs + f, fs + f, r + 1, source))
        for j in range(m):
            bs = t0 + (p - 1 - r + j) * b
            if comm and r < p - 1:
                rows.append((step, r, r, 0, j, "RECV_B", f"{r}RECV_B{j}", bs, bs, r + 1, source))
            rows.append((step, r, r, 0, j, "B", f"{r}B{j}", bs, bs + b, -1, source))
            if comm and r > 0:
                rows.append((step, r, r, 0, j, "SEND_B", f"{r}SEND_B{j}", bs + b, bs + b, r - 1, source))
    return rows


def gpipe_timeline(p: int, m: int, f: float = 1.0, b: float = 2.0, **kw):
    return timeline_frame(gpipe_rows(p, m, f, b, **kw))


def gpipe_memory(p: int, m: int, f: float = 1.0, b: float = 2.0, *, unit: int = 1000, step: int = 0,
                 source: str = "sim"):
    """Each F holds `unit` bytes from its start until its B ends: peak m * unit on every rank."""
    t0 = (m + p - 1) * f
    events = []
    for r in range(p):
        for j in range(m):
            events.append((r, (r + j) * f, unit))
            events.append((r, t0 + (p - r + j) * b, -unit))
    rows = []
    for r in range(p):
        held = 0
        for _, t, delta in sorted(e for e in events if e[0] == r):
            held += delta
            rows.append((step, r, t, held, source))
    return memory_frame(rows)


def measured_steps(p: int, m: int, factors, f: float = 1.0, b: float = 2.0):
    """A 'measured' table with one step per factor, each step's costs scaled by it."""
    rows = []
    for step, k in enumerate(factors):
        rows += gpipe_rows(p, m, f * k, b * k, step=step, source="measured")
    return timeline_frame(rows)
