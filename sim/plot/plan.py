"""The plan's figure: step time against memory per GPU for every simulated configuration that fits.

Schedules get one colour each, the winner a star, the memory cap a dashed line. (Plotting
lives here until sim/plot/ takes it.)
"""

from __future__ import annotations

from pathlib import Path

from ..planner.search import Plan

GB = 1e9


def plot_plan(plan: Plan, path: str | Path) -> None:
    """Write the figure to `path` (any matplotlib format)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = plan.evaluated
    names = sorted({ev.config.schedule for ev in evaluated})
    colours = dict(zip(names, plt.get_cmap("tab10").colors))
    fig, ax = plt.subplots(figsize=(10, 5))
    for name in names:
        points = [ev for ev in evaluated if ev.config.schedule == name]
        ax.scatter([ev.memory_per_gpu / GB for ev in points], [ev.step_time for ev in points], s=14, alpha=0.7,
                   color=colours[name], label=f"{name} ({len(points)})", linewidths=0)
    best = plan.best
    ax.scatter([best.memory_per_gpu / GB], [best.step_time], marker="*", s=260, color="black", zorder=5,
               label="chosen:\n" + best.config.describe().replace(" b=", "\nb="))
    cap = plan.request.cap
    if cap != float("inf"):
        ax.axvline(cap / GB, color="grey", linestyle="--", linewidth=1)
        ax.text(cap / GB, ax.get_ylim()[0], "memory cap ", va="bottom", ha="right", fontsize=8, color="grey")
    r = plan.request
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{r.model.name} on {r.cluster.gpus} x {r.cluster.gpu.name}, global batch {r.global_batch}: "
                 f"{len(evaluated)} configurations that fit", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
