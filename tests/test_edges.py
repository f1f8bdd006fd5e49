"""Numerics at the edges, on every device present: IEEE specials, scales, zeros, one-hot."""

import pytest
import torch

import kimi_router_ops
from conftest import HAS_CUDA, TOLERANCE, random_bf16, reference, relative_error

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
SHAPES = [(1, 896, 7168), (3, 256, 7168), (16, 33, 1000), (2, 5, 7)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
def test_specials_propagate_like_ieee(device, m, n, k, special):
    x, w = random_bf16(m, k), random_bf16(n, k)
    x[m - 1, k // 2] = special  # only the last token's row is poisoned
    out = kimi_router_ops.ll_bf16_gemm(x.to(device), w.to(device)).cpu()
    ref = reference(x, w)
    # inf * w is +-inf, and +inf + -inf is nan: which positions are nan or inf does not
    # depend on the summation order.
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    assert torch.equal(out[torch.isinf(ref)], ref[torch.isinf(ref)].float())
    if m > 1:
        assert relative_error(out[: m - 1], ref[: m - 1]) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("scale", [1e-4, 100.0])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_scales(device, m, n, k, scale, out_dtype):
    x, w = random_bf16(m, k, scale=scale), random_bf16(n, k, scale=scale)
    out = kimi_router_ops.ll_bf16_gemm(x.to(device), w.to(device), out_dtype)
    assert relative_error(out, reference(x, w)) <= TOLERANCE[out_dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_zeros_give_exact_zeros(device, m, n, k):
    x = torch.zeros(m, k, dtype=torch.bfloat16, device=device)
    out = kimi_router_ops.ll_bf16_gemm(x, random_bf16(n, k, device=device))
    assert torch.equal(out, torch.zeros_like(out))
    assert not torch.signbit(out).any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_one_hot_selects_a_weight_column(device, m, n, k):
    w = random_bf16(n, k, device=device)
    x = torch.zeros(m, k, dtype=torch.bfloat16, device=device)
    columns = torch.arange(m) * 5 % k
    x[torch.arange(m), columns] = 1
    out = kimi_router_ops.ll_bf16_gemm(x, w)
    assert torch.equal(out, w[:, columns].t().float())  # one exact product per output


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_a_bias_that_is_not_finite_never_routes_silently(device, special, bias_dtype):
    """A NaN or infinite e_score_correction_bias would send every token to valid-looking
    experts (NaN: all keys equal, the lowest ids): the CPU raises, naming the expert; a GPU
    (which cannot raise without a sync) makes every weight NaN, on every path: the routing
    kernel, the reference (N > 1024), the fused router rows and the two launches."""
    for m, n, k, top_k in ((1, 256, 7168, 8), (3, 384, 7168, 8), (16, 896, 1024, 16), (40, 384, 512, 8),
                           (2, 1100, 64, 8)):
        x, w = random_bf16(m, k, device=device), random_bf16(n, k, scale=k ** -0.5, device=device)
        bias = (torch.randn(n) * 0.1).to(bias_dtype).to(device)
        bias[n // 3] = special
        calls = {"moe_routing": lambda: kimi_router_ops.moe_routing(torch.randn(m, n, device=device), bias, top_k),
                 "router": lambda: kimi_router_ops.router(x, w, bias, top_k)}
        for op, call in calls.items():
            if device == "cpu":
                with pytest.raises(RuntimeError, match=f"{op}: e_score_correction_bias must be finite, got "
                                                       f"{special} at {n // 3}"):
                    call()
            else:
                weights = call()[0]
                assert weights.isnan().all(), (op, m, n)
    # A hash-routed layer does not read the bias.
    logits = torch.randn(2, 256, device=device)
    table = torch.arange(6, device=device)[None].repeat(4, 1)
    weights, _ = kimi_router_ops.moe_routing(logits, torch.full((256,), special, device=device), 6,
                                             scoring="sqrtsoftplus",
                                             input_ids=torch.tensor([0, 3], device=device), hash_table=table)
    assert weights.isfinite().all()
