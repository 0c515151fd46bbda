"""What the host gives its ranks: the cores this process may run on and how many ranks
torchrun started on the host. Recorded with every run (summary.json's ``cpu_cores`` and
``local_world_size``: the simulator shares the cores among the ranks) and read by the layer
profile, which lets ranks that share cores take turns."""

from __future__ import annotations

import os


def cores() -> int:
    """The cores this process may run on (its affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def local_world_size(default: int) -> int:
    """Ranks on this host (torchrun's LOCAL_WORLD_SIZE; `default` when not launched by it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", default))


def local_rank(default: int) -> int:
    """This rank's number on its host (torchrun's LOCAL_RANK; `default` when not launched by it)."""
    return int(os.environ.get("LOCAL_RANK", default))
