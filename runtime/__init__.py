"""bubblescope.runtime: runs lowered schedules on torch.distributed point-to-point.

Python use, on every rank of an initialised process group::

    from runtime import ModelSpec, RunOptions, build_model, execute
    program = schedules.lower(schedules.build("1f1b", ranks=2, microbatches=8))
    result = execute(program, build_model(ModelSpec(model="gpt", layers=4)), RunOptions(steps=5, check=True))

`RunOptions(layout=Layout(pp, dp, tp))` runs the program on each of dp x tp pipelines
(runtime/layout.py; the program lowered with `schedules.lower(schedule, dp)`). `execute`
may be called many times in one group; `Session` runs a program step by step
(e.g. with an optimizer between steps). A user model comes in through
`from_layers(layers, loss, inputs, targets)`. `python -m runtime` is the command line.
"""

from .errors import ConfigError, PeerError
from .executor import RunOptions, Session, execute, prepare
from .layout import Layout
from .models import ModelSpec, PipelineModel, from_layers, partition
from .models import build as build_model
from .record import RunResult, write_outputs

__all__ = [
    "ConfigError",
    "Layout",
    "ModelSpec",
    "PeerError",
    "PipelineModel",
    "RunOptions",
    "RunResult",
    "Session",
    "build_model",
    "execute",
    "from_layers",
    "partition",
    "prepare",
    "write_outputs",
]
