"""`python -m sim plot` and `python -m sim figures`: outputs, measured run directories, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import schedules
from plot_tables import gpipe_memory, measured_steps
from schedules import ScheduleError
from schedules.io import save_json
from sim.__main__ import main
from sim.plot.readme import SPLIT_COSTS, legal_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]


def make_run(root: Path, factors=(9.0, 1.0, 2.0), p: int = 2, m: int = 3) -> Path:
    """A run directory as the executor writes it, from hand-built GPipe steps."""
    root.mkdir(parents=True, exist_ok=True)
    measured_steps(p, m, factors).to_csv(root / "timeline.csv", index=False)
    memory = pd.concat([gpipe_memory(p, m, k, 2 * k, step=s, source="measured") for s, k in enumerate(factors)])
    memory.to_csv(root / "memory.csv", index=False)
    info = {"schedule": "gpipe", "ranks": p, "microbatches": m, "chunks": 1, "warmup": 2}  # unrecorded steps
    (root / "summary.json").write_text(json.dumps(info))
    save_json(schedules.lower(schedules.build("gpipe", ranks=p, microbatches=m)), root / "program.json")
    return root


def fails(capsys, argv, message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sim plot: error: ")
    assert message in err


def test_schedule_with_memory_trace_and_comm_lanes(tmp_path, capsys):
    png, trace = tmp_path / "timeline.png", tmp_path / "trace.json"
    argv = ["plot", "--schedule", "interleaved", "--ranks", "4", "--microbatches", "8", "--chunks", "2",
            "-o", str(png), "--memory", "--trace", str(trace), "--comm", "--comm-latency", "0.1"]
    assert main(argv) == 0
    assert capsys.readouterr().out.split() == [str(png), str(trace)]
    assert png.read_bytes()[:8] == PNG_MAGIC
    events = json.loads(trace.read_text())["traceEvents"]
    kinds = {e["cat"] for e in events if e["ph"] == "X"}
    assert kinds == {"F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}
    # 4 ranks x 2 chunks x 8 microbatches x (F, B) compute slices
    assert sum(1 for e in events if e["ph"] == "X" and e["cat"] in ("F", "B")) == 4 * 2 * 8 * 2
    assert any(e["ph"] == "C" for e in events) and any(e["ph"] == "s" for e in events)


def test_compare_with_memory_and_cost_flags(tmp_path):
    png = tmp_path / "cmp.png"
    argv = ["plot", "--compare", "gpipe,1f1b,interleaved", "-o", str(png), "--memory",
            "--forward", "1", "--backward", "1", "--weight", "1"]
    assert main(argv) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC


def _slices(trace: Path) -> dict[str, set[float]]:
    """Durations (microseconds) of the trace's slices, by kind."""
    out: dict[str, set[float]] = {}
    for e in json.loads(trace.read_text())["traceEvents"]:
        if e["ph"] == "X":
            out.setdefault(e["cat"], set()).add(round(e["dur"], 6))
    return out


def test_cost_flags_and_cost_files_set_what_is_plotted(tmp_path, capsys):
    """Each cost flag reaches the picture: the traced slices last what the flags say (zero
    bubble, so F, I and W each show), a cost file gives the same, and the default differs."""
    base = ["plot", "--schedule", "zb-h1", "--ranks", "2", "--microbatches", "2"]
    flags = ["--forward", "0.5", "--backward", "3", "--weight", "1.5", "--comm-latency", "0.25"]
    assert main([*base, "-o", str(tmp_path / "a.png"), "--trace", str(tmp_path / "a.json"), *flags]) == 0
    slices = _slices(tmp_path / "a.json")
    assert (slices["F"], slices["I"], slices["W"]) == ({0.5e6}, {3e6}, {1.5e6})
    assert slices["SEND_F"] == slices["SEND_B"] == {0.25e6}
    from sim import CostModel

    CostModel(forward=0.5, backward_input=3, backward_weight=1.5, p2p_latency=0.25).to_json(tmp_path / "c.json")
    assert main([*base, "-o", str(tmp_path / "b.png"), "--trace", str(tmp_path / "b.json"),
                 "--costs", str(tmp_path / "c.json")]) == 0
    assert _slices(tmp_path / "b.json") == slices
    assert (tmp_path / "b.png").read_bytes() == (tmp_path / "a.png").read_bytes()
    assert main([*base, "-o", str(tmp_path / "d.png"), "--trace", str(tmp_path / "d.json")]) == 0
    default = _slices(tmp_path / "d.json")
    # The defaults (sim.sources.DEFAULT_COSTS, README "Simulating"): F = I = W = 1 s.
    assert (default["F"], default["I"], default["W"]) == ({1e6}, {1e6}, {1e6})
    assert (tmp_path / "d.png").read_bytes() != (tmp_path / "a.png").read_bytes()
    # --compare has no trace: the image itself must change with a flag.
    panels = ["plot", "--compare", "gpipe,1f1b"]
    assert main([*panels, "-o", str(tmp_path / "e.png")]) == 0
    assert main([*panels, "-o", str(tmp_path / "f.png"), "--forward", "3"]) == 0
    assert (tmp_path / "e.png").read_bytes() != (tmp_path / "f.png").read_bytes()
    capsys.readouterr()


def test_measured_run_plots_overlays_and_traces_the_median_step(tmp_path):
    run = make_run(tmp_path / "run")
    png, trace = tmp_path / "run.png", tmp_path / "run.json"
    assert main(["plot", "--run", str(run), "-o", str(png), "--memory", "--comm", "--trace", str(trace)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert json.loads(trace.read_text())["otherData"]["step"] == 2  # makespans 9, 1, 2 x: the median
    assert main(["plot", "--run", str(run), "-o", str(png), "--overlay", "--backward", "2"]) == 0
    assert main(["plot", "--run", str(run), "-o", str(png), "--step", "0", "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())["otherData"]["step"] == 0
    assert main(["plot", "--run", str(run), "-o", str(png), "--warmup", "1", "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())["otherData"]["step"] == 1  # lower median of steps 1, 2


def test_run_directory_errors_are_one_line(tmp_path, capsys):
    png = str(tmp_path / "x.png")
    fails(capsys, ["plot", "--run", str(tmp_path / "absent"), "-o", png], "does not exist")

    no_memory = make_run(tmp_path / "no_memory")
    (no_memory / "memory.csv").unlink()
    fails(capsys, ["plot", "--run", str(no_memory), "-o", png], "lacks memory.csv")

    truncated = make_run(tmp_path / "truncated")
    text = (truncated / "timeline.csv").read_text()
    (truncated / "timeline.csv").write_text(text[: len(text) // 2].rsplit(",", 3)[0] + "\n")
    fails(capsys, ["plot", "--run", str(truncated), "-o", png], "timeline.csv")

    empty = make_run(tmp_path / "empty")
    (empty / "timeline.csv").write_text("")
    fails(capsys, ["plot", "--run", str(empty), "-o", png], "timeline")

    wrong_columns = make_run(tmp_path / "wrong_columns")
    (wrong_columns / "memory.csv").write_text("a,b\n1,2\n")
    fails(capsys, ["plot", "--run", str(wrong_columns), "-o", png], "missing columns")

    bad_summary = make_run(tmp_path / "bad_summary")
    (bad_summary / "summary.json").write_text("{not json")
    fails(capsys, ["plot", "--run", str(bad_summary), "-o", png], "summary.json is not valid JSON")

    no_program = make_run(tmp_path / "no_program")
    (no_program / "program.json").unlink()
    fails(capsys, ["plot", "--run", str(no_program), "-o", png, "--overlay"], "lacks program.json")

    fails(capsys, ["plot", "--run", str(no_program), "-o", png, "--step", "9"], "step 9 is not in the timeline")


def test_bad_arguments_are_one_line(tmp_path, capsys):
    png = str(tmp_path / "x.png")
    fails(capsys, ["plot", "--schedule", "nope", "-o", png], "unknown schedule 'nope'")
    fails(capsys, ["plot", "--schedule", "1f1b", "--chunks", "2", "-o", png], "chunks=2")
    fails(capsys, ["plot", "--compare", "gpipe,1f1b", "--trace", "t.json", "-o", png], "--trace")
    fails(capsys, ["plot", "--schedule", "gpipe", "--step", "1", "-o", png], "measured run")
    fails(capsys, ["plot", "--schedule", "gpipe", "--costs", str(tmp_path / "none.json"), "-o", png], "none.json")
    fails(capsys, ["plot", "--schedule", "gpipe", "--forward", "-1", "-o", png], "forward")
    fails(capsys, ["plot", "--schedule", "gpipe", "-o", str(tmp_path / "no" / "dir.png")], "No such file")
    with pytest.raises(SystemExit) as stop:
        main(["plot", "-o", png])  # no source: argparse's own error
    assert stop.value.code == 2
    assert "one of the arguments --schedule --compare --run --sweep is required" in capsys.readouterr().err


def test_figures_regenerates_every_readme_figure(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path)]) == 0
    written = [Path(line) for line in capsys.readouterr().out.split()]
    assert [p.name for p in written] == ["compare_p4_m8.png", "memory_p4_m8.png", "interleaved_comm_p4_m8.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written)
    legal = []
    for name in schedules.available():
        takes_chunks = schedules.generator(name).chunks is None
        try:
            schedules.build(name, ranks=4, microbatches=8, chunks=2 if takes_chunks else None)
        except ScheduleError:
            continue
        legal.append(name)
    assert list(legal_results(SPLIT_COSTS)) == legal
    assert {"gpipe", "1f1b", "interleaved"} <= set(legal)


def test_python_dash_m_sim_plot_runs_headless(tmp_path):
    env = {"PATH": "", "HOME": str(tmp_path)}  # no DISPLAY, no MPLBACKEND
    done = subprocess.run(
        [sys.executable, "-m", "sim", "plot", "--schedule", "1f1b", "-o", str(tmp_path / "t.png")],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG_MAGIC


def test_output_is_written_exactly_where_asked(tmp_path, capsys):
    """-o names the file: no extension gives a PNG at that very path (matplotlib alone would add
    ".png"), an extension picks the format, an unknown one is refused before drawing."""
    bare = tmp_path / "timeline"
    assert main(["plot", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "-o", str(bare)]) == 0
    assert capsys.readouterr().out.split() == [str(bare)]
    assert bare.read_bytes()[:8] == PNG_MAGIC and not (tmp_path / "timeline.png").exists()
    svg = tmp_path / "timeline.SVG"
    assert main(["plot", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "-o", str(svg)]) == 0
    assert capsys.readouterr().out.split() == [str(svg)]
    assert b"<svg" in svg.read_bytes()[:400]
    fails(capsys, ["plot", "--schedule", "1f1b", "-o", str(tmp_path / "x.nope")], "unknown image format .nope")
    assert not (tmp_path / "x.nope").exists()


@pytest.mark.parametrize("extra,message", [
    (["--overlay", "--memory"], "--overlay draws compute only: drop --memory"),
    (["--overlay", "--comm"], "--overlay draws compute only: drop --comm"),
    (["--forward", "2"], "--forward only cost the simulation that --overlay draws"),
    (["--ranks", "4"], "a run is drawn at its own sizes: drop --ranks"),
])
def test_options_a_run_plot_would_ignore_are_refused(tmp_path, capsys, extra, message):
    run = make_run(tmp_path / "run")
    fails(capsys, ["plot", "--run", str(run), "-o", str(tmp_path / "x.png"), *extra], message)


def test_trace_counters_are_units_without_sizes_and_bytes_with_them(tmp_path, capsys):
    """GPipe's ranks each hold all m microbatches at the peak: m units, or m x the bytes given."""
    png, trace = tmp_path / "g.png", tmp_path / "g.json"
    base = ["plot", "--schedule", "gpipe", "--ranks", "2", "--microbatches", "3", "-o", str(png), "--trace", str(trace)]
    assert main(base) == 0
    counters = [e["args"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "C"]
    assert max(a["microbatch units"] for a in counters) == 3 and not any("bytes" in a for a in counters)
    assert main([*base, "--activation-bytes", "500"]) == 0
    counters = [e["args"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "C"]
    assert max(a["bytes"] for a in counters) == 3 * 500


def test_sweep_table_is_drawn_and_its_options_checked(tmp_path, capsys):
    table = tmp_path / "sweep.csv"
    assert main(["sweep", "--schedules", "1f1b,interleaved", "--ranks", "2", "--microbatches", "2,4",
                 "--chunks", "2", "--out", str(table), "--no-progress"]) == 0
    png = tmp_path / "sweep.png"
    capsys.readouterr()
    assert main(["plot", "--sweep", str(table), "-o", str(png)]) == 0
    assert capsys.readouterr().out.split() == [str(png)] and png.read_bytes()[:8] == PNG_MAGIC
    fails(capsys, ["plot", "--sweep", str(table), "-o", str(png), "--ranks", "4"], "--sweep draws the table as it is")
    not_a_sweep = tmp_path / "other.csv"
    not_a_sweep.write_text("a,b\n1,2\n")
    fails(capsys, ["plot", "--sweep", str(not_a_sweep), "-o", str(png)], "not a sweep table")


def test_a_run_drawn_with_every_step_and_the_overlay_of_the_median_step(tmp_path, capsys):
    run = make_run(tmp_path / "run")  # 3 GPipe steps, p=2, m=3, costs x9, x1, x2
    png, trace = tmp_path / "all.png", tmp_path / "all.json"
    assert main(["plot", "--run", str(run), "--step", "all", "-o", str(png), "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e["cat"] in ("F", "B")]
    assert len(slices) == 3 * 2 * 3 * 2  # every step: steps x ranks x microbatches x (F, B)
    # Back to back: the last B ends after all three makespans, (m + p - 1)(f + b) x (9 + 1 + 2).
    assert max(e["ts"] + e["dur"] for e in slices) == pytest.approx(4 * 3.0 * 12 * 1e6)
    fails(capsys, ["plot", "--run", str(run), "--step", "all", "--overlay", "-o", str(png)], "--overlay compares one step")
    with pytest.raises(SystemExit) as stop:  # argparse's own error
        main(["plot", "--run", str(run), "--step", "x", "-o", str(png)])
    assert stop.value.code == 2 and "expected a step number or 'all'" in capsys.readouterr().err


def test_compare_skips_a_schedule_that_cannot_run_as_sim_compare_does(tmp_path, capsys):
    png = tmp_path / "c.png"
    assert main(["plot", "--compare", "interleaved,1f1b", "--microbatches", "5", "-o", str(png)]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(png)] and "sim plot: skipping interleaved: " in captured.err
    fails(capsys, ["plot", "--compare", "interleaved", "--microbatches", "5", "-o", str(png)],
          "no schedule can run at these sizes")
    fails(capsys, ["plot", "--compare", "1f1b,nope", "-o", str(png)], "unknown schedule 'nope'")
