"""Action timestamps: host clock on CPU, CUDA events on GPU (read after the step).

Each rank's clock starts at its own step start, taken right after a barrier that all
ranks leave together; so ranks are aligned to within the spread of their barrier exits
(one message latency: tens of microseconds on loopback, a network round trip across
nodes). Rank clocks are not otherwise synchronised.
"""

from __future__ import annotations

import time

import torch


class HostClock:
    """perf_counter_ns stamps; tokens are integers."""

    def __init__(self) -> None:
        self.stamp = time.perf_counter_ns
        self.t0 = 0

    def begin(self) -> None:
        self.t0 = time.perf_counter_ns()

    def finish(self) -> None:
        pass

    def seconds(self, token: int) -> float:
        return (token - self.t0) / 1e9


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


def clock_for(device: torch.device) -> HostClock | CudaClock:
    return CudaClock(device) if device.type == "cuda" else HostClock()
