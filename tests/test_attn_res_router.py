"""attn_res_router: Kimi-K3's attention residual and its router in one op. Each output is
exactly what attn_res then router give on the same device (the hidden rows bit for bit, the
writes into prefix and blocks, then the router's outputs on those rows); the whole op
contract: opcheck with the mutations, compile, CUDA graphs, streams, bad input."""

import pytest
import torch

import kimi_router_ops
from conftest import HAS_CUDA, call_in, random_bf16, requires_kernel_gpu
from test_attn_res import EPS, H, clone, make_inputs
from test_router import MODEL_CONFIGS, make_case

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
K3 = MODEL_CONFIGS["kimi-k3"]  # (experts, top_k, n_group, topk_group, scale)
ATTN_RES_ARGS = ("prefix", "delta", "blocks", "norm_weight", "qk_weight", "output_norm_weight")


def front_case(m, h=H, r=9, n=K3[0], device="cpu", seed=0, **make):
    g = torch.Generator().manual_seed(seed)
    inputs = make_inputs(m, h, r, device=device, generator=g, **make)
    _, w, bias = make_case(1, n, h, 1, 1, 1, device=device, seed=seed + 3)
    return inputs, w, bias


def attn_res_args(inputs, num_blocks, block_write_idx):
    return (*(inputs[k] for k in ATTN_RES_ARGS), num_blocks, block_write_idx, EPS, EPS)


def composed(inputs, num_blocks, block_write_idx, w, bias, *routing, **kwargs):
    """The two ops the fused op stands for."""
    hidden = kimi_router_ops.attn_res(*attn_res_args(inputs, num_blocks, block_write_idx))
    return (hidden, *kimi_router_ops.router(hidden, w, bias, *routing, **kwargs))


def fused(inputs, num_blocks, block_write_idx, w, bias, *routing, **kwargs):
    return kimi_router_ops.attn_res_router(*attn_res_args(inputs, num_blocks, block_write_idx), w, bias, *routing,
                                           **kwargs)


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        assert torch.equal(a, b), (a - b).abs().max() if a.is_floating_point() else "ids differ"


def check_front(inputs, num_blocks, block_write_idx, w, bias, *routing, **kwargs):
    """The fused op on one copy of inputs, the two ops on another: outputs and writes equal."""
    a, b = clone(inputs), clone(inputs)
    assert_same(fused(a, num_blocks, block_write_idx, w, bias, *routing, **kwargs),
                composed(b, num_blocks, block_write_idx, w, bias, *routing, **kwargs))
    assert torch.equal(a["prefix"], b["prefix"]) and torch.equal(a["blocks"], b["blocks"])
    if inputs["delta"] is not None and inputs["prefix"].numel():  # the write into prefix happened
        assert not torch.equal(a["prefix"], inputs["prefix"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 8, 16, 40])  # the router's fused rows, its two-launch M
@pytest.mark.parametrize("num_blocks,block_write_idx", [(8, -1), (8, 8), (0, 0)])
def test_kimi_k3_front_is_the_two_ops(device, m, num_blocks, block_write_idx):
    n, top_k, n_group, topk_group, scale = K3
    inputs, w, bias = front_case(m, device=device, seed=m)
    check_front(inputs, num_blocks, block_write_idx, w, bias, top_k, n_group, topk_group, True, scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["no delta", "no output norm", "softmax", "grouped", "no bias", "bf16 bias",
                                  "gate bias", "fp32 gate", "odd H", "M 0"])
def test_other_calls_are_the_two_ops(device, case):
    """Every attn_res flag and routing option, H off the kernel's range, fp32 gates, no tokens."""
    make = {"no delta": dict(delta=False), "no output norm": dict(output_norm=False)}.get(case, {})
    h = 1001 if case == "odd H" else 1024
    inputs, w, bias = front_case(0 if case == "M 0" else 3, h=h, r=4, n=256, device=device, seed=5, **make)
    routing, kwargs = (8, 1, 1, True, 1.0), {}
    if case == "softmax":
        kwargs["scoring"] = "softmax"
    if case == "grouped":
        routing = (8, 8, 4, True, 2.5)
    if case == "no bias":
        bias = None
    if case == "bf16 bias":
        bias = bias.to(torch.bfloat16)
    if case == "gate bias":
        kwargs["gate_bias"] = (torch.randn(256) * 0.1).to(torch.bfloat16).to(device)
    if case == "fp32 gate":
        w = w.float()
    check_front(inputs, 3, 3, w, bias, *routing, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_mutations(device):
    for m, nb, idx, delta in [(0, 2, -1, True), (1, 8, 8, True), (3, 2, 2, False)]:
        inputs, w, bias = front_case(m, h=96, r=9, n=64, device=device, delta=delta)
        torch.library.opcheck(torch.ops.kimi.attn_res_router.default,
                              (*attn_res_args(inputs, nb, idx), w, bias, 4, 4, 2, True, 2.5))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()
    _, w, bias = front_case(1, h=512, r=5, n=256, device=device)

    def front(prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight):
        inputs = dict(prefix=prefix, delta=delta, blocks=blocks, norm_weight=norm_weight, qk_weight=qk_weight,
                      output_norm_weight=output_norm_weight)
        return fused(inputs, 3, 3, w, bias, 8, 8, 4, True, 2.5)

    compiled = torch.compile(front, fullgraph=True, dynamic=True)
    for m in (1, 3, 16, 5):
        inputs, _, _ = front_case(m, h=512, r=5, n=256, device=device, seed=m)
        a, b = clone(inputs), clone(inputs)
        assert_same(compiled(**a), front(**b))
        assert torch.equal(a["prefix"], b["prefix"]) and torch.equal(a["blocks"], b["blocks"])


@pytest.mark.parametrize("device", DEVICES)
def test_no_derivative(device):
    inputs, w, bias = front_case(2, h=64, r=2, n=16, device=device)
    inputs["qk_weight"].requires_grad_()
    outputs = fused(inputs, 1, -1, w.requires_grad_(), bias, 2)
    assert not any(t.requires_grad for t in outputs)


def bad_calls(device):
    """name -> (changes to the inputs, router_weight or None for the good one, top_k, message)."""
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    cases = {
        "prefix float32": ({"prefix": "float"}, None, 2, "attn_res_router: prefix must be torch.bfloat16"),
        "delta shape": ({"delta": bf(3, 64)}, None, 2, r"attn_res_router: delta must have the shape of prefix"),
        "num_blocks > R": ({"num_blocks": 5}, None, 2, r"attn_res_router: num_blocks must be in \[0, R\]"),
        "router_weight H": ({}, bf(16, 63), 2, r"attn_res_router: router_weight must be 2-D \[N, H\] with prefix's "
                                                r"H=64, got \[16, 63\]"),
        "router_weight 1-D": ({}, bf(64), 2, r"attn_res_router: router_weight must be 2-D \[N, H\]"),
        "router_weight float16": ({}, bf(16, 64).half(), 2, "attn_res_router: .*router_weight"),
        "top_k": ({}, None, 17, r"attn_res_router: top_k must be in \[1, experts"),
    }
    if device == "cuda":
        cases["router_weight on the CPU"] = ({}, bf(16, 64).cpu(), 2,
                                             "attn_res_router: prefix and router_weight must be on the same device")
    return cases


@pytest.mark.parametrize("device", DEVICES + ["compiled"])
@pytest.mark.parametrize("case", list(bad_calls("cpu")))
def test_bad_input_raises_and_writes_nothing(device, case):
    run_on = "cpu" if device == "compiled" else device
    changes, bad_w, top_k, message = bad_calls(run_on)[case]
    inputs, w, bias = front_case(2, h=64, r=4, n=16, device=run_on)
    changes = dict(changes)
    num_blocks = changes.pop("num_blocks", 2)
    if changes.get("prefix") == "float":
        changes["prefix"] = inputs["prefix"].float()
    inputs.update(changes)
    before = clone(inputs)
    with pytest.raises(RuntimeError, match=message):
        call_in(device, kimi_router_ops.attn_res_router, *attn_res_args(inputs, num_blocks, 2),
                w if bad_w is None else bad_w, bias, top_k)
    for k, v in inputs.items():
        if v is not None:
            assert torch.equal(v, before[k]), k
    # The process (and the CUDA context) is still fine.
    inputs, w, bias = front_case(2, h=64, r=4, n=16, device=run_on)
    check_front(inputs, 2, 2, w, bias, 4)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_blocks_on_another_device_is_an_error():
    inputs, w, bias = front_case(2, h=64, r=4, n=16, device="cuda")
    inputs["blocks"] = inputs["blocks"].cpu()
    with pytest.raises(RuntimeError, match="attn_res_router: prefix and blocks must be on the same device"):
        fused(inputs, 2, -1, w, bias, 2)


@requires_kernel_gpu
@pytest.mark.parametrize("m", [1, 2, 8])
def test_cuda_graph_capture_and_replay_after_updates(m):
    n, top_k, *_ = K3
    inputs, w, bias = front_case(m, device="cuda")
    graph_inputs = clone(inputs)
    fused(clone(inputs), 8, 8, w, bias, top_k)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        out = fused(graph_inputs, 8, 8, w, bias, top_k)
    for seed in range(2):
        fresh, fresh_w, fresh_bias = front_case(m, device="cuda", seed=seed + 1)
        for k, v in fresh.items():
            graph_inputs[k].copy_(v)
        w.copy_(fresh_w), bias.copy_(fresh_bias)
        graph.replay()
        torch.cuda.synchronize()
        ref = clone(fresh)
        assert_same(out, composed(ref, 8, 8, w, bias, top_k))
        assert torch.equal(graph_inputs["prefix"], ref["prefix"]) and torch.equal(graph_inputs["blocks"],
                                                                                  ref["blocks"])


@requires_kernel_gpu
def test_two_streams_concurrently():
    n, top_k, *_ = K3
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    cases = [front_case(m, device="cuda", seed=m) for m in (1, 4)]
    expected = [composed(clone(inputs), 8, -1, w, bias, top_k) for inputs, w, bias in cases]
    torch.cuda.synchronize()
    for _ in range(20):
        outs = []
        for stream, (inputs, w, bias) in zip(streams, cases):
            with torch.cuda.stream(stream):
                outs.append(fused(clone(inputs), 8, -1, w, bias, top_k))
        torch.cuda.synchronize()
        for out, ref in zip(outs, expected):
            assert_same(out, ref)
