"""The plot wing of sim/: figures and traces drawn from timeline and memory tables.

Above the model (it reads tables, sim.metrics and cost descriptions; it never imports
sim/cli/): `gantt` and `memory` draw on one matplotlib Axes; `timeline`, `memory` and
`overlay` build whole figures (`figure` holds what they share); `style` is colours and
labels; `units` axis units; `trace` the Perfetto export; `sweep` a sweep table's curves;
`readme` the README's figures.
"""

from .memory import plot_memory
from .overlay import plot_overlay
from .figure import rows_height
from .timeline import plot_compare, plot_timeline

__all__ = ["plot_compare", "plot_memory", "plot_overlay", "plot_timeline", "rows_height"]
