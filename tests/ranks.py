"""What the multi-process tests share to start ranks on this machine (imported by test modules)."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env() -> dict:
    """The environment of a launched rank: one thread per rank (two cores are shared by every
    process of the test run), unbuffered output so error lines arrive whole."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
