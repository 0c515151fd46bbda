"""The one-stage-per-rank zero-bubble family: warm-up forwards, then I, a deferred W, F.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Sec. 2, build ZB-H1 and
ZB-H2 from 1F1B by splitting each backward into I (input gradient, on the critical
path between ranks) and W (weight gradient, needed by nobody downstream), then
moving W passes later to fill bubbles. Both are this pattern on rank r:

    F x warmup_r,  then for k = 0, 1, ..., m-1:  I(k), W(k - delay_r), F(warmup_r + k)

(a W or F whose microbatch is out of range is left out), then the W passes still
owed, in microbatch order. After the warm-up the rank holds at most
warmup_r + delay_r microbatches at once (F done, W not yet done).
"""

from __future__ import annotations

from .ir import Action, F, I, W


def deferred_weight_row(stage: int, microbatches: int, warmup: int, delay: int) -> tuple[Action, ...]:
    """Rank order for one stage: `warmup` forwards, then I(k), W(k - delay), F(warmup + k)."""
    m = microbatches
    warmup = min(warmup, m)
    row = [F(stage, mb) for mb in range(warmup)]
    for k in range(m):
        row.append(I(stage, k))
        if k >= delay:
            row.append(W(stage, k - delay))
        if warmup + k < m:
            row.append(F(stage, warmup + k))
    row += [W(stage, mb) for mb in range(max(m - delay, 0), m)]
    return tuple(row)
