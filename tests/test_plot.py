"""Plots from timeline tables: step choice, closed-form titles, collections, headless rendering, speed.

Hand-built GPipe tables (tests/plot_tables.py) give independent closed forms: makespan
(m + p - 1)(f + b), bubble ratio (p - 1)/(m + p - 1), peak activation m units on every rank.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_rgb

import schedules
from plot_tables import gpipe_memory, gpipe_timeline, measured_steps
from schedules import ScheduleError
from schedules.timeline import memory_frame, timeline_frame
from sim import CostModel, simulate
from sim.plot import plot_compare, plot_memory, plot_overlay, plot_timeline
from sim.metrics import select_step, step_summary
from sim.plot.style import KIND_COLOURS
from sim.plot.units import byte_unit, memory_steps, time_unit

SPLIT = CostModel(forward=1.0, backward_input=1.0, backward_weight=1.0)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]


def box_collections(ax) -> list[PolyCollection]:
    """The PolyCollections holding boxes (zorder 2), not the lane backgrounds (zorder 0)."""
    return [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_zorder() == 2]


def legal(name: str, p: int, m: int, v: int | None = None):
    takes_chunks = schedules.generator(name).chunks is None
    try:
        return schedules.build(name, ranks=p, microbatches=m, chunks=v if takes_chunks else None)
    except ScheduleError:
        return None


# ----------------------------------------------------------------------------- table reading


@pytest.mark.parametrize("p,m,f,b", [(1, 1, 1.0, 2.0), (4, 8, 1.0, 2.0), (3, 5, 0.25, 0.7), (8, 2, 2.0, 1.0)])
def test_summary_matches_gpipe_closed_form(p, m, f, b):
    s = step_summary(gpipe_timeline(p, m, f, b))
    assert (s.ranks, s.microbatches, s.chunks) == (p, m, 1)
    assert s.makespan == pytest.approx((m + p - 1) * (f + b), rel=1e-12)
    assert s.bubble_ratio == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


def test_select_step_takes_lower_median_after_warmup():
    table = measured_steps(2, 3, [9.0, 1.0, 2.0])  # step makespans proportional to 9, 1, 2
    assert select_step(table) == 2  # median of {9, 1, 2}
    assert select_step(table, warmup=1) == 1  # skips step 0; lower median of {1, 2}
    assert select_step(table, step=0) == 0
    with pytest.raises(ScheduleError, match="step 7 is not in the timeline"):
        select_step(table, step=7)
    with pytest.raises(ScheduleError, match="skips all 3"):
        select_step(table, warmup=3)
    assert select_step(gpipe_timeline(2, 2)) == 0  # one step: no warm-up to skip


def test_memory_steps_merge_same_instant_changes():
    memory = memory_frame([(0, 0, 1.0, 10, "sim"), (0, 0, 2.0, 5, "sim"), (0, 0, 2.0, 20, "sim"),
                           (0, 0, 3.0, 0, "sim")])
    x, y = memory_steps(memory, 0, until=4.0)
    assert list(zip(x, y)) == [(0, 0), (1, 0), (1, 10), (2, 10), (2, 20), (3, 20), (3, 0), (4, 0)]
    x, y = memory_steps(memory, 1, until=4.0)  # a rank without rows holds nothing
    assert list(zip(x, y)) == [(0, 0), (4, 0)]


def test_units():
    assert time_unit(33.0) == ("s", 1.0)
    assert time_unit(0.002) == ("ms", 1e3)
    assert time_unit(5e-6) == ("µs", 1e6)
    assert byte_unit(3 * 2**30) == ("GiB", 2.0**30)
    assert byte_unit(1500) == ("KiB", 1024.0)
    assert byte_unit(10) == ("bytes", 1.0)


# ----------------------------------------------------------------------------- figures


def test_timeline_boxes_are_one_collection_with_kind_colours_and_labels(tmp_path):
    p, m = 4, 8
    table = gpipe_timeline(p, m)
    fig = plot_timeline(table, name="gpipe", path=tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG_MAGIC
    ax = fig.axes[0]
    [boxes] = box_collections(ax)
    compute = table[table["kind"].isin(["F", "B"])]
    assert len(boxes.get_paths()) == len(compute) == 2 * p * m
    faces = boxes.get_facecolors()[:, :3]
    expected = np.array([to_rgb(KIND_COLOURS[k]) for k in compute["kind"]])
    assert np.allclose(faces, expected)
    labels = sorted(int(t.get_text()) for t in ax.texts)
    assert labels == sorted(compute["microbatch"])  # every box is wide enough at p=4, m=8
    title = ax.get_title()
    assert "gpipe" in title and "p=4, m=8, v=1" in title
    assert f"bubble {100 * (p - 1) / (m + p - 1):.1f}%" in title
    assert ax.get_xlabel() == "time (s)"
    assert ax.get_xlim() == pytest.approx((0.0, (m + p - 1) * 3.0))
    assert fig.legends and {t.get_text() for t in fig.legends[0].get_texts()} >= {"F forward"}


def test_later_chunks_are_lighter_shades_of_the_same_kind():
    rows = [(0, 0, 0, 0, 0, "F", "0F0", 0.0, 1.0, -1, "sim"), (0, 0, 1, 1, 0, "F", "1F0", 1.0, 2.0, -1, "sim")]
    fig = plot_timeline(timeline_frame(rows))
    [boxes] = box_collections(fig.axes[0])
    dark, light = boxes.get_facecolors()[:, :3]
    assert np.allclose(dark, to_rgb(KIND_COLOURS["F"]))
    assert np.all(light >= dark) and np.any(light > dark)


def test_memory_panel_marks_each_ranks_peak():
    p, m = 3, 4
    fig = plot_timeline(gpipe_timeline(p, m), gpipe_memory(p, m, unit=1000), unit_bytes=1000.0,
                        unit_label="microbatch units")
    memory_ax = fig.axes[1]
    [curves] = [c for c in memory_ax.collections if isinstance(c, LineCollection)]
    assert len(curves.get_segments()) == p
    peaks = memory_ax.collections[-1].get_offsets()
    assert np.allclose(peaks[:, 1], m)  # GPipe holds every microbatch: m units on each rank
    assert np.allclose(peaks[:, 0], [r + m - 1 for r in range(p)])  # reached when the last F starts
    assert memory_ax.get_xlim() == fig.axes[0].get_xlim()


def test_one_rank_plots_with_zero_bubble():
    fig = plot_timeline(gpipe_timeline(1, 3), gpipe_memory(1, 3))
    assert "bubble 0.0%" in fig.axes[0].get_title()


def test_64_ranks_by_256_microbatches_draw_in_seconds(tmp_path):
    table = gpipe_timeline(64, 256)
    # Give every transfer a visible length so that the comm lanes hold ~64,000 boxes too.
    sends, recvs = table["kind"].str.startswith("SEND"), table["kind"].str.startswith("RECV")
    table.loc[sends, "end"] += 0.5
    table.loc[recvs, "start"] -= 0.5
    started = time.perf_counter()
    fig = plot_timeline(table, gpipe_memory(64, 256), comm=True, path=tmp_path / "big.png")
    elapsed = time.perf_counter() - started
    assert elapsed < 10.0, f"took {elapsed:.1f} s"
    ax = fig.axes[0]
    boxes = box_collections(ax)
    assert len(boxes) == 3  # compute, send lane, recv lane: not one artist per box
    assert sum(len(c.get_paths()) for c in boxes) == len(table) == 64 * 256 * 2 + 4 * 63 * 256
    assert not ax.texts  # boxes a few pixels wide get no labels
    assert (tmp_path / "big.png").read_bytes()[:8] == PNG_MAGIC


def test_compare_shares_the_time_axis():
    tables = {"short": gpipe_timeline(4, 4), "long": gpipe_timeline(2, 16)}
    fig = plot_compare(tables, note="costs")
    gantt = [ax for ax in fig.axes if box_collections(ax)]
    assert len(gantt) == 2
    span = max(step_summary(t).makespan for t in tables.values())
    assert all(ax.get_xlim() == pytest.approx((0.0, span)) for ax in gantt)
    assert [ax.get_title(loc="left").split("  ·  ")[0] for ax in gantt] == ["short", "long"]


def test_memory_figure_shares_axes_across_schedules():
    memories = {"m4": gpipe_memory(2, 4, unit=10), "m8": gpipe_memory(2, 8, unit=10)}
    timelines = {"m4": gpipe_timeline(2, 4), "m8": gpipe_timeline(2, 8)}
    fig = plot_memory(memories, timelines, unit_bytes={"m4": 10.0, "m8": 10.0}, unit_label="microbatch units")
    assert len(fig.axes) == 2
    assert fig.axes[0].get_ylim() == fig.axes[1].get_ylim()
    assert fig.axes[0].get_ylim()[1] >= 8
    with pytest.raises(ScheduleError, match="no timeline"):
        plot_memory(memories, {"m4": timelines["m4"]})


def test_overlay_reports_signed_makespan_error():
    measured = measured_steps(4, 8, [1.3, 1.1, 1.0, 1.2])
    simulated = gpipe_timeline(4, 8)
    # Default: the median step, each action's median start and end. Every time of step k is
    # the GPipe closed form times its factor, so the median step is the closed form times the
    # median factor, (1.1 + 1.2) / 2 = 1.15: makespan 33 x 1.15 = 37.95 s.
    fig = plot_overlay(measured, simulated, name="gpipe")
    title = fig.axes[0].get_title()
    error = (33.0 - 33.0 * 1.15) / (33.0 * 1.15)
    assert "median of 4 steps" in title and f"error {100 * error:+.1f}%" in title and "37.95 s" in title
    [measured_boxes, simulated_boxes] = box_collections(fig.axes[0])
    assert len(measured_boxes.get_paths()) == len(simulated_boxes.get_paths()) == 2 * 4 * 8
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "measured makespan" in legend and "simulated makespan" in legend
    assert not any("half" in text for text in legend)
    fig = plot_overlay(measured, simulated, step=1)
    error = (33.0 - 33.0 * 1.1) / (33.0 * 1.1)
    assert "step 1" in fig.axes[0].get_title() and f"error {100 * error:+.1f}%" in fig.axes[0].get_title()
    fig = plot_overlay(measured, simulated, step=2)
    assert "error +0.0%" in fig.axes[0].get_title()
    # Leaving out the first step (x1.3): the median of 1.1, 1.0, 1.2 is 1.1.
    fig = plot_overlay(measured, simulated, warmup=1)
    assert "median of 3 steps" in fig.axes[0].get_title() and "36.3 s" in fig.axes[0].get_title()


def test_steps_back_to_back_and_median_step_closed_forms():
    from sim.plot.figure import median_step, steps_back_to_back

    factors = [3.0, 1.0, 2.0]
    measured = measured_steps(2, 3, factors)
    one = gpipe_timeline(2, 3)  # makespan (m + p - 1)(f + b) = 12
    kept, joined, _ = steps_back_to_back(measured, None)
    assert kept == 3 and set(joined["step"]) == {0}
    assert joined["end"].max() == pytest.approx(12 * sum(factors))
    # Step 2 (x2) starts after steps 0 and 1: offset 12 x (3 + 1).
    second = joined.iloc[2 * len(one):]
    assert second["start"].min() == pytest.approx(48.0)
    kept, median = median_step(measured)
    assert kept == 3 and median["end"].max() == pytest.approx(12 * 2.0)


def test_comparison_memory_panels_share_one_scale():
    """GPipe holds m = 8 microbatches, 1F1B p = 4: on one scale 1F1B's panel tops out at half."""
    results = {name: simulate(schedules.build(name, ranks=4, microbatches=8), CostModel(forward=1.0, backward_input=2.0))
               for name in ("gpipe", "1f1b")}
    fig = plot_compare({n: r.timeline for n, r in results.items()}, memories={n: r.memory for n, r in results.items()},
                       unit_bytes={n: r.activation_unit_bytes for n, r in results.items()})
    memory_axes = [fig.axes[1], fig.axes[3]]
    assert memory_axes[0].get_ylim() == memory_axes[1].get_ylim()
    assert memory_axes[0].get_ylim()[1] > 8


def test_narrow_boxes_keep_their_microbatch_numbers():
    """Interleaved v = 2 at p = 4, m = 8 among seven schedules: every one of its 4 x 2 x 8 x 2
    compute boxes (half a rank share wide) carries its number, in a smaller font."""
    from sim.plot.gantt import MIN_LABEL_FONT_PT

    costs = CostModel(forward=1.0, backward_input=1.0, backward_weight=1.0)
    names = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "looped-bfs")
    results = {n: simulate(schedules.build_for(n, 4, 8, 2), costs) for n in names}
    fig = plot_compare({n: r.timeline for n, r in results.items()})
    panel = fig.axes[names.index("interleaved")]
    sizes = [t.get_fontsize() for t in panel.texts]
    assert len(sizes) == 4 * 2 * 8 * 2 and min(sizes) >= MIN_LABEL_FONT_PT


def test_tables_missing_columns_are_refused():
    table = gpipe_timeline(2, 2).drop(columns=["chunk"])
    with pytest.raises(ScheduleError, match="missing columns chunk"):
        plot_timeline(table)


# ----------------------------------------------------------------------------- with the simulator


@pytest.mark.parametrize("name", schedules.available())
def test_every_schedule_plots_and_its_title_agrees_with_the_simulator(name, tmp_path):
    schedule = legal(name, 4, 8, 2)
    assert schedule is not None, f"{name} should be legal at p=4, m=8"
    result = simulate(schedule, CostModel(forward=1.0, backward_input=1.0, backward_weight=1.0, p2p_latency=0.1))
    summary = step_summary(result.timeline)
    assert summary.makespan == pytest.approx(result.makespan, rel=1e-12)
    assert summary.bubble_ratio == pytest.approx(result.bubble_ratio, abs=1e-12)
    fig = plot_timeline(result.timeline, result.memory, name=name, comm=True,
                        unit_bytes=result.activation_unit_bytes, path=tmp_path / f"{name}.png")
    assert f"bubble {100 * result.bubble_ratio:.1f}%" in fig.axes[0].get_title()
    one_rank = legal(name, 1, 3, 2)
    if one_rank is not None:
        single = simulate(one_rank, SPLIT)
        plot_timeline(single.timeline, single.memory, name=name, path=tmp_path / f"{name}_1.png")


def test_interleaved_title_shows_the_closed_form_bubble():
    p, m, v = 4, 8, 2
    result = simulate(schedules.build("interleaved", ranks=p, microbatches=m, chunks=v), SPLIT)
    fig = plot_timeline(result.timeline, name="interleaved")
    assert f"p=4, m=8, v=2  ·  bubble {100 * (p - 1) / (v * m + p - 1):.1f}%" in fig.axes[0].get_title()


def test_plotting_never_imports_pyplot(tmp_path):
    code = (
        "import sys; sys.path.insert(0, 'tests'); from plot_tables import gpipe_timeline; "
        "from sim.plot import plot_timeline; import io; plot_timeline(gpipe_timeline(2, 2), path=io.BytesIO()); "
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    env = {"PATH": "", "HOME": str(tmp_path)}  # no DISPLAY, no MPLBACKEND; matplotlib's cache goes to tmp
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_a_comparison_of_every_schedule_with_memory_stays_within_the_height_cap():
    from sim.plot.timeline import MAX_HEIGHT_IN

    costs = CostModel(forward=1.0, backward_input=1.0, backward_weight=1.0)
    names = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "looped-bfs")
    results = {n: simulate(schedules.build_for(n, 4, 8, 2), costs) for n in names}
    fig = plot_compare({n: r.timeline for n, r in results.items()}, memories={n: r.memory for n, r in results.items()})
    assert fig.get_size_inches()[1] <= MAX_HEIGHT_IN
    few = plot_compare({"1f1b": results["1f1b"].timeline})  # one panel keeps its natural height
    assert few.get_size_inches()[1] < MAX_HEIGHT_IN / 2
