"""router_gemm and router: fp32 gate weights (bf16 or fp32 tokens) and the gate's own bias,
on every device present: numerics against float64, the dispatch, opcheck, autograd,
torch.compile, CUDA graphs, streams and bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops import tables
from conftest import HAS_CUDA, random_bf16, requires_kernel_gpu
from test_router import check_router

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# fp32-gate models (vLLM 0.33): MiniMax-M2 and M3, Hunyuan-v3-sized, the K3-sized worst case;
# gpt-oss-120b's biased bf16 gate.
FP32_SHAPES = {"minimax-m2": (256, 3072), "minimax-m3": (128, 6144), "6144x256": (256, 6144), "7168x256": (256, 7168)}
GPT_OSS = (128, 2880)


def gate_case(m, n, k, x_dtype=torch.bfloat16, w_dtype=torch.float32, bias=False, device="cpu", seed=0,
              scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * scale).to(x_dtype).to(device)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(w_dtype).to(device)
    b = (torch.randn(n, generator=g) * 0.1).to(w_dtype).to(device) if bias else None
    return x, w, b


def linear_error(out, x, w, b=None):
    """Worst |out - (x wᵀ + b)| over (sum_k |x_k w_k| + |b|), in float64 on the CPU."""
    out = out.double().cpu()
    assert torch.isfinite(out).all(), "non-finite output"
    x, w = x.double().cpu(), w.double().cpu()
    ref, scale = x @ w.t(), x.abs() @ w.abs().t()
    if b is not None:
        ref, scale = ref + b.double().cpu(), scale + b.double().cpu().abs()
    return ((out - ref).abs() / scale.clamp_min(1e-300)).max().item() if out.numel() else 0.0


# The accuracy an fp32 gate is kept for: fp32 products and sums, 1e-6 of the products' scale
# at every K up to 8192 (bf16 weights would be 1e-4 off).
FP32_GATE_TOLERANCE = 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", list(FP32_SHAPES))
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 16, 17, 64, 65, 200])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_fp32_weights_model_shapes(device, shape, m, x_dtype):
    n, k = FP32_SHAPES[shape]
    x, w, _ = gate_case(m, n, k, x_dtype, device=device, seed=m)
    out = kimi_router_ops.router_gemm(x, w)
    assert out.shape == (m, n) and out.dtype == torch.float32 and out.device == x.device
    assert linear_error(out, x, w) <= FP32_GATE_TOLERANCE


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_gate_bias(device, w_dtype, out_dtype, m):
    n, k = GPT_OSS
    x, w, b = gate_case(m, n, k, w_dtype=w_dtype, bias=True, device=device, seed=m)
    out = kimi_router_ops.router_gemm(x, w, b, out_dtype)
    assert out.dtype == out_dtype
    tolerance = 2 ** -8 if out_dtype == torch.bfloat16 else 1e-5
    assert linear_error(out, x, w, b) <= tolerance
    if out_dtype == torch.float32 and w_dtype == torch.bfloat16:
        # The bias is added to the GEMM's own fp32 logits, in fp32.
        assert torch.equal(out, kimi_router_ops.ll_bf16_gemm(x, w) + b.float())


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(0, 80),
    n=st.integers(1, 600),
    k=st.integers(1, 8192),
    x_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    bias=st.booleans(),
    offset=st.integers(0, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_fp32_weights(m, n, k, x_dtype, bias, offset, seed):
    """Any shape on every device; offsets make misaligned rows (the cuBLAS path on a GPU)."""
    for device in DEVICES:
        x, w, b = gate_case(m, n, k + offset, x_dtype, bias=bias, device=device, seed=seed)
        x, w = x[:, offset:], w[:, offset:]
        out = kimi_router_ops.router_gemm(x, w, b)
        assert out.shape == (m, n)
        assert linear_error(out, x, w, b) <= FP32_GATE_TOLERANCE * (1 if not bias else 10)


def test_dispatch_by_weight_dtype():
    f32 = torch.float32
    assert kimi_router_ops.chosen_variant(1, 256, 3072, weight_dtype=f32) == "f32w_m1_r2_u4_t256:vec4"
    assert kimi_router_ops.chosen_variant(1, 128, 6144, weight_dtype=f32) == "f32w_m1_r1_u8_t256:vec4"
    assert kimi_router_ops.chosen_variant(2, 256, 3072, weight_dtype=f32) == "f32w_m4_r2_u4_t256:vec4"
    assert kimi_router_ops.chosen_variant(2, 256, 6144, weight_dtype=f32) == "f32w_m2_r1_u8_t256:vec4"
    assert kimi_router_ops.chosen_variant(16, 128, 6144, weight_dtype=f32) == "f32w_m8_r2_u2_t256:vec4"
    assert kimi_router_ops.chosen_variant(64, 128, 6144, weight_dtype=f32) == "f32w_m8_r2_u2_t256:vec4"
    assert kimi_router_ops.chosen_variant(64, 256, 3072, weight_dtype=f32) == "f32w_m16_r2_u2_t128:vec4"
    assert kimi_router_ops.chosen_variant(65, 256, 3072, weight_dtype=f32) == "cublas"
    assert kimi_router_ops.chosen_variant(1, 256, 3070, weight_dtype=f32) == "cublas"  # K % 4 != 0
    assert kimi_router_ops.chosen_variant(1, 256, 3072, weight_dtype=f32, aligned=False) == "cublas"
    assert kimi_router_ops.chosen_variant(1, 256, 3072, sm=80, weight_dtype=f32) == "cublas"
    # bf16 weights: the bf16 table, untouched.
    assert kimi_router_ops.chosen_variant(1, 256, 3072) == "m1_prefetch_r4_t256:vec8"
    for m in range(1, 17):
        row = kimi_router_ops.chosen_router_variant(m, 256, 3072, 8, weight_dtype=f32)
        assert row.startswith("router_f32w_"), (m, row)
        assert kimi_router_ops.chosen_router_variant(m, 256, 3072, 8, weight_dtype=f32, x_dtype=f32) == "gemm+moe_routing"
    assert kimi_router_ops.chosen_router_variant(17, 256, 3072, 8, weight_dtype=f32) == "gemm+moe_routing"


def test_fp32_choices_are_fp32_rows():
    for c in tables.gemm.CHOICES:
        if c.variant != "cublas":
            assert tables.gemm.variant(c.variant).kernel.weight_dtype == c.weight_dtype, c
    for r in tables.router.ROUTER_VARIANTS:
        assert r.m_hi <= tables.gemm.variant(r.gemm).max_m


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    samples = [
        gate_case(3, 40, 64, device=device),
        gate_case(1, 256, 3072, torch.float32, device=device),
        gate_case(5, 9, 30, bias=True, device=device),
        gate_case(2, 16, 64, w_dtype=torch.bfloat16, bias=True, device=device),
        gate_case(0, 16, 64, device=device),
    ]
    for x, w, b in samples:
        torch.library.opcheck(torch.ops.kimi.router_gemm.default, (x, w, b, torch.float32))
    x, w, b = gate_case(4, 64, 96, bias=True, device=device)
    bias = torch.randn(64, device=device) * 0.1
    torch.library.opcheck(torch.ops.kimi.router.default, (x, w, bias, 6, 4, 2, True, 2.5, "sigmoid", b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
def test_autograd(device, w_dtype):
    x, w, b = gate_case(3, 20, 64, w_dtype=w_dtype, bias=True, device=device)
    x, w, b = (t.detach().float().requires_grad_() if t.dtype == torch.float32 else t.detach().requires_grad_()
               for t in (x, w, b))
    kimi_router_ops.router_gemm(x, w, b).pow(2).sum().backward()
    refs = [t.detach().float().requires_grad_() for t in (x, w, b)]
    torch.nn.functional.linear(*refs).pow(2).sum().backward()
    for t, ref in zip((x, w, b), refs):
        assert t.grad.dtype == t.dtype
        torch.testing.assert_close(t.grad.float(), ref.grad, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()

    def gate(x, w, b, bias):
        logits = kimi_router_ops.router_gemm(x, w, b)
        weights, ids, _ = kimi_router_ops.router(x, w, bias, 8, scoring="sigmoid", gate_bias=b)
        return logits, weights, ids

    compiled = torch.compile(gate, fullgraph=True, dynamic=True)
    for m in (1, 3, 16):
        x, w, b = gate_case(m, 256, 3072, bias=True, device=device, seed=m)
        bias = torch.randn(256, device=device) * 0.01
        for got, want in zip(compiled(x, w, b, bias), gate(x, w, b, bias)):
            assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 4, 16, 30])
def test_fp32_router_minimax_m2(device, m):
    """MiniMax-M2: fp32 gate, sigmoid + e_score_correction_bias, top-8, no groups."""
    n, k = FP32_SHAPES["minimax-m2"]
    x, w, _ = gate_case(m, n, k, device=device, seed=m)
    bias = (torch.randn(n) * 0.1).to(device)
    out = kimi_router_ops.router(x, w, bias, 8, 1, 1, True, 1.0)
    check_router(out, x, w, bias, 8, 1, 1, True, 1.0)
    assert linear_error(out[2], x, w) <= FP32_GATE_TOLERANCE
    # The fused rows run the GEMM op's kernels: the same logits, bit for bit.
    assert torch.equal(out[2], kimi_router_ops.router_gemm(x, w))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 8, 16])
def test_gpt_oss_router_in_one_call(device, m):
    """gpt-oss: logits = x Wᵀ + b, top-4 of the logits, softmax over the four (transformers'
    GptOssTopKRouter); ours: softmax over all, top-4, renormalized: the same weights."""
    n, k = GPT_OSS
    x, w, b = gate_case(m, n, k, w_dtype=torch.bfloat16, bias=True, device=device, seed=m)
    weights, ids, logits = kimi_router_ops.router(x, w, None, 4, scoring="softmax", gate_bias=b)
    assert linear_error(logits, x, w, b) <= 1e-5
    ref = x.double().cpu() @ w.double().cpu().t() + b.double().cpu()
    top, top_ids = ref.topk(4, dim=-1)
    assert torch.equal(ids.cpu().long(), top_ids)
    torch.testing.assert_close(weights.cpu().double(), top.softmax(-1), rtol=1e-5, atol=1e-6)


@requires_kernel_gpu
def test_gpt_oss_router_is_one_launch():
    for m in range(1, 17):
        assert kimi_router_ops.chosen_router_variant(m, *GPT_OSS, 4, scoring="softmax").startswith("router_"), m


@requires_kernel_gpu
@pytest.mark.parametrize("row", [r for r in tables.router.ROUTER_VARIANTS if r.weight_dtype == "float32"],
                         ids=lambda r: r.name)
def test_every_fp32_router_row_with_a_gate_bias(row):
    for n in sorted({row.n_min, min(row.n_max, 300)}):
        if n < 8:
            continue
        for m in sorted({row.m_lo, row.m_hi}):
            x, w, b = gate_case(m, n, 3072, bias=True, device="cuda", seed=m)
            bias = (torch.randn(n) * 0.1).cuda()
            args = (8, 1, 1, True, 1.0)
            out = kimi_router_ops.router(x, w, bias, *args, gate_bias=b)
            assert linear_error(out[2], x, w, b) <= 10 * FP32_GATE_TOLERANCE
            forced = kimi_router_ops.router_with_variant(x, w, bias, *args, row.name)
            assert torch.equal(forced[2], kimi_router_ops.router_gemm_with_variant(x, w, row.gemm))
            # With the gate bias: the logits of F.linear, routed as the routing op routes them.
            forced = kimi_router_ops.router_with_variant(x, w, bias, *args, row.name, gate_bias=b)
            assert linear_error(forced[2], x, w, b) <= 10 * FP32_GATE_TOLERANCE
            weights, ids = kimi_router_ops.moe_routing(forced[2], bias, *args)
            assert torch.equal(ids, forced[1]) and torch.equal(weights, forced[0])
            if kimi_router_ops.chosen_router_variant(m, n, 3072, 8, weight_dtype=torch.float32) == row.name:
                assert all(torch.equal(a, c) for a, c in zip(forced, out))


@requires_kernel_gpu
def test_cuda_graph_and_side_stream():
    x, w, b = gate_case(4, 256, 3072, bias=True, device="cuda")
    bias = (torch.randn(256) * 0.1).cuda()

    def run():
        return kimi_router_ops.router_gemm(x, w, b), *kimi_router_ops.router(x, w, bias, 8, gate_bias=b)

    eager = run()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    x.copy_(x.flip(0))
    graph.replay()
    fresh = run()
    torch.cuda.synchronize()
    for a, c in zip(eager, on_side):
        assert torch.equal(a, c)
    for a, c in zip(fresh, captured):
        assert torch.equal(a, c)


def bad_calls(device):
    x, w, b = gate_case(2, 8, 16, device=device)
    yield "fp16 weights", (x, w.half(), None), "router_weight must be torch.bfloat16 or torch.float32, got torch.float16"
    yield "fp16 tokens", (x.half(), w, None), "hidden_states must be torch.bfloat16 or torch.float32, got torch.float16"
    yield "fp32 tokens, bf16 weights", (x.float(), w.bfloat16(), None), "bf16 router_weight takes bf16 hidden_states"
    yield "bias dtype", (x, w, torch.zeros(8, dtype=torch.bfloat16, device=device)), \
        "bias must have router_weight's dtype torch.float32, got torch.bfloat16"
    yield "bias shape", (x, w, torch.zeros(7, device=device)), r"bias must have shape \[N\]=\[8\], got \[7\]"
    yield "bias rank", (x, w, torch.zeros(1, 8, device=device)), r"bias must have shape \[N\]=\[8\]"
    yield "K mismatch", (x[:, :15], w, None), "must have the same K"
    yield "1-D tokens", (x[0], w, None), r"hidden_states must be 2-D \[M, K\]"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c[0] for c in bad_calls("cpu")])
def test_bad_input(device, case):
    _, args, match = next(c for c in bad_calls(device) if c[0] == case)
    with pytest.raises(RuntimeError, match=match):
        kimi_router_ops.router_gemm(*args)
    # router has two biases: its messages name the gate's by its argument, gate_bias.
    with pytest.raises(RuntimeError, match=match.replace("bias must", "router: gate_bias must", 1)
                       if match.startswith("bias") else match):
        kimi_router_ops.router(args[0], args[1], None, 2, gate_bias=args[2])


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_mixed_devices_are_an_error():
    x, w, b = gate_case(2, 8, 16, bias=True)
    with pytest.raises(RuntimeError, match="hidden_states and router_weight must be on the same device"):
        kimi_router_ops.router_gemm(x, w.cuda())
    with pytest.raises(RuntimeError, match="bias must be on the device of router_weight"):
        kimi_router_ops.router_gemm(x.cuda(), w.cuda(), b)
    assert kimi_router_ops.router_gemm(x.cuda(), w.cuda(), b.cuda()).is_cuda  # still usable
