"""Colours and labels shared by every plot: Okabe-Ito kinds, chunk shades, rank colours, memory units.

The Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008) stays distinct under
the common colour-vision deficiencies; later chunks of a rank are lighter shades of the
same hue, so kind is read from hue and chunk from lightness.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import to_rgb

OKABE_ITO = {
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
    "black": "#000000",
}

KIND_COLOURS = {
    "F": OKABE_ITO["blue"],
    "B": OKABE_ITO["orange"],
    "I": OKABE_ITO["vermillion"],
    "W": OKABE_ITO["bluish_green"],
}
KIND_LABELS = {
    "F": "F forward",
    "B": "B backward (input + weights)",
    "I": "I backward (input grad)",
    "W": "W backward (weight grad)",
}
SEND_COLOUR = "#4D4D4D"
RECV_COLOUR = "#B3B3B3"
LANE_COLOUR = "#F2F2F2"

# Rank colours for memory curves: Okabe-Ito without yellow (too light on white).
RANK_COLOURS = [OKABE_ITO[k] for k in ("blue", "orange", "bluish_green", "vermillion",
                                       "reddish_purple", "sky_blue", "black")]

# Simulated memory is drawn in units of one microbatch's activations of one rank's share
# (sim.result.SimResult.activation_unit_bytes); these name that unit on axes and in notes.
MEMORY_UNIT_LABEL = "microbatch units"
MEMORY_UNIT_NOTE = "memory unit: one microbatch's activations of one rank's share"

MAX_LIGHTEN = 0.6  # the last chunk keeps 40% of the hue: light, but not white


def shade(colour: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """`colour` mixed with white: chunk 0 is the full colour, the last chunk the lightest."""
    rgb = np.asarray(to_rgb(colour))
    if chunks <= 1:
        return tuple(rgb)
    mix = MAX_LIGHTEN * chunk / (chunks - 1)
    return tuple(rgb + (1.0 - rgb) * mix)


def colour_table(chunks: int) -> dict[tuple[str, int], tuple[float, float, float]]:
    """Face colour of every (kind, chunk) for a schedule with `chunks` stages per rank."""
    return {(kind, c): shade(colour, c, chunks) for kind, colour in KIND_COLOURS.items() for c in range(chunks)}


def text_colour(rgb: tuple[float, float, float]) -> str:
    """Black or white, whichever reads better on `rgb` (WCAG relative luminance)."""
    channel = np.asarray(rgb)
    linear = np.where(channel <= 0.03928, channel / 12.92, ((channel + 0.055) / 1.055) ** 2.4)
    luminance = float(linear @ np.array([0.2126, 0.7152, 0.0722]))
    return "black" if luminance > 0.179 else "white"  # equal contrast point


def rank_colour(rank: int, ranks: int):
    """Line colour for `rank`: Okabe-Ito for a few ranks, viridis beyond."""
    if ranks <= len(RANK_COLOURS):
        return RANK_COLOURS[rank]
    from matplotlib import colormaps

    return colormaps["viridis"](rank / max(ranks - 1, 1))
