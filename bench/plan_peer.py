"""The validation cases through an open-source analytic planner, llm-analysis (cli99/llm-analysis), as a peer.

llm-analysis computes a training step's latency from closed forms given a FLOPs efficiency;
it does not simulate schedules (its pipeline bubble is a closed form; it has no interleaved
schedule). To compare like with like, its one efficiency constant is fitted on the same case
as ours (Korthikanti 22B, `bench/plan_validate.py`) and then every case is predicted with
it, using the configuration our evaluation ran (the published axes, and for unstated ones the
values the planner found). Its A100 preset counts 200 GB/s per node between nodes; BLOOM's
6.25 GB/s per GPU becomes an inter-node efficiency of 0.25.

It is not a dependency of this project: install it in a separate environment and run this
bench with that environment's Python, which must also see this repository:

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install llm-analysis simpy pandas numpy tqdm matplotlib
    PYTHONPATH=$PWD /tmp/peer-venv/bin/python bench/plan_peer.py
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan_validate import CASES, FITTING, evaluate, predicted  # noqa: E402
from sim.planner import flops, load_model  # noqa: E402
from sim.planner.throughput import fit_efficiency  # noqa: E402

GPUS = {"a100-80g": "a100-sxm-80gb", "h100-sxm": "h100-sxm-80gb"}
RECOMPUTE = {"none": 0, "selective": 1, "full": 2}


def peer_step(case, config, efficiency: float, configs: Path) -> float:
    """llm-analysis's latency per iteration for `config` of `case`."""
    from llm_analysis.analysis import train

    model = load_model(case.model)
    path = configs / f"{model.name}.json"
    path.write_text(json.dumps({
        "name": model.name, "max_seq_len": model.seq_len, "num_layers": model.layers, "n_head": model.heads,
        "hidden_dim": model.hidden, "vocab_size": model.vocab, "ffn_embed_dim": model.ffn_hidden,
        "expansion_ratio": model.ffn_hidden / model.hidden, "num_key_value_heads": model.kv_heads,
    }))
    result = train(
        model_name=str(path), gpu_name=GPUS[case.gpu], dtype_name="w16a16e16", log_level="ERROR",
        batch_size_per_gpu=config.microbatch_size, gradient_accumulation_steps=config.microbatches,
        seq_len=model.seq_len, activation_recomputation=RECOMPUTE[config.recompute], ds_zero=config.zero,
        tp_size=config.tp, pp_size=config.pp, dp_size=config.dp, total_num_gpus=case.gpus,
        sp_size=config.tp if config.sequence_parallel else 1, flops_efficiency=efficiency,
        flash_attn=not model.dropout, mlp_gated_linear_units=model.gated,
        inter_node_memory_efficiency=case.overrides.get("inter_gbps", 25) * 8 / 200,
    )
    return result["latency_per_iter"]


class _Step:
    def __init__(self, seconds: float):
        self.step_time = seconds
        self.mfu = None
        self.tflops_per_gpu = None


def peer_metric(case, seconds: float) -> float:
    model = load_model(case.model)
    if case.metric == "mfu":
        return flops.model_flops(model, case.global_batch) / seconds / case.gpus / 312e12
    if case.metric == "model_tflops":
        return flops.model_flops(model, case.global_batch) / seconds / case.gpus / 1e12
    return predicted(case, _Step(seconds))


def main() -> int:
    logging.disable(logging.WARNING)
    configs = Path(tempfile.mkdtemp())
    ours = {case.label: evaluate(case) for case in CASES}
    fitting_config = ours[FITTING.label].config
    measured = flops.model_flops(load_model(FITTING.model), FITTING.global_batch) / (
        FITTING.published * FITTING.gpus * 312e12)
    efficiency = fit_efficiency(lambda e: peer_step(FITTING, fitting_config, e, configs), measured)
    print(f"llm-analysis flops_efficiency fitted on {FITTING.source} {FITTING.label}: {efficiency:.4f}")
    print("| source | case | published | ours | error | llm-analysis | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ours_err, peer_err = [], []
    for case in CASES:
        ev = ours[case.label]
        mine = predicted(case, ev)
        scale, unit = (100, "%") if case.metric == "mfu" else (1, "")
        e1 = (mine - case.published) / case.published
        tag = " (fit)" if case.fitted else ""
        try:
            peer = peer_metric(case, peer_step(case, ev.config, efficiency, configs))
        except AssertionError as exc:  # llm-analysis refuses what its memory model says does not fit
            peer_text = f"refused: {str(exc).split(',')[0]}"
            peer = None
        else:
            e2 = (peer - case.published) / case.published
            peer_text = f"{peer * scale:.1f}{unit} | {e2 * 100:+.1f}%{tag}"
        if not case.fitted:
            ours_err.append(abs(e1))
            if peer is not None:
                peer_err.append((abs(e1), abs(e2)))
        print(f"| {case.source} | {case.label} | {case.published * scale:.1f}{unit} | {mine * scale:.1f}{unit} | "
              f"{e1 * 100:+.1f}%{tag} | {peer_text} |")
    print(f"\nMAPE over {len(ours_err)} cases (fitting case excluded): ours {statistics.mean(ours_err) * 100:.1f}%; "
          f"over the {len(peer_err)} cases llm-analysis accepts: ours {statistics.mean(a for a, _ in peer_err) * 100:.1f}%, "
          f"llm-analysis {statistics.mean(b for _, b in peer_err) * 100:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
