"""Published numbers of the zero-bubble paper, for checks against this simulator.

Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241v1):
the profiled T_F, T_B (input-gradient part), T_W and T_comm per setting (milliseconds,
Appendix D, Table 9, measured while running ZB-2p on A100s) and the bubble rates the
paper computes from them (Sec. 5.3, Table 5). Bubble rate = (cost - m(T_F+T_B+T_W)) /
cost with cost the longest stage span, i.e. `SimResult.bubble_ratio_rank_span`.

Memory: ZB-1p may hold p M_B of activations per stage, ZB-2p 2p M_B, where a forward adds
M_B, B (our I) turns it into M_W and W frees M_W; per transformer layer M_B = sb(34h +
5as) and M_W = 32sbh (Table 1; the authors' runtime uses the same per-token constants).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One row of Table 9 with its Table 5 bubble rates."""

    model: str
    ranks: int
    microbatches: int
    forward_ms: float
    backward_input_ms: float
    backward_weight_ms: float
    comm_ms: float
    rates: dict[str, float]  # schedule -> published bubble rate

    @property
    def weight_memory_fraction(self) -> float:
        """M_W / M_B of the model's layer (Table 1): 32h / (34h + 5as)."""
        hidden, heads, seq = MODELS[self.model]
        return 32 * hidden / (34 * hidden + 5 * heads * seq)


# Model: hidden size, attention heads, sequence length (Table 3).
MODELS: dict[str, tuple[int, int, int]] = {
    "1.5B": (2304, 24, 1024),
    "6.2B": (4096, 32, 1024),
    "14.6B": (5120, 40, 1024),
    "28.3B": (6144, 48, 1024),
}

_NAMES = ("1f1b", "1f1b-i", "zb-h1", "zb-h2", "zb-1p", "zb-2p")
_ROWS = (
    # model, p, m, T_F, T_B, T_W, T_comm; then Table 5: 1F1B, 1F1B-I, ZB-H1, ZB-H2, ZB-1p, ZB-2p
    ("1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, (0.2431, 0.1055, 0.1585, 0.1083, 0.1585, 0.0433)),
    ("1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, (0.1985, 0.0818, 0.1242, 0.0837, 0.1242, 0.0039)),
    ("1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, (0.1240, 0.0443, 0.0674, 0.0444, 0.0674, 0.0026)),
    ("6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, (0.2347, 0.0808, 0.1323, 0.0698, 0.1323, 0.0029)),
    ("6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, (0.1898, 0.0628, 0.1045, 0.0559, 0.1045, 0.0022)),
    ("6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, (0.1091, 0.0320, 0.0554, 0.0294, 0.0554, 0.0010)),
    ("14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, (0.2552, 0.1104, 0.1397, 0.0672, 0.1397, 0.0066)),
    ("14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, (0.2082, 0.0852, 0.1088, 0.0516, 0.1088, 0.0054)),
    ("14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, (0.1251, 0.0445, 0.0576, 0.0266, 0.0576, 0.0028)),
    ("28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, (0.2646, 0.1493, 0.1421, 0.0641, 0.1421, 0.0038)),
    ("28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, (0.2168, 0.1164, 0.1106, 0.0490, 0.1106, 0.0029)),
    ("28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, (0.1352, 0.0624, 0.0594, 0.0257, 0.0594, 0.0018)),
)

SETTINGS: tuple[Setting, ...] = tuple(
    Setting(model, p, m, f, b, w, c, dict(zip(_NAMES, rates))) for model, p, m, f, b, w, c, rates in _ROWS
)


def cost_model(setting: Setting, weight_memory_fraction: float = 0.0):
    """The setting's profiled times as a sim.CostModel (seconds; T_comm as transfer latency)."""
    from sim import CostModel

    return CostModel(
        forward=setting.forward_ms / 1000, backward_input=setting.backward_input_ms / 1000,
        backward_weight=setting.backward_weight_ms / 1000, p2p_latency=setting.comm_ms / 1000,
        weight_memory_fraction=weight_memory_fraction,
    )
