"""In-process tests of the executor's parts: partitioning, memory meter, split backward, metrics."""

import pytest
import torch
from torch import nn

import schedules
from runtime import ConfigError, ModelSpec, RunOptions, build_model, from_layers, partition
from runtime.memory import SavedTensorMeter, unpack
from runtime.models import microbatch_sizes
from runtime.record import set_delivery_times
from runtime.reference import compute as reference
from runtime.reference import relative_error
from runtime.stage import Stage
from schedules.timeline import step_metrics, timeline_frame

torch.set_num_threads(1)


def test_partition_balanced_gives_extra_layers_to_the_first_stages():
    assert partition(10, 4) == (range(0, 3), range(3, 6), range(6, 8), range(8, 10))
    assert partition(4, 4) == tuple(range(i, i + 1) for i in range(4))


def test_partition_explicit_split():
    assert partition(8, 3, [1, 5, 2]) == (range(0, 1), range(1, 6), range(6, 8))


@pytest.mark.parametrize(
    "layers, stages, split, message",
    [
        (3, 4, None, "3 layers, fewer than the schedule's 4 stages"),
        (8, 3, [4, 4], "lists 2 stages but the schedule has 3"),
        (8, 2, [5, 4], "sums to 9 layers but the model has 8"),
        (8, 2, [8, 0], "positive layer counts"),
    ],
)
def test_partition_errors(layers, stages, split, message):
    with pytest.raises(ConfigError, match=message):
        partition(layers, stages, split)


@pytest.mark.parametrize("batch, m", [(8, 8), (10, 4), (64, 8), (7, 3), (5, 1)])
def test_microbatch_sizes_match_tensor_split(batch, m):
    expected = [len(t) for t in torch.tensor_split(torch.arange(batch), m)]
    assert microbatch_sizes(batch, m) == expected


def test_microbatch_sizes_need_a_sample_each():
    with pytest.raises(ConfigError, match="--batch-size 3 is smaller than --microbatches 4"):
        microbatch_sizes(3, 4)


@pytest.mark.parametrize(
    "spec, message",
    [
        (ModelSpec(model="resnet"), "unknown model 'resnet'"),
        (ModelSpec(model="gpt", hidden=30, heads=4), "--hidden 30 is not divisible by --heads 4"),
        (ModelSpec(layers=0), "--layers must be a positive integer"),
        (ModelSpec(model="gpt", seq_len=0), "--seq-len must be a positive integer"),
    ],
)
def test_model_spec_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        build_model(spec)


def test_built_models_are_deterministic_and_shaped():
    a, b = build_model(ModelSpec(model="gpt", layers=2, hidden=16, heads=2, seq_len=5, vocab=11, batch_size=3)), None
    b = build_model(ModelSpec(model="gpt", layers=2, hidden=16, heads=2, seq_len=5, vocab=11, batch_size=3))
    assert a.inputs.shape == (3, 5) and a.targets.shape == (3, 5) and a.inputs.dtype == torch.int64
    assert torch.equal(a.inputs, b.inputs)
    for (na, pa), (nb, pb) in zip(a.full_module().named_parameters(), b.full_module().named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    logits = a.full_module()(a.inputs)
    assert logits.shape == (3, 5, 11)
    mlp = build_model(ModelSpec(layers=3, hidden=8, batch_size=4))
    assert [type(m) for m in mlp.layers[0]] == [nn.Linear, nn.ReLU] and len(mlp.layers) == 3


def test_user_model_batch_mismatch():
    with pytest.raises(ConfigError, match="disagree on the batch size"):
        from_layers([nn.Linear(2, 2)], nn.functional.mse_loss, torch.zeros(4, 2), torch.zeros(3, 2))


def test_meter_counts_each_saved_storage_once_and_skips_excluded():
    weight = torch.randn(8, 8, requires_grad=True)
    data = torch.randn(4, 8)
    meter = SavedTensorMeter([weight, data])
    with meter.hooks():
        h = data @ weight  # saves data (excluded) and weight (excluded)
        assert meter.bytes == 0
        y = h.exp()  # saves its result: 4 x 8 float32 = 128 bytes
        assert meter.bytes == 128
        z = y.sin()  # saves y: the same storage, still 128
        v = y[:2].cos()  # saves a view of y: the same storage again
        assert meter.bytes == 128
        w = z.tanh()  # saves its result: another 128
    assert meter.bytes == 256 and meter.peak == 256
    (w.sum() + v.sum()).backward()
    assert meter.bytes == 0 and meter.peak == 256
    meter.reset_peak()
    assert meter.peak == 0


def _stages(model, parts, meter, m, split):
    inputs = list(torch.tensor_split(model.inputs, m))
    targets = list(torch.tensor_split(model.targets, m))
    weights = [len(t) / model.batch_size for t in inputs]
    last = len(parts) - 1
    stages = [
        Stage(
            s, model.stage_module(parts[s], s == 0, s == last), meter,
            loss=model.loss if s == last else None,
            targets=targets if s == last else None,
            weights=weights if s == last else None,
            split=split,
        )
        for s in range(len(parts))
    ]
    return stages, inputs


def _split_run(model, m, on_after_forward=None, on_after_input=None):
    """F, then I, then W of every microbatch through one stage per layer; returns the
    stages and the reference (computed first: stages patch the modules' forward)."""
    ref = reference(model, torch.device("cpu"))
    meter = SavedTensorMeter([*model.full_module().parameters(), model.inputs, model.targets])
    stages, inputs = _stages(model, partition(len(model.layers), len(model.layers)), meter, m, split=True)
    for mb in range(m):
        x = inputs[mb]
        for stage in stages:
            x = stage.forward(mb, x, split=True)
    on_after_forward(meter, stages)
    for mb in range(m):
        grad = None
        for stage in reversed(stages):
            grad = stage.backward_input(mb, grad)
            if stage.index > 0:
                assert grad is not None and grad.shape[0] == inputs[mb].shape[0]
    on_after_input(meter, stages)
    for mb in range(m):
        for stage in stages:
            stage.backward_weight(mb)
    assert meter.bytes == 0
    return stages, ref


def _assert_equals_reference(model, stages, ref):
    errors = {
        name: relative_error(p.grad, ref.grads[name])
        for stage in stages
        for name, p in stage.module.named_parameters()
    }
    assert sorted(errors) == sorted(ref.grads)
    assert max(errors.values()) < 1e-5, errors
    assert abs(float(stages[-1].loss_sum) - ref.loss) < 1e-5 * abs(ref.loss)
    for stage in stages:
        stage.close()
    assert all("forward" not in vars(mod) for mod in model.full_module().modules())


def test_split_backward_keeps_exactly_linear_inputs_and_output_gradients_for_w():
    """mlp, one Linear+ReLU block per stage, hidden 16, rows 2+2+1: every activation is
    64 bytes per row. After F: each stage's ReLU output (the next stage's input shares it;
    the batch is not counted) = 3 x 64 x 5. After I: the Linear inputs W needs (stage 1's
    and 2's inputs) plus the three Linear output gradients = 5 x 64 x 5; the last ReLU
    output, needed by no weight gradient, is gone. I computes no weight gradient."""
    model = build_model(ModelSpec(layers=3, hidden=16, batch_size=5))
    seen = {}

    def after_forward(meter, stages):
        seen["forward"] = meter.bytes

    def after_input(meter, stages):
        seen["input"] = meter.bytes
        assert all(p.grad is None for stage in stages for p in stage.params)

    stages, ref = _split_run(model, 3, after_forward, after_input)
    assert seen == {"forward": 3 * 64 * 5, "input": 5 * 64 * 5}
    _assert_equals_reference(model, stages, ref)


def test_split_backward_gpt_frees_what_only_input_gradients_need():
    model = build_model(ModelSpec(model="gpt", layers=3, hidden=16, heads=2, seq_len=4, vocab=13, batch_size=5))
    seen = {}

    def after_forward(meter, stages):
        seen["forward"] = meter.bytes

    def after_input(meter, stages):
        kept_grads = sum(
            unpack(d.grad).untyped_storage().nbytes()
            for stage in stages
            for record in stage._records.values()
            for d in (*record.closed, *record.graph)
        )
        seen["input_without_grads"] = meter.bytes - kept_grads
        assert all(p.grad is None for stage in stages for p in stage.params)

    stages, ref = _split_run(model, 3, after_forward, after_input)
    assert 0 < seen["input_without_grads"] < seen["forward"]
    _assert_equals_reference(model, stages, ref)


def test_split_backward_for_a_module_called_with_two_arguments_falls_back_to_weights_in_i():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(2.0))

        def forward(self, a, b):
            return a * self.scale + b

    class UsesPair(nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = Pair()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.pair(self.lin(x), x)

    torch.manual_seed(0)
    model = from_layers([UsesPair(), UsesPair()], nn.functional.mse_loss, torch.randn(4, 3), torch.randn(4, 3))
    ref = reference(model, torch.device("cpu"))
    meter = SavedTensorMeter([])
    stages, inputs = _stages(model, partition(2, 1), meter, 2, split=True)
    (stage,) = stages
    for mb in range(2):
        stage.forward(mb, inputs[mb], split=True)
        stage.backward_input(mb, None)
    scales = [p for n, p in stage.module.named_parameters() if n.endswith("scale")]
    assert all(p.grad is not None for p in scales)  # unbridged: computed in I
    assert all(p.grad is None for n, p in stage.module.named_parameters() if "lin" in n)
    for mb in range(2):
        stage.backward_weight(mb)
    for name, p in stage.module.named_parameters():
        assert torch.allclose(p.grad, ref.grads[name], rtol=1e-5, atol=1e-7), name
    stage.close()


def _frame(rows):
    return timeline_frame(
        (0, r, st, 0, mb, kind, f"{st}{kind}{mb}", s, e, peer, "measured") for r, st, mb, kind, s, e, peer in rows
    )


def test_step_metrics_match_hand_computed_bubbles():
    rows = [
        (0, 0, 0, "F", 0.0, 1.0, -1),
        (0, 0, 0, "SEND_F", 1.0, 1.2, 1),
        (0, 0, 0, "RECV_B", 1.2, 3.0, 1),
        (0, 0, 0, "B", 3.0, 5.0, -1),
        (1, 1, 0, "RECV_F", 0.0, 1.2, 0),
        (1, 1, 0, "F", 1.2, 2.0, -1),
        (1, 1, 0, "B", 2.0, 3.0, -1),
        (1, 1, 0, "SEND_B", 3.0, 3.0, 0),
    ]
    (metrics,) = step_metrics(_frame(rows), ranks=2).to_dict("records")
    busy = 1.0 + 2.0 + 0.8 + 1.0
    assert metrics["makespan"] == 5.0
    assert metrics["bubble_ratio"] == pytest.approx((2 * 5.0 - busy) / (2 * 5.0))
    # The paper's rate: rank 0 has the longest span (5.0), rank 0 the most compute (1.0 + 2.0).
    assert metrics["bubble_ratio_rank_span"] == pytest.approx((5.0 - 3.0) / 5.0)


def test_send_rows_end_when_the_matching_receive_ends():
    program = schedules.lower(schedules.build("gpipe", ranks=2, microbatches=1))
    rows = [
        (0, 0, 0, "F", 0.0, 1.0, -1),
        (0, 0, 0, "SEND_F", 1.0, 1.0, 1),
        (0, 0, 0, "RECV_B", 1.0, 4.0, 1),
        (0, 0, 0, "B", 4.0, 6.0, -1),
        (1, 1, 0, "RECV_F", 0.0, 1.5, 0),
        (1, 1, 0, "F", 1.5, 2.0, -1),
        (1, 1, 0, "B", 2.0, 3.0, -1),
        (1, 1, 0, "SEND_B", 3.5, 3.5, 0),
    ]
    frame = _frame(rows)
    set_delivery_times(frame, program)
    ends = dict(zip(frame["action"], frame["end"]))
    assert ends["0SEND_F0"] == 1.5  # delivered when 1RECV_F0 ended
    assert ends["1SEND_B0"] == 4.0  # delivered when 0RECV_B0 ended
    assert ends["0F0"] == 1.0 and ends["1RECV_F0"] == 1.5


@pytest.mark.parametrize(
    "options, message",
    [
        (RunOptions(steps=0), "--steps must be at least 1"),
        (RunOptions(warmup=-1), "--warmup must be 0 or more"),
        (RunOptions(timeout=0), "--timeout must be positive"),
        (RunOptions(post_ahead=-1), "--post-ahead must be 0 or more"),
        (RunOptions(post_ahead="soon"), "'step' or 'auto'"),
        (RunOptions(post_ahead=True), "--post-ahead must be 0 or more"),
        (RunOptions(transport="udp"), "transport must be one of tagged, ordered"),
    ],
)
def test_run_option_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        options.validate()


def test_post_ahead_auto_is_step_on_gloo_and_one_on_nccl():
    assert RunOptions().resolved_post_ahead("gloo") == "step"
    assert RunOptions().resolved_post_ahead("nccl") == 1
    assert RunOptions(post_ahead=0).resolved_post_ahead("gloo") == 0
    assert RunOptions(post_ahead="step").resolved_post_ahead("nccl") == "step"


def test_post_ahead_flag_parses_counts_and_names():
    import argparse

    from runtime.cli import post_ahead

    assert post_ahead("3") == 3 and post_ahead("0") == 0
    assert post_ahead("step") == "step" and post_ahead("auto") == "auto"
    for bad in ("-1", "later", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="'step' or 'auto'"):
            post_ahead(bad)


@pytest.mark.parametrize("cores, local, local_rank, expected", [
    (2, 4, 3, (1, 2)),  # 4 ranks on 2 cores: two turns, ranks 2 and 3 in the second
    (2, 4, 1, (0, 2)),
    (1, 3, 2, (2, 3)),
    (2, 2, 1, (0, 1)),  # a core each: one turn
    (8, 2, 0, (0, 1)),
])
def test_ranks_sharing_cores_take_turns_to_profile(monkeypatch, cores, local, local_rank, expected):
    """runtime.profile.profile_turns: as many ranks of a host profile at once as it has cores."""
    import socket

    import torch.distributed as dist

    from runtime.profile import profile_turns

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        assert profile_turns(torch.device("cpu")) == expected
        assert profile_turns(torch.device("meta")) == (0, 1)  # not a CPU host: no turns
    finally:
        dist.destroy_process_group()
