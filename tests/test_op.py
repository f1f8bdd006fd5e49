"""The op on every device present: opcheck, numerics, torch.compile, autograd."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from conftest import HAS_CUDA, TOLERANCE, assert_gemm_close, random_bf16, reference, relative_error

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
OUT_DTYPES = [torch.float32, torch.bfloat16]


def sample_inputs(device):
    """(hidden_states, router_weight, out_dtype) covering the layouts the op accepts."""
    samples = []
    for m, n, k in [(1, 256, 7168), (4, 384, 512), (16, 33, 96), (20, 17, 40), (3, 5, 7), (0, 8, 16)]:
        for out_dtype in OUT_DTYPES:
            samples.append((random_bf16(m, k, device=device), random_bf16(n, k, device=device), out_dtype))
    wide = random_bf16(4, 80, device=device)
    samples.append((wide[:, 8:72], random_bf16(24, 64, device=device), torch.float32))  # row stride 80
    samples.append((random_bf16(64, 6, device=device).t(), random_bf16(9, 64, device=device), torch.float32))
    samples.append((random_bf16(2, 65, device=device)[:, 1:], random_bf16(9, 64, device=device), torch.float32))
    return samples


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for x, w, out_dtype in sample_inputs(device):
        torch.library.opcheck(torch.ops.kimi.ll_bf16_gemm.default, (x, w, out_dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_grad(device):
    x = random_bf16(3, 64, device=device).requires_grad_()
    w = random_bf16(10, 64, device=device).requires_grad_()
    torch.library.opcheck(torch.ops.kimi.ll_bf16_gemm.default, (x, w, torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_samples_match_reference(device):
    for x, w, out_dtype in sample_inputs(device):
        out = kimi_router_ops.ll_bf16_gemm(x, w, out_dtype)
        assert out.shape == (x.shape[0], w.shape[0]) and out.dtype == out_dtype
        assert out.device == x.device
        if x.shape[0]:
            assert relative_error(out, reference(x, w)) <= TOLERANCE[out_dtype]


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 64),
    n=st.integers(1, 1024),
    k=st.integers(1, 8192),
    scale=st.floats(1e-4, 1e2),
    out_dtype=st.sampled_from(OUT_DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_cpu(m, n, k, scale, out_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = random_bf16(m, k, scale=scale, generator=g)
    w = random_bf16(n, k, generator=g)
    out = kimi_router_ops.ll_bf16_gemm(x, w, out_dtype)
    assert_gemm_close(out, x, w, out_dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_m(device):
    out = kimi_router_ops.ll_bf16_gemm(random_bf16(0, 64, device=device), random_bf16(5, 64, device=device))
    assert out.shape == (0, 5) and out.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_parity(device):
    torch._dynamo.reset()

    def router(x, w):
        logits = kimi_router_ops.ll_bf16_gemm(x, w)
        return logits, torch.sigmoid(logits)

    compiled = torch.compile(router, fullgraph=True, dynamic=True)
    w = random_bf16(48, 128, device=device)
    for m in (1, 3, 9):
        x = random_bf16(m, 128, device=device)
        (logits, scores), (logits_ref, scores_ref) = compiled(x, w), router(x, w)
        assert torch.equal(logits, logits_ref)  # the same kernel runs in both
        torch.testing.assert_close(scores, scores_ref)  # inductor's sigmoid may differ by an ulp


def test_compile_reports_bad_input_like_eager():
    torch._dynamo.reset()
    compiled = torch.compile(kimi_router_ops.ll_bf16_gemm, fullgraph=True)
    with pytest.raises(Exception, match="must have the same K"):
        compiled(random_bf16(2, 64), random_bf16(4, 32))


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_matches_float_reference(device):
    x = random_bf16(5, 96, device=device).requires_grad_()
    w = random_bf16(12, 96, device=device).requires_grad_()
    grad = torch.randn(5, 12, device=device)
    kimi_router_ops.ll_bf16_gemm(x, w).backward(grad)
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    (xr @ wr.t()).backward(grad.double())
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert relative_error(x.grad, xr.grad.cpu()) <= TOLERANCE[torch.bfloat16]
    assert relative_error(w.grad, wr.grad.cpu()) <= TOLERANCE[torch.bfloat16]


def test_forced_variant_names_are_checked():
    x, w = random_bf16(1, 64), random_bf16(4, 64)
    with pytest.raises(RuntimeError, match="unknown variant 'nope'"):
        kimi_router_ops.router_gemm_with_variant(x, w, "nope")
    torch.testing.assert_close(
        kimi_router_ops.router_gemm_with_variant(x, w, "m1_r4_t256"), kimi_router_ops.ll_bf16_gemm(x, w)
    )
