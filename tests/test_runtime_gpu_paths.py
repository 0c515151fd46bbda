"""What the executor does differently on a GPU, tested on the CPU where it can be.

- NCCL: receives are consumed stream-ordered (a wait with a timeout would block the host,
  polling every millisecond) and every transfer is checked against the timeout at the
  step's end. The logic runs here on stand-in work objects.
- The layer profile's batch is a device copy on a GPU; it must not count as activations
  (a copy made with .clone() stands in for .to("cuda")).
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch

from runtime import ModelSpec, build_model
from runtime.comm import Transport
from runtime.errors import PeerError
from runtime.profile import _profile_stage

torch.set_num_threads(1)


class FakeWork:
    """A posted transfer that completes after `polls` calls of is_completed (never if None)."""

    def __init__(self, polls: int | None):
        self.polls = polls
        self.waits: list = []

    def is_completed(self) -> bool:
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0

    def wait(self, timeout=None) -> bool:
        self.waits.append(timeout)
        return True


def transport(stream_ordered: bool, timeout: float = 0.2) -> Transport:
    """A Transport's waiting part alone (its groups need a process group, its waits do not)."""
    t = Transport.__new__(Transport)
    t.rank, t.timeout, t.stream_ordered, t._consumed = 3, timeout, stream_ordered, []
    t._delta = datetime.timedelta(seconds=timeout)
    return t


def test_nccl_consumes_receives_without_blocking_and_settles_them_at_the_step_end():
    t = transport(stream_ordered=True)
    recv, send = FakeWork(polls=5), FakeWork(polls=2)
    t.consume(recv, "1RECV_F0", 2)
    assert recv.waits == [None]  # no timeout: only the current stream waits
    t.settle([(send, "0SEND_F0", 4)])
    assert send.waits == [None] and recv.waits == [None, None]
    assert recv.polls < 0 and send.polls < 0  # polled until complete
    t.settle([])  # the consumed receive was settled once, not again
    assert recv.waits == [None, None]


def test_nccl_settle_names_a_transfer_that_never_completes():
    t = transport(stream_ordered=True, timeout=0.05)
    t.consume(FakeWork(polls=None), "1RECV_B2", 2)
    start = time.monotonic()
    with pytest.raises(PeerError, match=r"rank 3: gave up on 1RECV_B2 \(peer rank 2\): nothing arrived within the 0.05 s"):
        t.settle([(FakeWork(polls=0), "1SEND_F3", 2)])
    assert time.monotonic() - start < 5


class BrokenWork(FakeWork):
    """A transfer whose communicator failed: NCCL raises from wait and is_completed."""

    def wait(self, timeout=None) -> bool:
        raise RuntimeError("NCCL communicator was aborted on rank 2: remote process exited or there was a network error")

    def is_completed(self) -> bool:
        raise RuntimeError("NCCL error: unhandled system error, NCCL version 2.21.5: connection closed by peer")


def test_nccl_failures_become_one_line_peer_errors():
    t = transport(stream_ordered=True)
    with pytest.raises(PeerError, match=r"rank 3: gave up on 1RECV_F0 \(peer rank 2\): NCCL communicator was aborted"):
        t.consume(BrokenWork(polls=0), "1RECV_F0", 2)
    with pytest.raises(PeerError, match=r"gave up on 0SEND_F1 \(peer rank 4\): rank 4 closed the connection"):
        t.settle([(BrokenWork(polls=0), "0SEND_F1", 4)])


def test_gloo_waits_on_the_host_with_the_timeout():
    t = transport(stream_ordered=False)
    recv, send = FakeWork(polls=0), FakeWork(polls=0)
    t.consume(recv, "1RECV_F0", 2)
    t.settle([(send, "0SEND_F0", 4)])
    assert recv.waits == [t._delta] and send.waits == [t._delta] and t._consumed == []


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_profile_does_not_count_a_device_copy_of_the_batch(model):
    spec = ModelSpec(model=model, layers=2, hidden=16, heads=2, seq_len=4, vocab=32, batch_size=8)
    m = build_model(spec)
    rows = 4
    on_cpu = _profile_stage(m, range(2), True, True, m.inputs[:rows], m.targets[:rows], rows,
                            torch.device("cpu"), False, repeats=1, warmup=0)
    copied = _profile_stage(m, range(2), True, True, m.inputs[:rows].clone(), m.targets[:rows].clone(), rows,
                            torch.device("cpu"), False, repeats=1, warmup=0)
    assert on_cpu["activation_bytes"] > 0
    assert copied["activation_bytes"] == on_cpu["activation_bytes"]
