"""router_and_projection: the router and a second bf16 projection of the same tokens (Kimi-K3's
gate and latent down-projection) in one op. Its router outputs are the routing of its own
logits, bit for bit, and its logits and projection are the GEMMs' within fp32 accumulation
(one bf16 rounding for the projection); the whole op contract: opcheck, compile, CUDA graphs,
streams, bad input."""

import pytest
import torch

import kimi_router_ops
from conftest import HAS_CUDA, call_in, dot_error, random_bf16, requires_kernel_gpu
from test_router import check_router, make_case

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
KIMI_K3 = dict(n=896, k=7168, latent=3584, top_k=16)


def projection_case(m, n, k, latent, top_k=4, n_group=1, topk_group=1, device="cpu", seed=0):
    x, w, bias = make_case(m, n, k, top_k, n_group, topk_group, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    p = random_bf16(latent, k, scale=k ** -0.5, generator=g, device=device)
    return x, w, p, bias


def check(out, x, w, p, bias, top_k, n_group=1, topk_group=1, renormalize=True, scale=1.0, gate_bias=None):
    weights, ids, logits, projection = out
    assert projection.shape == (x.shape[0], p.shape[0]) and projection.dtype == torch.bfloat16
    assert projection.device == x.device and projection.is_contiguous()
    # One bf16 rounding of an fp32 sum: within half an ulp of bf16 plus fp32 accumulation.
    exact = (x.double() @ p.double().t())
    assert ((projection.double() - exact).abs() <= exact.abs() * 2.0 ** -8 + 1e-3).all()
    if gate_bias is None:
        check_router((weights, ids, logits), x, w, bias, top_k, n_group, topk_group, renormalize, scale)
    else:
        assert dot_error(logits - gate_bias.float(), x, w) <= 1e-5
    # The routing is the routing op's on these very logits, bit for bit.
    ref_weights, ref_ids = kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, renormalize, scale)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 40])  # every kernel row, then the two-op path
def test_kimi_k3_front(device, m):
    s = KIMI_K3
    x, w, p, bias = projection_case(m, s["n"], s["k"], s["latent"], s["top_k"], device=device, seed=m)
    check(kimi_router_ops.router_and_projection(x, w, p, bias, s["top_k"]), x, w, p, bias, s["top_k"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 4, 16])
def test_grouped_routing_gate_bias_and_odd_shapes(device, m):
    """DeepSeek-V3's groups, a gate bias, a latent size and N that are no multiple of a CTA's
    experts, K with one 16-byte vector past a step."""
    x, w, p, bias = projection_case(m, 256, 1032, 100, 8, 8, 4, device=device, seed=m)
    gate_bias = (torch.randn(256) * 0.1).to(torch.bfloat16).to(device)
    out = kimi_router_ops.router_and_projection(x, w, p, bias, 8, 8, 4, True, 2.5, "sigmoid", gate_bias)
    check(out, x, w, p, bias, 8, 8, 4, True, 2.5, gate_bias=gate_bias)
    routed = kimi_router_ops.router(x, w, bias, 8, 8, 4, True, 2.5, "sigmoid", gate_bias)
    assert (out[2] - routed[2]).abs().max() <= 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_and_fp32_gates_take_the_two_op_path(device):
    x, w, p, bias = projection_case(3, 64, 64, 24, device=device)
    offset = random_bf16(24, 65, device=device)[:, 1:]  # rows not 16-byte aligned
    offset.copy_(p)
    check(kimi_router_ops.router_and_projection(x, w, offset, bias, 4), x, w, offset, bias, 4)
    weights, ids, logits, projection = kimi_router_ops.router_and_projection(x, w.float(), p, bias, 4)
    assert dot_error(logits, x, w) <= 1e-5
    assert torch.equal(projection, kimi_router_ops.router_and_projection(x, w, p, bias, 4)[3])


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for m in (0, 1, 3):
        x, w, p, bias = projection_case(m, 64, 96, 40, device=device)
        torch.library.opcheck(torch.ops.kimi.router_and_projection.default, (x, w, p, bias, 4, 4, 2, True, 2.5))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()
    _, w, p, bias = projection_case(1, 256, 512, 128, device=device)

    def front(x):
        return kimi_router_ops.router_and_projection(x, w, p, bias, 8, 8, 4, True, 2.5)

    compiled = torch.compile(front, fullgraph=True, dynamic=True)
    for m in (1, 3, 16, 5):
        x = random_bf16(m, 512, device=device)
        for a, b in zip(compiled(x), front(x)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_no_derivative(device):
    x, w, p, bias = projection_case(2, 16, 64, 8, device=device)
    outputs = kimi_router_ops.router_and_projection(x.requires_grad_(), w.requires_grad_(), p.requires_grad_(),
                                                    bias, 2)
    assert not any(t.requires_grad for t in outputs)


def bad_calls(device):
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    x, w, p = bf(2, 64), bf(16, 64), bf(8, 64)
    return {
        "p float32": ((x, w, p.float(), None, 2), "router_and_projection: projection_weight must be torch.bfloat16"),
        "p K mismatch": ((x, w, bf(8, 63), None, 2),
                         r"router_and_projection: projection_weight must be 2-D \[L, K\] with hidden_states' K=64"),
        "p 1-D": ((x, w, bf(64), None, 2), "projection_weight must be 2-D"),
        "p empty": ((x, w, bf(0, 64), None, 2), "projection_weight must have L >= 1 rows"),
        "x float32 with an fp32 gate": ((x.float(), w.float(), p, None, 2),
                                        "router_and_projection: hidden_states must be torch.bfloat16"),
        "router's contract": ((x, w, p, None, 17), r"router_and_projection: top_k must be in \[1, experts"),
        "gate K mismatch": ((x, bf(16, 63), p, None, 2), "router_and_projection: .* must have the same K"),
    }


@pytest.mark.parametrize("device", DEVICES + ["compiled"])
@pytest.mark.parametrize("case", list(bad_calls("cpu")))
def test_bad_input(device, case):
    args, message = bad_calls("cpu" if device == "compiled" else device)[case]
    with pytest.raises(RuntimeError, match=message):
        call_in(device, kimi_router_ops.router_and_projection, *args)
    device = "cpu" if device == "compiled" else device  # the process (and the CUDA context) is still fine
    x, w, p, bias = projection_case(2, 16, 64, 8, device=device)
    check(kimi_router_ops.router_and_projection(x, w, p, bias, 4), x, w, p, bias, 4)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_projection_on_another_device_is_an_error():
    x, w, p, _ = projection_case(2, 16, 64, 8, device="cuda")
    with pytest.raises(RuntimeError, match="hidden_states and projection_weight must be on the same device"):
        kimi_router_ops.router_and_projection(x, w, p.cpu(), None, 2)


@requires_kernel_gpu
@pytest.mark.parametrize("m", [1, 2, 8])
def test_cuda_graph_capture_and_replay_after_updates(m):
    s = KIMI_K3
    x, w, p, bias = projection_case(m, s["n"], s["k"], s["latent"], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        out = kimi_router_ops.router_and_projection(x, w, p, bias, s["top_k"])
    for seed in range(2):
        fresh = projection_case(m, s["n"], s["k"], s["latent"], device="cuda", seed=seed + 1)
        for dst, src in zip((x, w, p, bias), fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        check(out, x, w, p, bias, s["top_k"])


@requires_kernel_gpu
def test_two_streams_concurrently():
    s = KIMI_K3
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    cases = [projection_case(4, s["n"], s["k"], s["latent"], device="cuda", seed=i) for i in range(2)]
    expected = [kimi_router_ops.router_and_projection(x, w, p, b, s["top_k"]) for x, w, p, b in cases]
    torch.cuda.synchronize()
    for _ in range(20):
        outs = []
        for stream, (x, w, p, b) in zip(streams, cases):
            with torch.cuda.stream(stream):
                outs.append(kimi_router_ops.router_and_projection(x, w, p, b, s["top_k"]))
        torch.cuda.synchronize()
        for out, ref in zip(outs, expected):
            assert all(torch.equal(a, b) for a, b in zip(out, ref))


@requires_kernel_gpu
@pytest.mark.parametrize("m", [1, 2, 4])
def test_gpu_results_are_bitwise_repeatable(m):
    s = KIMI_K3
    x, w, p, bias = projection_case(m, s["n"], s["k"], s["latent"], device="cuda", seed=m)
    first = kimi_router_ops.router_and_projection(x, w, p, bias, s["top_k"])
    for _ in range(3):
        again = kimi_router_ops.router_and_projection(x, w, p, bias, s["top_k"])
        assert all(torch.equal(a, b) for a, b in zip(first, again))
