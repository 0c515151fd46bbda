"""Planner closed forms against published numbers: parameter counts, FLOPs, ZeRO memory,
Korthikanti activation formulas, ring collectives."""

import json
from fractions import Fraction

import pytest

from sim.planner import PlanError, load_model
from sim.planner import collectives, flops, memory
from sim.planner.cluster import Link, make_cluster
from sim.planner.models import PRESETS, from_config
from sim.planner.stage_costs import group_link


# Narayanan et al. SC'21 Table 1 ("Number of parameters (billion)"), Table 2 (GPT-3: 174.6) and the
# caption of Figure 13 (162.2); Megatron family parameters reproduce to the published 0.1B.
@pytest.mark.parametrize("name, published", [
    ("megatron-1.7b", 1.7), ("megatron-3.6b", 3.6), ("megatron-7.5b", 7.5), ("megatron-18.4b", 18.4),
    ("megatron-39.1b", 39.1), ("megatron-76.1b", 76.1), ("megatron-145.6b", 145.6), ("megatron-310.1b", 310.1),
    ("megatron-529.6b", 529.6), ("megatron-1008b", 1008.0), ("gpt3-175b", 174.6), ("megatron-161b", 162.2),
])
def test_megatron_parameter_counts(name, published):
    assert round(flops.parameters(PRESETS[name]) / 1e9, 1) == published


def test_gpt_parameters_are_sc21_equation_2_plus_final_norm():
    for name in ("megatron-1.7b", "megatron-529.6b", "gpt3-175b"):
        m = PRESETS[name]
        l, h, v, s = m.layers, m.hidden, m.vocab, m.seq_len
        eq2 = 12 * l * h * h * (1 + Fraction(13, 12 * h) + Fraction(v + s, 12 * l * h))
        assert flops.parameters(m) == eq2 + 2 * h


# Exact counts published with the released checkpoints (Hugging Face model pages: Llama 2 6.74B /
# 13.0B / 69.0B, Llama 3 8.03B / 70.6B / 406B) and the BLOOM model card (176,247,271,424).
@pytest.mark.parametrize("name, published, digits", [
    ("llama2-7b", 6.74, 2), ("llama2-13b", 13.0, 1), ("llama2-70b", 69.0, 1),
    ("llama3-8b", 8.03, 2), ("llama3-70b", 70.6, 1), ("llama3-405b", 406, 0),
])
def test_llama_parameter_counts(name, published, digits):
    assert round(flops.parameters(PRESETS[name]) / 1e9, digits) == published


def test_exact_counts():
    assert flops.parameters(PRESETS["llama3-8b"]) == 8_030_261_248
    assert flops.parameters(PRESETS["llama3-70b"]) == 70_553_706_496
    assert flops.parameters(PRESETS["llama3-405b"]) == 405_853_388_800
    assert flops.parameters(PRESETS["bloom-176b"]) == 176_247_271_424


def test_flops_equal_sc21_equation_3_and_korthikanti():
    for name in ("megatron-1.7b", "gpt3-175b", "megatron-1008b"):
        m = PRESETS[name]
        b, s, l, h, v = 64, m.seq_len, m.layers, m.hidden, m.vocab
        eq3 = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        mfu_count = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
        assert flops.hardware_flops(m, b, "full") == pytest.approx(eq3, rel=1e-12)
        assert flops.model_flops(m, b) == pytest.approx(mfu_count, rel=1e-12)


def test_training_compute_published():
    # GPT-3 paper Table D.1: 3.14E+23 FLOPs for 175B on 300B tokens; Llama 3: 3.8 x 10^25 for 405B on 15.6T.
    assert f"{flops.six_nd(flops.parameters(PRESETS['gpt3-175b']), 300e9):.2e}" == "3.14e+23"
    assert f"{flops.six_nd(flops.parameters(PRESETS['llama3-405b']), 15.6e12):.1e}" == "3.8e+25"


def test_sc21_training_time_estimates():
    # SC'21 eq. (4), time = 8TP/(nX): 175B, 300B tokens, 1024 GPUs at 140 TFLOP/s: 34 days;
    # 1T, 450B tokens, 3072 GPUs at 163 TFLOP/s: 84 days.
    days = lambda t, p, n, x: 8 * t * p / (n * x) / 86400  # noqa: E731
    assert round(days(300e9, flops.parameters(PRESETS["gpt3-175b"]), 1024, 140e12)) == 34
    assert round(days(450e9, flops.parameters(PRESETS["megatron-1008b"]), 3072, 163e12)) == 84


def test_config_json_readers():
    gpt2 = from_config({"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257})
    assert flops.parameters(gpt2) == 124_439_808  # GPT-2 small as released
    llama = from_config({"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"})
    assert flops.parameters(llama) == flops.parameters(PRESETS["llama3-8b"])


def test_model_input_errors(tmp_path):
    with pytest.raises(PlanError, match="unknown model 'gpt5'"):
        load_model("gpt5")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_model(str(bad))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"n_layer": 2}))
    with pytest.raises(PlanError, match="lacks the key 'n_embd'"):
        load_model(str(partial))
    with pytest.raises(PlanError, match="not a model config"):
        from_config({"layers": 3})


def test_zero_paper_example():
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12: 120, 31.4, 16.6, 1.9 GB.
    totals = [memory.model_states(7.5e9, 64, stage).total / 1e9 for stage in range(4)]
    assert totals == [120.0, 31.40625, 16.640625, 1.875]
    assert [round(x, 1) for x in totals] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_formulas(t):
    # Korthikanti et al. 2022, Table 2, per layer: sbh(10 + 24/t + 5as/(ht)) with tensor parallelism,
    # sbh(34/t + 5as/(ht)) with sequence parallelism, 34sbh/t with selective recomputation too,
    # sbh(10 + 24/t) selective without sp, 2sbh full (2sbh/t with sp).
    m = PRESETS["gpt3-175b"]
    b = 2
    s, h, a = m.seq_len, m.hidden, m.heads
    sbh = s * b * h
    assert memory.activation_per_layer(m, b, t, False, "none") == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert memory.activation_per_layer(m, b, t, True, "none") == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert memory.activation_per_layer(m, b, t, True, "selective") == pytest.approx(34 * sbh / t)
    assert memory.activation_per_layer(m, b, t, False, "selective") == pytest.approx(sbh * (10 + 24 / t))
    assert memory.activation_per_layer(m, b, t, False, "full") == 2 * sbh
    assert memory.activation_per_layer(m, b, t, True, "full") == pytest.approx(2 * sbh / t)
    # The output layer (their §4.3): 4sbh/t (1 + v/h) with sequence parallelism.
    assert memory.last_stage_extra(m, b, t, True) == pytest.approx(4 * sbh / t * (1 + m.vocab / h))


def test_ring_collectives():
    link = Link(bandwidth=100e9, latency=5e-6)
    n, size = 8, 1e9
    assert collectives.reduce_scatter(size, n, link) == pytest.approx(7 * 5e-6 + 7 / 8 * size / 100e9)
    assert collectives.all_gather(size, n, link) == collectives.reduce_scatter(size, n, link)
    assert collectives.all_reduce(size, n, link) == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * size / 100e9)
    assert collectives.all_reduce(size, 1, link) == 0.0
    assert collectives.point_to_point(size, link) == pytest.approx(5e-6 + size / 100e9)


def test_group_links():
    cluster = make_cluster("a100-80g", 64, 8)
    assert group_link(cluster, 1, 8) == cluster.intra  # t = 8 inside a node
    assert group_link(cluster, 2, 4) == cluster.intra  # d = 4 of stride 2 spans 8 GPUs: one node
    rail = group_link(cluster, 8, 8)  # one rank per node: one adapter each
    assert rail.bandwidth == cluster.inter.bandwidth and rail.latency == cluster.inter.latency
    spread = group_link(cluster, 1, 64)  # eight ranks per node: still one adapter's bandwidth per rank
    assert spread == cluster.inter
