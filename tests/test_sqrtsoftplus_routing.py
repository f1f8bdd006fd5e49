"""DeepSeek-V4's scores, scoring="sqrtsoftplus": scores = sqrt(softplus(logits)) (softplus(x) =
x above 20, else log(1 + e^x)), choice = scores + bias, top-k, weights from the scores,
renormalized and scaled (vLLM 0.33's reference formula), in the routing op and the router op
(fused kernels, bf16 and fp32 gates): against the float64 formula, for large |logits|, under
hypothesis, and the routing op against the fused router bit for bit."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from conftest import HAS_CUDA, requires_kernel_gpu
from test_moe_routing import check, make_logits, routing_problems
from test_router import check_router, fused_router_problems, make_case

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
SCORING = "sqrtsoftplus"
# name: (K, N experts, top_k, routed_scaling_factor): DeepSeek-V4-Pro's router (hidden 7168,
# 384 experts, top-6) and V4-Flash's experts (256, top-6) at hidden 4096.
DSV4_CONFIGS = {"deepseek-v4-pro": (7168, 384, 6, 2.5), "deepseek-v4-flash": (4096, 256, 6, 1.5)}


def vllm_formula(logits, bias, top_k, renormalize, scale):
    """vLLM's test reference for topk_softplus_sqrt, in float64."""
    scores = F.softplus(logits.double().cpu()).sqrt()
    choice = scores + (bias.double().cpu() if bias is not None else 0.0)
    ids = choice.topk(top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights * scale, ids


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(DSV4_CONFIGS))
@pytest.mark.parametrize("m", [1, 4, 16, 64])
def test_deepseek_v4_router_matches_vllms_formula(device, config, m):
    k, n, top_k, scale = DSV4_CONFIGS[config]
    x, w, bias = make_case(m, n, k, top_k, 1, 1, device=device, seed=m)
    weights, ids, logits = kimi_router_ops.router(x, w, bias, top_k, routed_scaling_factor=scale, scoring=SCORING)
    check_router((weights, ids, logits), x, w, bias, top_k, 1, 1, True, scale, SCORING)
    ref_w, ref_ids = vllm_formula(logits, bias, top_k, True, scale)
    assert torch.equal(ids.long().cpu().sort(1)[0], ref_ids.sort(1)[0])
    torch.testing.assert_close(weights.double().cpu().sort(1)[0], ref_w.sort(1)[0], rtol=1e-5, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_large_and_tiny_logits_stay_exact(device):
    """softplus(x) = x above 20 (no overflow at 100), and e^x far below 1 keeps its digits
    (log(1 + e^x) would round to 0 at x = -30)."""
    logits = torch.tensor([[100.0, 30.0, 20.5, 19.5, 0.0, -10.0, -30.0, -60.0]], device=device)
    bias = torch.tensor([0.0] * 5 + [0.1, 0.2, 0.3], device=device)  # the tiny scores win by bias
    for top_k in (3, 8):
        weights, ids = kimi_router_ops.moe_routing(logits, bias, top_k, renormalize=False, scoring=SCORING)
        ref_w, ref_ids = vllm_formula(logits, bias, top_k, False, 1.0)
        assert torch.equal(ids.long().cpu(), ref_ids)
        torch.testing.assert_close(weights.double().cpu(), ref_w, rtol=1e-5, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routing_op_with_groups(device, dtype):
    logits, bias = make_logits(33, 256, dtype, device=device, seed=3)
    check(logits, bias, 8, 8, 4, True, 2.5, SCORING)
    check(logits, None, 6, 1, 1, False, 1.0, SCORING)


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_gate(device):
    x, w, bias = make_case(5, 128, 1024, 6, 1, 1, device=device, seed=1)
    out = kimi_router_ops.router(x, w.float(), bias, 6, scoring=SCORING)
    check_router(out, x, w.float(), bias, 6, 1, 1, True, 1.0, SCORING)


@settings(max_examples=60, deadline=None)
@given(problem=routing_problems(max_m=40), renormalize=st.booleans())
def test_property_cpu(problem, renormalize):
    logits, bias = make_logits(problem["m"], problem["n"], seed=problem["m"])
    check(logits, bias, problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, 1.5, SCORING)


@requires_kernel_gpu
@settings(max_examples=60, deadline=None)
@given(problem=fused_router_problems(), renormalize=st.booleans())
def test_property_cuda_fused_router_and_routing_op_agree(problem, renormalize):
    p = problem
    x, w, bias = make_case(p["m"], p["n"], p["k"], p["top_k"], p["n_group"], p["topk_group"], p["bias_kind"],
                           device="cuda", seed=p["seed"])
    args = (p["top_k"], p["n_group"], p["topk_group"], renormalize, 1.5, SCORING)
    weights, ids, logits = kimi_router_ops.router(x, w, bias, *args)
    check_router((weights, ids, logits), x, w, bias, p["top_k"], p["n_group"], p["topk_group"], renormalize, 1.5,
                 SCORING)
    alone_w, alone_ids = kimi_router_ops.moe_routing(logits, bias, *args)
    assert torch.equal(ids, alone_ids) and torch.equal(weights, alone_w)


def test_an_unknown_scoring_is_named():
    with pytest.raises(RuntimeError, match="scoring must be .*sqrtsoftplus"):
        kimi_router_ops.moe_routing(torch.zeros(2, 8), None, 2, scoring="softplus")
