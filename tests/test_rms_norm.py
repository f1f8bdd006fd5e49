"""rms_norm and fused_add_rms_norm: the exact formula, F.rms_norm, opcheck, torch.compile,
CUDA graphs and bad input."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from conftest import HAS_CUDA, call_in, random_bf16, requires_kernel_gpu

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def formula(x, weight, eps):
    """The documented formula, in float64 up to the one rounding to bf16."""
    xd = x.double().cpu()
    r = torch.rsqrt(xd.square().mean(-1, keepdim=True) + eps)
    return (xd * r * weight.double().cpu()).to(torch.bfloat16)


def ulps(a, b):
    """Distance in bf16 units in the last place (same-sign finite values)."""
    ai = a.cpu().view(torch.int16).int()
    bi = b.cpu().view(torch.int16).int()
    return (ai - bi).abs().max().item() if a.numel() else 0


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 16), k=st.integers(1, 9000), scale=st.floats(1e-3, 1e3),
       eps=st.sampled_from([1e-6, 1e-5, 0.0]), seed=st.integers(0, 2**31 - 1))
def test_formula_and_f_rms_norm_within_one_ulp(m, k, scale, eps, seed):
    g = torch.Generator().manual_seed(seed)
    x = random_bf16(m, k, scale=scale, generator=g)
    weight = random_bf16(k, generator=g)
    out = kimi_router_ops.rms_norm(x, weight, eps)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert ulps(out, formula(x, weight, eps)) <= 1
    assert ulps(out, F.rms_norm(x, (k,), weight, eps)) <= 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 4, 16])
def test_model_shape(device, m):
    x, weight = random_bf16(m, 7168, device=device), random_bf16(7168, device=device)
    out = kimi_router_ops.rms_norm(x, weight, 1e-6)
    assert out.device == x.device
    assert ulps(out, formula(x, weight, 1e-6)) <= 1
    assert ulps(out, F.rms_norm(x, (7168,), weight, 1e-6)) <= 1
    assert torch.equal(out, kimi_router_ops.rms_norm(x, weight, 1e-6))  # repeatable


@pytest.mark.parametrize("device", DEVICES)
def test_fused_add_is_the_rounded_sum_then_the_norm(device):
    x, residual = random_bf16(5, 7168, device=device), random_bf16(5, 7168, device=device)
    weight = random_bf16(7168, device=device)
    x_before, residual_before = x.clone(), residual.clone()
    normed, residual_out = kimi_router_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(residual_out, (x.float() + residual.float()).to(torch.bfloat16))
    assert torch.equal(normed, kimi_router_ops.rms_norm(residual_out, weight, 1e-6))
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # functional


def test_zero_rows_give_zeros():
    weight = random_bf16(64)
    out = kimi_router_ops.rms_norm(torch.zeros(2, 64, dtype=torch.bfloat16), weight, 1e-6)
    assert torch.equal(out, torch.zeros(2, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for m, k in [(1, 7168), (3, 100), (0, 8), (16, 1)]:
        x, residual, weight = (random_bf16(m, k, device=device), random_bf16(m, k, device=device),
                               random_bf16(k, device=device))
        torch.library.opcheck(torch.ops.kimi.rms_norm.default, (x, weight, 1e-6))
        torch.library.opcheck(torch.ops.kimi.fused_add_rms_norm.default, (x, residual, weight, 1e-5))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()
    weight = random_bf16(512, device=device)

    def block(x, residual):
        normed, residual = kimi_router_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
        return kimi_router_ops.rms_norm(normed, weight, 1e-6), residual

    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for m in (1, 3, 16, 2):
        x, residual = random_bf16(m, 512, device=device), random_bf16(m, 512, device=device)
        for a, b in zip(compiled(x, residual), block(x, residual)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_no_derivative(device):
    x = random_bf16(2, 64, device=device).requires_grad_()
    w = random_bf16(64, device=device).requires_grad_()
    out = kimi_router_ops.rms_norm(x, w, 1e-6)
    normed, summed = kimi_router_ops.fused_add_rms_norm(x, x, w, 1e-6)
    assert not (out.requires_grad or normed.requires_grad or summed.requires_grad)
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.float().sum().backward()


def bad_norm_calls(device):
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    x, w = bf(2, 64), bf(64)
    return {
        "x float32": ("rms_norm", (x.float(), w, 1e-6), RuntimeError, "rms_norm: x must be torch.bfloat16, got torch.float32"),
        "weight float32": ("rms_norm", (x, w.float(), 1e-6), RuntimeError, "weight must be torch.bfloat16"),
        "x 1-D": ("rms_norm", (bf(64), w, 1e-6), RuntimeError, r"x must be 2-D \[M, K\]"),
        "x 3-D": ("rms_norm", (bf(1, 2, 64), w, 1e-6), RuntimeError, "x must be 2-D"),
        "K zero": ("rms_norm", (bf(2, 0), bf(0), 1e-6), RuntimeError, "K must be at least 1"),
        "weight wrong length": ("rms_norm", (x, bf(63), 1e-6), RuntimeError, r"weight must have shape \[K\]=\[64\]"),
        "weight 2-D": ("rms_norm", (x, bf(1, 64), 1e-6), RuntimeError, "weight must have shape"),
        "eps negative": ("rms_norm", (x, w, -1.0), RuntimeError, "eps must be finite and >= 0, got -1"),
        "eps nan": ("rms_norm", (x, w, float("nan")), RuntimeError, "eps must be finite"),
        "residual float32": ("fused_add_rms_norm", (x, x.float(), w, 1e-6), RuntimeError, "fused_add_rms_norm: residual must be torch.bfloat16"),
        "residual shape": ("fused_add_rms_norm", (x, bf(3, 64), w, 1e-6), RuntimeError, "residual must have the shape of x"),
        "fused x float16": ("fused_add_rms_norm", (x.half(), x, w, 1e-6), RuntimeError, "fused_add_rms_norm: x must be torch.bfloat16"),
    }


@pytest.mark.parametrize("device", DEVICES + ["compiled"])
@pytest.mark.parametrize("case", list(bad_norm_calls("cpu")))
def test_bad_input(device, case):
    op, args, error, message = bad_norm_calls("cpu" if device == "compiled" else device)[case]
    with pytest.raises(error, match=message):
        call_in(device, getattr(kimi_router_ops, op), *args)
    device = "cpu" if device == "compiled" else device
    x, w = random_bf16(2, 64, device=device), random_bf16(64, device=device)  # still usable
    assert ulps(kimi_router_ops.rms_norm(x, w, 1e-6), formula(x, w, 1e-6)) <= 1


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_device_mix_is_an_error():
    x = random_bf16(2, 64, device="cuda")
    with pytest.raises(RuntimeError, match="x and weight must be on the same device"):
        kimi_router_ops.rms_norm(x, random_bf16(64), 1e-6)
    with pytest.raises(RuntimeError, match="x and residual must be on the same device"):
        kimi_router_ops.fused_add_rms_norm(x, random_bf16(2, 64), random_bf16(64, device="cuda"), 1e-6)


@requires_kernel_gpu
def test_cuda_graph_replay_sees_updated_inputs():
    x, residual, weight = random_bf16(4, 7168, device="cuda"), random_bf16(4, 7168, device="cuda"), random_bf16(7168, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        normed, residual_out = kimi_router_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
    for _ in range(3):
        x.copy_(random_bf16(4, 7168, device="cuda"))
        residual.copy_(random_bf16(4, 7168, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        expected = kimi_router_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
        assert torch.equal(normed, expected[0]) and torch.equal(residual_out, expected[1])


def gpu_and_cpu(op, *tensors, eps):
    """The op on the GPU and its CPU reference on the same values."""
    fn = getattr(kimi_router_ops, op)
    out, ref = fn(*tensors, eps), fn(*(t.cpu() for t in tensors), eps)
    return ((out,), (ref,)) if op == "rms_norm" else (out, ref)


@requires_kernel_gpu
@settings(max_examples=80, deadline=None)
@given(m=st.integers(0, 16), k=st.integers(1, 9000), offset=st.sampled_from([0, 0, 1]),
       scale=st.floats(1e-3, 1e3), eps=st.sampled_from([1e-6, 1e-5, 0.0]),
       fused=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_property_cuda_kernel_matches_the_reference(m, k, offset, scale, eps, fused, seed):
    """The kernel (16-byte loads where K and the pointers allow, scalar loads otherwise: an
    odd K or a view one element in) against the CPU reference: the sum s bitwise, the norm
    within one bf16 ulp (its sum of squares is added in another order), and F.rms_norm."""
    g = torch.Generator().manual_seed(seed)
    x = random_bf16(m, k + offset, scale=scale, generator=g).cuda()[:, offset:]
    residual = random_bf16(m, k, scale=scale, generator=g).cuda()
    weight = random_bf16(k, generator=g).cuda()
    if fused:
        out, ref = gpu_and_cpu("fused_add_rms_norm", x, residual, weight, eps=eps)
        assert torch.equal(out[1].cpu(), ref[1])
        normed_input = ref[1]
    else:
        out, ref = gpu_and_cpu("rms_norm", x, weight, eps=eps)
        normed_input = x.cpu()
    assert out[0].shape == (m, k) and out[0].dtype == torch.bfloat16 and out[0].is_contiguous()
    assert ulps(out[0], ref[0]) <= 1
    assert ulps(out[0], F.rms_norm(normed_input, (k,), weight.cpu(), eps)) <= 1


@requires_kernel_gpu
@pytest.mark.parametrize("m", [1, 16])
def test_cuda_kernel_mostly_bitwise_equal_to_the_reference(m):
    """Where the sums of squares round alike (almost always), the outputs are the same bits."""
    x, weight = random_bf16(m, 7168, device="cuda"), random_bf16(7168, device="cuda")
    out = kimi_router_ops.rms_norm(x, weight, 1e-6).cpu()
    ref = kimi_router_ops.rms_norm(x.cpu(), weight.cpu(), 1e-6)
    assert ulps(out, ref) <= 1
    assert (out != ref).float().mean().item() < 0.01


@requires_kernel_gpu
def test_cuda_kernel_bitwise_deterministic_and_functional():
    x, residual = random_bf16(16, 7168, device="cuda"), random_bf16(16, 7168, device="cuda")
    weight = random_bf16(7168, device="cuda")
    before = (x.clone(), residual.clone())
    first = kimi_router_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
    for _ in range(10):
        again = kimi_router_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    assert torch.equal(x, before[0]) and torch.equal(residual, before[1])


@requires_kernel_gpu
def test_cuda_non_contiguous_inputs():
    base = random_bf16(7168, 4, device="cuda")
    x = base.t()  # [4, 7168], stride along K is 4: copied once to a unit stride
    weight = random_bf16(2 * 7168, device="cuda")[::2]
    out = kimi_router_ops.rms_norm(x, weight, 1e-6)
    assert ulps(out, formula(x, weight, 1e-6)) <= 1


@requires_kernel_gpu
def test_cuda_graph_capture_as_first_call_in_fresh_process():
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import torch, kimi_router_ops
        x = torch.randn(2, 7168, device="cuda").bfloat16()
        r = torch.randn(2, 7168, device="cuda").bfloat16()
        w = torch.rand(7168, device="cuda").bfloat16()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # the op's very first call: kernels load inside capture
            normed, summed = kimi_router_ops.fused_add_rms_norm(x, r, w, 1e-6)
        graph.replay()
        torch.cuda.synchronize()
        ref = kimi_router_ops.fused_add_rms_norm(x.cpu(), r.cpu(), w.cpu(), 1e-6)
        assert torch.equal(summed.cpu(), ref[1])
        diff = (normed.cpu().view(torch.int16).int() - ref[0].view(torch.int16).int()).abs().max()
        assert diff <= 1, diff
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


@requires_kernel_gpu
@pytest.mark.parametrize("m", [1, 4])
def test_norm_then_router_in_a_graph(m):
    """The producer -> router pair as a model runs it (both PDL-launched, one stream, one
    graph): the router reads the norm's output, never a stale one."""
    k, n = 7168, 384
    x, residual = random_bf16(m, k, device="cuda"), random_bf16(m, k, device="cuda")
    norm_weight, w = random_bf16(k, device="cuda"), random_bf16(n, k, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        hidden, _ = kimi_router_ops.fused_add_rms_norm(x, residual, norm_weight, 1e-6)
        logits = kimi_router_ops.ll_bf16_gemm(hidden, w)
    for _ in range(20):
        x.copy_(random_bf16(m, k, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        expected = kimi_router_ops.ll_bf16_gemm(kimi_router_ops.fused_add_rms_norm(x, residual, norm_weight, 1e-6)[0], w)
        assert torch.equal(logits, expected)
