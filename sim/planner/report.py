"""What a plan looks like to a reader: a ranked table, JSON records, the explanation, a launch command."""

from __future__ import annotations

import math
import shlex

import pandas as pd

import schedules

from . import collectives, flops, memory
from .axes import AXES
from .search import Evaluation, Plan
from .stage_costs import group_link

GB = 1e9
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "buffers")
TABLE_COLUMNS = (
    "rank", "step_time", "tokens_per_second", "tflops_per_gpu", "mfu", "bubble_ratio", "memory_gb", "tp", "pp",
    "dp", "schedule", "chunks", "microbatch_size", "microbatches", "zero", "recompute", "sequence_parallel",
)


def record(ev: Evaluation) -> dict:
    """One configuration as a JSON-ready dict (keys listed in the issue, seconds and bytes)."""
    return {
        **ev.config.record(),
        "step_time": ev.step_time,
        "tokens_per_second": ev.tokens_per_second,
        "tflops_per_gpu": ev.tflops_per_gpu,
        "mfu": ev.mfu,
        "bubble_ratio": ev.bubble_ratio,
        "memory_per_gpu": ev.memory_per_gpu,
        "memory": ev.memory,
        "makespan": ev.makespan_ns / 1e9,
        "exposed_data_parallel": ev.exposed_data_parallel,
    }


def records(plan: Plan) -> list[dict]:
    """The ranked configurations, best first."""
    return [record(ev) for ev in plan.ranked]


def table(plan: Plan) -> pd.DataFrame:
    """The ranked configurations as a table (memory in GB per GPU)."""
    rows = []
    for i, ev in enumerate(plan.ranked, 1):
        r = record(ev)
        rows.append({**{k: r[k] for k in TABLE_COLUMNS if k in r}, "rank": i, "memory_gb": ev.memory_per_gpu / GB})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def format_table(plan: Plan) -> str:
    """The table for a terminal."""
    frame = table(plan)
    frame["mfu"] = frame["mfu"].astype(float)
    formats = {
        "step_time": "{:.3f}".format, "tokens_per_second": "{:,.0f}".format, "tflops_per_gpu": "{:.4g}".format,
        "mfu": "{:.3f}".format, "bubble_ratio": "{:.3f}".format, "memory_gb": "{:.3g}".format,
    }
    return frame.to_string(index=False, formatters=formats, na_rep="-")


def summary_line(plan: Plan) -> str:
    s = plan.stats
    return (f"{s.enumerated} configurations ({s.pruned_static} too big under any schedule); {s.visited} visited in "
            f"order of their step-time bound, {s.pruned_bound} never (bound above the K-th step time); "
            f"{s.pruned_memory} too big with their schedule's activations, {s.refused} refused by their schedule, "
            f"{s.simulated} simulations ({s.simulations_shared} shared), {s.builds} programs built in "
            f"{s.build_seconds:.1f} s; {s.seconds:.1f} s in all")


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def explain(plan: Plan) -> str:
    """The decision flow for the winner, with its numbers, and the runner-up on each axis."""
    r = plan.request
    best = plan.best
    c = best.config
    model, cluster = r.model, r.cluster
    params = flops.parameters(model)
    states = memory.model_states(params, 1, 0).total
    lines = [f"Plan for {model.name} ({params / 1e9:.1f}B parameters, {model.layers} layers, hidden {model.hidden}, "
             f"{model.seq_len} tokens) on {cluster.gpus} x {cluster.gpu.name} ({cluster.nodes} nodes of "
             f"{cluster.gpus_per_node}), global batch {r.global_batch} sequences:",
             f"  winner: {c.describe()}: {best.step_time:.3f} s per step, {best.tokens_per_second:,.0f} tokens/s, "
             f"{best.tflops_per_gpu:.1f} TFLOP/s per GPU" + (f" (MFU {best.mfu:.1%})" if best.mfu is not None else ""),
             "",
             "1. Memory decides what is required."]
    lines.append(f"   Weights, gradients and Adam state take 16 bytes per parameter: {_gb(states)} for the whole model, "
                 f"against {_gb(r.cap)} usable per GPU. ZeRO-3 over all {cluster.gpus} GPUs would leave "
                 f"{_gb(states / cluster.gpus)} each, but then every layer's weights cross the network for every "
                 "microbatch.")
    mp = c.tp * c.pp
    mem = best.memory
    lines.append(f"   The winner splits each replica over t x p = {c.tp} x {c.pp} = {mp} GPUs and keeps d = {c.dp} replicas "
                 f"(ZeRO {c.zero}); its fullest GPU (pipeline rank {best.peak_rank}) holds "
                 + ", ".join(f"{k} {_gb(v)}" for k, v in mem.items()) + f" = {_gb(best.memory_per_gpu)}.")
    lines.append(f"   Activations: {c.schedule} keeps at most {_in_flight(best)} microbatches of a stage in flight on that "
                 f"rank (from the simulator's memory timeline), with {c.recompute} recomputation"
                 + (" and sequence parallelism" if c.sequence_parallel else "") + ".")
    dp_only = plan.runner_ups.get("data_parallel_only")
    if dp_only is None and r.global_batch % cluster.gpus:
        lines.append(f"   Without model parallelism (t = p = 1) d would be {cluster.gpus}, which does not divide the "
                     f"global batch of {r.global_batch}.")
    elif dp_only is None:
        lines.append("   No configuration with t = p = 1 is legal and fits.")
    else:
        lines.append(f"   Best without model parallelism: {dp_only.config.describe()}, {dp_only.step_time:.3f} s per step.")
    lines += ["", "2. The interconnect limits where tensor parallelism goes."]
    hidden_bytes = 2.0 * model.seq_len * c.microbatch_size * model.hidden
    g = cluster.gpus_per_node
    inside = group_link(cluster, 1, c.tp)
    across = cluster.inter
    per_layer_in = 4 * collectives.all_reduce(hidden_bytes, c.tp, inside)
    per_layer_out = 4 * collectives.all_reduce(hidden_bytes, c.tp, across)
    lines.append(f"   t = {c.tp} on nodes of {g} GPUs: a layer's 4 collectives per microbatch ({hidden_bytes / 1e6:.0f} MB "
                 f"each) take {_ms(per_layer_in)} on {'NVLink (inside a node)' if c.tp <= g else 'the inter-node links'}; "
                 f"over InfiniBand they would take {_ms(per_layer_out)}.")
    tp_alt = plan.runner_ups.get("tp")
    if tp_alt is not None:
        lines.append(f"   Best other t: {tp_alt.config.describe()}: {tp_alt.step_time:.3f} s "
                     f"({_delta(tp_alt, best)}).")
    lines += ["", "3. Throughput picks among what is left."]
    bubble = best.bubble_ratio
    closed = (c.pp - 1) / (c.chunks * c.microbatches + c.pp - 1) if c.pp > 1 else 0.0
    lines.append(f"   Pipeline: p = {c.pp}, m = {c.microbatches}, v = {c.chunks}: the simulated bubble is {bubble:.1%} of "
                 f"device time over a makespan of {best.makespan_ns / 1e9:.3f} s (interleaved-1F1B closed form "
                 f"(p-1)/(vm+p-1) = {closed:.1%}, for comparison), {bubble * best.makespan_ns / 1e9:.3f} s per GPU idle.")
    after = max(best.costs.after_ns) / 1e9
    work = {0: "gradient all-reduce and optimizer step", 1: "gradient reduce-scatter, optimizer step and weight gather",
            2: "last layer's gradient reduce-scatter, optimizer step and weight gather",
            3: "first layer's weight gather, last layer's gradient reduce-scatter and optimizer step"}[c.zero]
    lines.append(f"   Data parallelism (d = {c.dp}, ZeRO {c.zero}): {work} take "
                 f"{after:.3f} s per rank after its last backward; {best.exposed_data_parallel:.3f} s of it extends the step "
                 f"beyond the pipeline, the rest hides behind the other ranks' drain.")
    lines += ["", "4. Runner-up on each axis (best configuration that differs from the winner there):"]
    for axis in AXES:
        alt = plan.runner_ups.get(axis)
        value = getattr(c, axis)
        if alt is None and axis == "chunks" and c.chunks == 1:
            lines.append(f"   chunks: {c.schedule} runs one stage per rank")
        elif alt is None:
            lines.append(f"   {axis} = {value}: no other value is legal and fits")
        else:
            lines.append(f"   {axis} = {value} -> {getattr(alt.config, axis)}: {alt.config.describe()}, "
                         f"{alt.step_time:.3f} s ({_delta(alt, best)}), {_gb(alt.memory_per_gpu)} per GPU")
    return "\n".join(lines)


def _delta(alt: Evaluation, best: Evaluation) -> str:
    return f"{(alt.step_time / best.step_time - 1) * 100:+.1f}% step time"


def _in_flight(ev: Evaluation) -> str:
    """Peak activation bytes of the fullest rank in units of one microbatch of its largest stage."""
    rank = ev.peak_rank
    stage = ev.costs.stage
    largest = max((stage.memory[s] for s, r in enumerate(ev.costs.placement) if r == rank), default=0)
    return f"{ev.activation_peaks[rank] / largest:.1f}" if largest else "0"


def torchrun_command(plan: Plan, ev: Evaluation | None = None) -> str:
    """The `torchrun ... -m runtime` command that runs the configuration with the executor.

    The executor (runtime/cli.py, runtime/layout.py) runs p x d x t ranks laid out as the
    planner places them (tensor-parallel ranks adjacent, data-parallel next, pipeline
    outermost): `--pp P --dp D --tp T`, the built-in gpt model with the plan's layers, hidden
    size, heads, sequence length and vocabulary, and `--batch-size` the global batch of one
    step, b x m x d sequences (each replica takes its d-th). What the executor does not do is
    said in the command's comment: ZeRO (it all-reduces whole gradients), recomputation,
    sequence parallelism, and a model other than GPT-style.
    """
    ev = ev or plan.best
    c, model, cluster = ev.config, plan.request.model, plan.request.cluster
    world = c.pp * c.dp * c.tp
    per_node = min(world, cluster.gpus_per_node)
    nodes = math.ceil(world / per_node)
    args = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node)]
    if nodes > 1:
        args += ["--node-rank", "N", "--rdzv-backend", "c10d", "--rdzv-endpoint", "HEAD:29500", "--rdzv-id", "RUN"]
    args += ["-m", "runtime", "--pp", str(c.pp), "--dp", str(c.dp), "--tp", str(c.tp),
             "--schedule", c.schedule, "--microbatches", str(c.microbatches)]
    if c.chunks > 1 and schedules.generator(c.schedule).takes_chunks:
        args += ["--chunks", str(c.chunks)]
    args += ["--model", "gpt", "--layers", str(model.layers), "--hidden", str(model.hidden), "--heads", str(model.heads),
             "--seq-len", str(model.seq_len), "--vocab", str(model.vocab),
             "--batch-size", str(c.microbatch_size * c.microbatches * c.dp),
             "--out", f"runs/plan-{c.schedule}-p{c.pp}-d{c.dp}-t{c.tp}"]
    missing = []
    if c.zero:
        missing.append(f"ZeRO {c.zero} (it all-reduces whole gradients, ZeRO 0)")
    if c.recompute != "none":
        missing.append(f"{c.recompute} recomputation")
    if c.sequence_parallel:
        missing.append("sequence parallelism")
    notes = [f"the executor runs this layout without {', '.join(missing)}: its memory and step time differ from the plan's"] if missing else []
    if model.gated or model.kv_heads != model.heads or not model.bias:
        notes.append("the executor's gpt model is GPT-style (4h GELU FFN, full attention heads), not this architecture")
    comment = "".join(f"# {n}\n" for n in notes)
    return comment + " ".join(shlex.quote(a) if a not in ("N",) else a for a in args)
