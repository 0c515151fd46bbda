"""Action timestamps: host clock on CPU, CUDA events on GPU (read after the step).

Each rank times its step's actions from its own step start, taken right after a barrier that
all ranks leave together only in name: where ranks share cores a rank may wait milliseconds
for one before it starts (1-3 ms at p=4 on two cores). On CPU the step start is also kept on
the host's monotonic clock (`HostClock.origin`), which every process of one boot reads alike,
so that ranks on one host are put on that one clock (runtime.record, ``clocks: "host"`` in
summary.json): a row of rank r then starts its origin minus the earliest rank's later. On GPU,
and across hosts, rank clocks stay aligned at the barrier only (``clocks: "rank"``): to within
the spread of the ranks' barrier exits, one message latency on an idle host, a network round
trip across nodes.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import torch

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def host_clock_id() -> str | None:
    """Names the monotonic clock this process reads (host and boot: the processes of one
    boot read one CLOCK_MONOTONIC); None where the platform does not say which boot it is."""
    try:
        return f"{socket.gethostname()}/{BOOT_ID.read_text().strip()}"
    except OSError:
        return None


class HostClock:
    """perf_counter_ns stamps (CLOCK_MONOTONIC on Linux); tokens are integers."""

    def __init__(self) -> None:
        self.stamp = time.perf_counter_ns
        self.t0 = 0

    def begin(self) -> None:
        self.t0 = time.perf_counter_ns()

    def finish(self) -> None:
        pass

    def seconds(self, token: int) -> float:
        return (token - self.t0) / 1e9

    def origin(self) -> int | None:
        """The step's start in nanoseconds of the host's monotonic clock."""
        return self.t0


class CudaClock:
    """CUDA events on the current stream; tokens are events, resolved after `finish`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pool: list[torch.cuda.Event] = []
        self._next = 0
        self.t0: torch.cuda.Event | None = None

    def stamp(self) -> torch.cuda.Event:
        if self._next == len(self._pool):
            self._pool.append(torch.cuda.Event(enable_timing=True))
        event = self._pool[self._next]
        self._next += 1
        event.record()
        return event

    def begin(self) -> None:
        self._next = 0  # events of the previous step were resolved before this one began
        self.t0 = self.stamp()

    def finish(self) -> None:
        torch.cuda.synchronize(self.device)

    def seconds(self, token: torch.cuda.Event) -> float:
        return self.t0.elapsed_time(token) / 1e3

    def origin(self) -> int | None:
        """None: an event's time is known only relative to another event of its device."""
        return None


def clock_for(device: torch.device) -> HostClock | CudaClock:
    return CudaClock(device) if device.type == "cuda" else HostClock()
