"""ZeRO's data-parallel collectives in the planner's costs, against closed forms written here.

A middle stage (no embedding or head) of a ZeRO-3 configuration takes, per layer and
microbatch, the longer of the layer's compute (read off the same configuration at ZeRO 0,
where no data-parallel collective runs inside the actions) and a ring collective of the
layer's 16-bit weights over the d data-parallel ranks on one GPU's inter-node adapter:
(d - 1) alpha + (d - 1)/d x 2 P_layer / t / BW, with A100 preset numbers (25 GB/s, 10 us).
After the last backward, ZeRO-3 adds the optimizer on its shard (28 bytes per parameter at
HBM bandwidth) and the step's first gather and last reduce-scatter, which nothing hides.
"""

import pytest

from sim.planner import load_model, make_cluster
from sim.planner.config import Config
from sim.planner.stage_costs import Pricer
from sim.planner.throughput import Throughput

GB = 1e9
BW, ALPHA = 25 * GB, 10e-6  # the a100-80g preset's inter-node adapter per GPU
HBM = 2039 * GB


def ring(num_bytes: float, n: int) -> float:
    return (n - 1) * ALPHA + (n - 1) / n * num_bytes / BW


def layer_params(model) -> float:
    """GPT layer: 12 h^2 weights + 13 h biases and norms (SC'21 eq. 2's per-layer terms)."""
    h = model.hidden
    return 12 * h * h + 13 * h


def costs(model, cluster, **axes):
    base = dict(tp=8, pp=4, dp=cluster.gpus // 32, schedule="1f1b", chunks=1, microbatch_size=1,
                microbatches=8, zero=3, recompute="selective", sequence_parallel=True)
    base.update(axes)
    config = Config(**base)
    pricer = Pricer(model, cluster, Throughput.of(cluster.gpu))
    return pricer(config, tuple(range(config.pp)))


@pytest.mark.parametrize("model_name, gpus, b", [("gpt3-175b", 512, 1), ("megatron-1.7b", 256, 4), ("gpt3-175b", 4096, 4)])
def test_zero3_layer_actions_are_max_of_compute_and_ring(model_name, gpus, b):
    model = load_model(model_name)
    cluster = make_cluster("a100-80g", gpus, 8)
    d, t = gpus // 32, 8
    zero0 = costs(model, cluster, zero=0, dp=d, microbatch_size=b).stage
    zero3 = costs(model, cluster, zero=3, dp=d, microbatch_size=b).stage
    layers = model.layers // 4
    collective = ring(2 * layer_params(model) / t, d)
    for s in (1, 2):  # middle stages: layers only
        f_c, i_c, w_c = zero0.forward[s] / layers, zero0.input[s] / layers, zero0.weight[s] / layers
        assert zero3.forward[s] == pytest.approx(layers * max(f_c, collective * 1e9), rel=1e-6, abs=layers)
        assert zero3.input[s] == pytest.approx(layers * max(i_c, collective * 1e9), rel=1e-6, abs=layers)
        assert zero3.weight[s] == pytest.approx(layers * max(w_c, collective * 1e9), rel=1e-6, abs=layers)
    # The cases cover both sides of the max: the gather hides behind compute or it does not.
    hidden = zero0.forward[1] / layers > collective * 1e9
    assert hidden == (model_name == "megatron-1.7b" or b == 4)


def test_zero_after_the_last_backward():
    model = load_model("gpt3-175b")
    cluster = make_cluster("a100-80g", 512, 8)
    d, t = 16, 8
    collective = ring(2 * layer_params(model) / t, d)
    for zero in (0, 1, 2, 3):
        c = costs(model, cluster, zero=zero, dp=d)
        rank_params = layer_params(model) * model.layers / 4 / t  # a middle rank: 24 layers
        optimizer = 28 * rank_params / (d if zero else 1) / HBM
        grads, weights = 2 * rank_params, 2 * rank_params
        expected = {
            0: 2 * ring(grads, d) + optimizer,
            1: ring(grads, d) + optimizer + ring(weights, d),
            2: optimizer + ring(weights, d) + collective,
            3: optimizer + 2 * collective,
        }[zero]
        assert c.after_ns[1] == pytest.approx(expected * 1e9, rel=1e-6, abs=2)


def test_data_parallel_groups_across_nodes_use_one_adapter_per_gpu():
    """d spans nodes: its ring runs on one GPU's adapter whether 1 or 8 of its ranks share a node."""
    model = load_model("gpt3-175b")
    collective_t8 = ring(2 * layer_params(model) / 8, 16)
    collective_t1 = ring(2 * layer_params(model) / 1, 16)
    cluster = make_cluster("a100-80g", 512, 8)
    zero3_t8 = costs(model, cluster, tp=8, dp=16, microbatch_size=1)
    zero3_t1 = costs(model, make_cluster("a100-80g", 64, 8), tp=1, dp=16, microbatch_size=1)
    assert zero3_t8.after_ns[1] - 28 * layer_params(model) * 24 / 8 / 16 / HBM * 1e9 == pytest.approx(2 * collective_t8 * 1e9, rel=1e-6)
    assert zero3_t1.after_ns[1] - 28 * layer_params(model) * 24 / 1 / 16 / HBM * 1e9 == pytest.approx(2 * collective_t1 * 1e9, rel=1e-6)
