"""The axes of a training configuration and the values the discrete ones take.

Named once here, below everything that enumerates, prices or reports configurations.
"""

from __future__ import annotations

# The axes a runner-up may differ on from the winner (data parallelism follows from t and p).
AXES = ("tp", "pp", "microbatch_size", "schedule", "chunks", "zero", "recompute", "sequence_parallel")

# Activation recomputation: none, selective (attention's core only, Korthikanti et al. 2022
# Sec. 5) or full (each layer's input kept, the layer re-run before its backward).
RECOMPUTE = ("none", "selective", "full")
