"""sim.device_memory: peak device memory per rank against closed forms and the engine.

Closed forms (A activation bytes of a stage, b bytes of a sent activation, g of a sent
gradient, p ranks, m >= p microbatches, one stage per rank):
- 1F1B, receives posted at their RECV: rank 0 holds p activations, the m - p sent
  activations whose B is done and one posted gradient receive when it posts the receive
  for its last steady B: p A + (m - p) b + g. The last rank, before its last F, holds
  one activation and m - 1 sent gradients: A + (m - 1) g.
- 1F1B, every receive posted at the step start: rank 0 holds at the start of F(p-1+k)
  p A + k b + (m - k) g, largest at k = 0 or k = m - p.
- GPipe, step posting: rank 0 before its first B holds m A and m posted gradients.
"""

from __future__ import annotations

import itertools

import pytest

import schedules
from sim import CostError, CostModel, simulate
from sim.device_memory import ExecutorMemory, peak_device_memory

A, B_SENT, G_SENT = 1000, 30, 50


def model(memory=A, kept=None, sent=B_SENT, grad=G_SENT, **storages) -> CostModel:
    return CostModel(forward=1.0, backward_input=1.0, backward_weight=1.0, activation_memory=memory,
                     weight_memory=kept, p2p_activation_bytes=sent, p2p_gradient_bytes=grad, **storages)


def moving(program, costs, post_ahead) -> list[int]:
    """Per rank, the non-static part of the peak."""
    executor = ExecutorMemory(weight_bytes=(0,) * program.schedule.num_stages, post_ahead=post_ahead)
    return [d.peak for d in peak_device_memory(program, costs, executor)]


@pytest.mark.parametrize("p,m", list(itertools.product([2, 3, 4], [4, 5, 8])))
def test_1f1b_posted_at_recv(p: int, m: int) -> None:
    peaks = moving(schedules.lower(schedules.build("1f1b", ranks=p, microbatches=m)), model(), 0)
    assert peaks[0] == p * A + (m - p) * B_SENT + G_SENT
    assert peaks[-1] == A + (m - 1) * G_SENT


@pytest.mark.parametrize("p,m", list(itertools.product([2, 3, 4], [4, 5, 8])))
@pytest.mark.parametrize("sent,grad", [(30, 50), (50, 30)])
def test_1f1b_posted_at_step_start(p: int, m: int, sent: int, grad: int) -> None:
    program = schedules.lower(schedules.build("1f1b", ranks=p, microbatches=m))
    peaks = moving(program, model(sent=sent, grad=grad), "step")
    assert peaks[0] == max(p * A + m * grad, p * A + (m - p) * sent + p * grad)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 3)])
def test_gpipe_posted_at_step_start(p: int, m: int) -> None:
    program = schedules.lower(schedules.build("gpipe", ranks=p, microbatches=m))
    assert moving(program, model(), "step")[0] == m * (A + G_SENT)


def test_posting_ahead_holds_more_than_posting_at_the_recv() -> None:
    program = schedules.lower(schedules.build("interleaved", ranks=4, microbatches=8, chunks=2))
    at_recv, one, step = (moving(program, model(), k) for k in (0, 1, "step"))
    assert all(a <= o <= s for a, o, s in zip(at_recv, one, step))
    assert at_recv != step


CASES = [
    (name, p, m, v)
    for name in schedules.available()
    for p, m, v in itertools.product([1, 2, 4], [4, 8], [2, 3])
]


@pytest.mark.parametrize("name,p,m,v", CASES)
@pytest.mark.parametrize("kept_share, shared", [(1 / 3, False), (5 / 3, True)])
def test_activations_alone_match_the_engine(name: str, p: int, m: int, v: int, kept_share: float,
                                            shared: bool) -> None:
    """Without transfer bytes the walk's peak is the engine's peak activation, per rank: with W
    keeping less or more than F saved, and with storages that same-rank handovers share
    (V-shapes and looped placements at p=1)."""
    try:
        schedule = schedules.build(name, ranks=p, microbatches=m, chunks=v)
    except schedules.ScheduleError:
        try:
            schedule = schedules.build(name, ranks=p, microbatches=m)
        except schedules.ScheduleError:
            pytest.skip("not legal at these sizes")
    n = schedule.num_stages
    memory = [1000 + 37 * s for s in range(n)]
    storages = dict(input_memory=[x // 4 for x in memory], input_weight_memory=[x // 4 for x in memory],
                    output_memory=[x // 5 for x in memory]) if shared else {}
    costs = model(memory=memory, kept=[round(x * kept_share) for x in memory], sent=0, grad=0, **storages)
    program = schedules.lower(schedule)
    assert moving(program, costs, 1) == simulate(program, costs).peak_activation_bytes


def test_static_parts_per_rank() -> None:
    program = schedules.lower(schedules.build("interleaved", ranks=2, microbatches=4, chunks=2))
    executor = ExecutorMemory(weight_bytes=(100, 200, 400, 800), batch_bytes=7, optimizer_per_weight_byte=2.0)
    r0, r1 = peak_device_memory(program, model(memory=0, sent=0, grad=0), executor)
    assert (r0.weights, r0.gradients, r0.optimizer, r0.batch, r0.static) == (500, 500, 1000, 7, 2007)
    assert (r1.weights, r1.static) == (1000, 1000 + 1000 + 2000 + 7)
    assert r0.peak == r0.static and r0.activations == r0.receive_buffers == r0.send_buffers == 0


def test_one_rank_with_several_stages_hands_gradients_over_in_memory() -> None:
    """p=1, v=2 GPipe-like order: both stages' F, then B of stage 1 hands each gradient to
    stage 0 on the same rank; the handed-over gradients wait for stage 0's backward."""
    program = schedules.lower(schedules.build("looped-bfs", ranks=1, microbatches=3, chunks=2))
    (only,) = peak_device_memory(program, model(memory=[10, 20], sent=0, grad=4), ExecutorMemory((0, 0)))
    # After F of both stages: 3 x (10 + 20); each B of stage 1 then frees 20 and hands 4 over.
    assert (only.activations, only.receive_buffers, only.send_buffers) == (90, 0, 0)
    assert only.peak == 90
    # With gradients larger than stage 1's activations, the hand-overs make the peak: after
    # the three B of stage 1, 3 x 10 activations and 3 x 50 gradients wait for stage 0.
    (only,) = peak_device_memory(program, model(memory=[10, 1], sent=0, grad=50), ExecutorMemory((0, 0)))
    assert (only.activations, only.receive_buffers, only.send_buffers) == (30, 0, 150)


def test_weight_bytes_must_cover_every_stage() -> None:
    program = schedules.lower(schedules.build("1f1b", ranks=2, microbatches=2))
    with pytest.raises(CostError, match="weight_bytes lists 3 stages, the program has 2"):
        peak_device_memory(program, model(), ExecutorMemory((1, 2, 3)))
