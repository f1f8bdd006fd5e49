"""rms_norm_router and fused_add_rms_norm_router: the norm in front of an MoE layer and its
router in one op. Each output is exactly what the two ops give on the same device (the norm
op's normed rows, bit for bit, then the router op's outputs on them, bit for bit); the whole
op contract: opcheck, compile, CUDA graphs, streams, bad input."""

import pytest
import torch

import kimi_router_ops
from conftest import HAS_CUDA, call_in, random_bf16, requires_kernel_gpu
from test_router import MODEL_CONFIGS, make_case

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
EPS = 1e-6


def norm_case(m, n, k, top_k=4, n_group=1, topk_group=1, bias_kind="fp32", device="cpu", seed=0):
    x, w, bias = make_case(m, n, k, top_k, n_group, topk_group, bias_kind, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    residual = random_bf16(m, k, generator=g, device=device)
    norm_weight = (1 + 0.1 * torch.randn(k, generator=g)).to(torch.bfloat16).to(device)
    return x, residual, norm_weight, w, bias


def composed(x, residual, norm_weight, w, bias, *routing, **kwargs):
    """The two ops the fused op stands for."""
    if residual is None:
        normed = kimi_router_ops.rms_norm(x, norm_weight, EPS)
        return (normed, *kimi_router_ops.router(normed, w, bias, *routing, **kwargs))
    normed, summed = kimi_router_ops.fused_add_rms_norm(x, residual, norm_weight, EPS)
    return (normed, summed, *kimi_router_ops.router(normed, w, bias, *routing, **kwargs))


def fused(x, residual, norm_weight, w, bias, *routing, **kwargs):
    if residual is None:
        return kimi_router_ops.rms_norm_router(x, norm_weight, EPS, w, bias, *routing, **kwargs)
    return kimi_router_ops.fused_add_rms_norm_router(x, residual, norm_weight, EPS, w, bias, *routing, **kwargs)


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        assert torch.equal(a, b), (a - b).abs().max() if a.is_floating_point() else "ids differ"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("add", [False, True], ids=["rms_norm", "fused_add"])
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 16, 40])  # the router's fused rows, its two-launch M
def test_model_fronts_are_the_two_ops(device, add, config, m):
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    x, residual, norm_weight, w, bias = norm_case(m, n, 7168, top_k, n_group, topk_group, device=device, seed=m)
    residual = residual if add else None
    routing = (top_k, n_group, topk_group, True, scale)
    assert_same(fused(x, residual, norm_weight, w, bias, *routing), composed(x, residual, norm_weight, w, bias,
                                                                             *routing))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("add", [False, True], ids=["rms_norm", "fused_add"])
@pytest.mark.parametrize("case", ["softmax", "sqrtsoftplus", "bf16 bias", "no bias", "gate bias", "fp32 gate",
                                  "odd K", "K tail", "hashed"])
def test_other_calls_are_the_two_ops(device, add, case):
    """Every routing option, odd and unaligned K, fp32 gates: all exactly the two ops."""
    n, k, m, kwargs, routing = 128, 2048, 3, {}, (4, 1, 1, True, 1.0)
    bias_kind = {"bf16 bias": "bf16", "no bias": None}.get(case, "fp32")
    k = {"odd K": 1001, "K tail": 1032}.get(case, k)
    x, residual, norm_weight, w, bias = norm_case(m, n, k, bias_kind=bias_kind, device=device, seed=5)
    if case in ("softmax", "sqrtsoftplus"):
        kwargs["scoring"] = case
    if case == "gate bias":
        kwargs["gate_bias"] = (torch.randn(n) * 0.1).to(torch.bfloat16).to(device)
    if case == "fp32 gate":
        w = w.float()
    if case == "hashed":
        kwargs["input_ids"] = torch.tensor([3, 0, 7], device=device)
        kwargs["hash_table"] = torch.randint(0, n, (10, 4), dtype=torch.int32, device=device)
    residual = residual if add else None
    assert_same(fused(x, residual, norm_weight, w, bias, *routing, **kwargs),
                composed(x, residual, norm_weight, w, bias, *routing, **kwargs))


@pytest.mark.parametrize("device", DEVICES)
def test_norm_is_the_norm_op_and_inputs_are_not_written(device):
    x, residual, norm_weight, w, bias = norm_case(4, 256, 1024, device=device)
    kept = x.clone(), residual.clone()
    normed, summed, *_ = kimi_router_ops.fused_add_rms_norm_router(x, residual, norm_weight, EPS, w, bias, 4)
    assert torch.equal(summed, (x.float() + residual.float()).to(torch.bfloat16))
    assert torch.equal(normed, kimi_router_ops.rms_norm(summed, norm_weight, EPS))
    assert torch.equal(x, kept[0]) and torch.equal(residual, kept[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["rms_norm_router", "fused_add_rms_norm_router"])
def test_opcheck(device, op):
    for m in (0, 1, 3):
        x, residual, norm_weight, w, bias = norm_case(m, 64, 96, device=device)
        head = (x, norm_weight) if op == "rms_norm_router" else (x, residual, norm_weight)
        torch.library.opcheck(getattr(torch.ops.kimi, op).default, (*head, EPS, w, bias, 4, 4, 2, True, 2.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("add", [False, True], ids=["rms_norm", "fused_add"])
def test_compile_fullgraph_dynamic_parity(device, add):
    torch._dynamo.reset()
    _, _, norm_weight, w, bias = norm_case(1, 256, 512, device=device)

    def front(x, residual):
        return fused(x, residual if add else None, norm_weight, w, bias, 8, 8, 4, True, 2.5)

    compiled = torch.compile(front, fullgraph=True, dynamic=True)
    for m in (1, 3, 16, 5):
        x, residual = random_bf16(m, 512, device=device), random_bf16(m, 512, device=device)
        assert_same(compiled(x, residual), front(x, residual))


@pytest.mark.parametrize("device", DEVICES)
def test_no_derivative(device):
    x, residual, norm_weight, w, bias = norm_case(2, 16, 64, device=device)
    outputs = kimi_router_ops.fused_add_rms_norm_router(x.requires_grad_(), residual, norm_weight.requires_grad_(),
                                                        EPS, w.requires_grad_(), bias, 2)
    assert not any(t.requires_grad for t in outputs)


def bad_calls(device):
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    x, nw, w = bf(2, 64), bf(64), bf(16, 64)
    op = kimi_router_ops.rms_norm_router
    add = kimi_router_ops.fused_add_rms_norm_router
    return {
        "x float32": (op, (x.float(), nw, EPS, w, None, 2), "rms_norm_router: hidden_states must be torch.bfloat16"),
        "norm_weight float32": (op, (x, nw.float(), EPS, w, None, 2),
                                "rms_norm_router: norm_weight must be torch.bfloat16"),
        "norm_weight K": (op, (x, bf(63), EPS, w, None, 2), r"rms_norm_router: norm_weight must have shape \[K\]=\[64\]"),
        "eps": (op, (x, nw, float("nan"), w, None, 2), "rms_norm_router: eps must be finite"),
        "router K": (op, (x, nw, EPS, bf(16, 63), None, 2), "rms_norm_router: .* must have the same K"),
        "top_k": (op, (x, nw, EPS, w, None, 17), r"rms_norm_router: top_k must be in \[1, experts"),
        "residual shape": (add, (x, bf(3, 64), nw, EPS, w, None, 2),
                           "fused_add_rms_norm_router: residual must have the shape of hidden_states"),
        "residual float32": (add, (x, x.float(), nw, EPS, w, None, 2),
                             "fused_add_rms_norm_router: residual must be torch.bfloat16"),
    }


@pytest.mark.parametrize("device", DEVICES + ["compiled"])
@pytest.mark.parametrize("case", list(bad_calls("cpu")))
def test_bad_input(device, case):
    op, args, message = bad_calls("cpu" if device == "compiled" else device)[case]
    with pytest.raises(RuntimeError, match=message):
        call_in(device, op, *args)
    device = "cpu" if device == "compiled" else device  # the process (and the CUDA context) is still fine
    x, residual, norm_weight, w, bias = norm_case(2, 16, 64, device=device)
    assert_same(fused(x, residual, norm_weight, w, bias, 4), composed(x, residual, norm_weight, w, bias, 4))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_norm_weight_on_another_device_is_an_error():
    x, _, norm_weight, w, _ = norm_case(2, 16, 64, device="cuda")
    with pytest.raises(RuntimeError, match="hidden_states and norm_weight must be on the same device"):
        kimi_router_ops.rms_norm_router(x, norm_weight.cpu(), EPS, w, None, 2)


@requires_kernel_gpu
@pytest.mark.parametrize("add", [False, True], ids=["rms_norm", "fused_add"])
@pytest.mark.parametrize("m", [1, 2, 8])
def test_cuda_graph_capture_and_replay_after_updates(add, m):
    n, top_k, *_ = MODEL_CONFIGS["kimi-k3"]
    x, residual, norm_weight, w, bias = norm_case(m, n, 7168, top_k, device="cuda")
    residual = residual if add else None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        out = fused(x, residual, norm_weight, w, bias, top_k)
    for seed in range(2):
        fresh = norm_case(m, n, 7168, top_k, device="cuda", seed=seed + 1)
        for dst, src in zip((x, residual, norm_weight, w, bias), fresh):
            if dst is not None:
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, composed(x, residual, norm_weight, w, bias, top_k))


@requires_kernel_gpu
def test_two_streams_concurrently():
    n, top_k, n_group, topk_group, _ = MODEL_CONFIGS["deepseek-v3"]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    cases = [norm_case(m, n, 7168, top_k, n_group, topk_group, device="cuda", seed=m) for m in (1, 4)]
    expected = [composed(*case, top_k, n_group, topk_group) for case in cases]
    torch.cuda.synchronize()
    for _ in range(20):
        outs = []
        for stream, case in zip(streams, cases):
            with torch.cuda.stream(stream):
                outs.append(fused(*case, top_k, n_group, topk_group))
        torch.cuda.synchronize()
        for out, ref in zip(outs, expected):
            assert_same(out, ref)
