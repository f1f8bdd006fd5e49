"""Softmax routing (scoring="softmax") in the router op and the routing op: each transformers
family's formula in float64 (Qwen3-MoE, Mixtral, gpt-oss, DeepSeek-V2), the ops' float64
reference under hypothesis, exact ties, padding rows, the routing op against the fused
router bit for bit, determinism, opcheck, torch.compile, CUDA graphs and bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops import tables
from kimi_router_ops.testing import NEAR, near_tie
from conftest import HAS_CUDA, requires_kernel_gpu
from test_moe_routing import check, check_padding_rows, make_logits, padding_rows, routing_problems
from test_router import check_router, fused_router_problems, make_case, router_problems, two_launches

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
SOFTMAX = "softmax"

# name: (K, N experts, top_k, n_group, topk_group, renormalize, routed_scaling_factor), from
# each model's public config.
SOFTMAX_CONFIGS = {
    "qwen3-235b-a22b": (4096, 128, 8, 1, 1, True, 1.0),
    "qwen3-30b-a3b": (2048, 128, 8, 1, 1, True, 1.0),
    "mixtral-8x7b": (4096, 8, 2, 1, 1, True, 1.0),
    "gpt-oss-120b": (2880, 128, 4, 1, 1, True, 1.0),
    "deepseek-v2": (5120, 160, 6, 8, 3, False, 16.0),
    "deepseek-v2-lite": (2048, 64, 6, 1, 1, False, 1.0),
}


# The routers of transformers 5.x in float64, on float64 logits: (weights, ids, the values the
# choice was made on, the group scores or None).
def qwen3_moe(logits, top_k, norm_topk_prob):  # Qwen3MoeTopKRouter, Qwen2MoeTopKRouter
    probs = logits.softmax(-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids, probs, None


def mixtral(logits, top_k):  # MixtralTopKRouter: always renormalized
    return qwen3_moe(logits, top_k, True)


def gpt_oss(logits, top_k):  # GptOssTopKRouter: top-k of the logits, softmax over those
    values, ids = logits.topk(top_k, dim=-1)
    return values.softmax(-1), ids, logits, None


def deepseek_v2(logits, top_k, n_group, topk_group, scale):  # DeepseekV2TopkRouter
    scores = logits.softmax(-1)
    groups = None
    if topk_group < n_group:  # topk_method "group_limited_greedy"
        m, n = scores.shape
        groups = scores.view(m, n_group, n // n_group).max(dim=-1).values
        group_idx = groups.topk(topk_group, dim=-1)[1]
        mask = torch.zeros_like(groups).scatter_(1, group_idx, 1)
        mask = mask.unsqueeze(-1).expand(m, n_group, n // n_group).reshape(m, n)
        scores = scores.masked_fill(~mask.bool(), 0.0)
    weights, ids = scores.topk(top_k, dim=-1)
    return weights * scale, ids, scores, groups


def transformers_formula(name, logits, top_k, n_group, topk_group, renormalize, scale):
    logits = logits.double().cpu()
    if name.startswith("qwen3"):
        return qwen3_moe(logits, top_k, renormalize)
    if name.startswith("mixtral"):
        return mixtral(logits, top_k)
    if name.startswith("gpt-oss"):
        return gpt_oss(logits, top_k)
    return deepseek_v2(logits, top_k, n_group, topk_group, scale)


def check_against_formula(name, weights, ids, logits, top_k, n_group, topk_group, renormalize, scale):
    """The same expert set per token as the transformers formula (unless a near-tie sits at a
    cut), in order of probability, weights within 1e-5 relative."""
    ref_w, ref_ids, chosen_on, groups = transformers_formula(
        name, logits, top_k, n_group, topk_group, renormalize, scale)
    probs = logits.double().cpu().softmax(-1)
    compared = 0
    for t in range(logits.shape[0]):
        ours = ids[t].long().cpu()
        assert len(set(ours.tolist())) == top_k
        assert (probs[t, ours][:-1] - probs[t, ours][1:] > -NEAR).all()  # best first
        if set(ours.tolist()) != set(ref_ids[t].tolist()):
            assert near_tie(chosen_on[t], top_k) or (groups is not None and near_tie(groups[t], topk_group))
            continue
        ref_by_id = dict(zip(ref_ids[t].tolist(), ref_w[t].tolist()))
        expected = torch.tensor([ref_by_id[i] for i in ours.tolist()], dtype=torch.float64)
        # A weight of a far-below-the-top expert comes from exp (or sigmoid) of an argument
        # rounded in fp32: relative error eps * |logit gap|, and weight / top weight is
        # exp(-gap), so its absolute error stays below eps * top weight / e.
        torch.testing.assert_close(weights[t].double().cpu(), expected, rtol=1e-5, atol=2.0**-21 * expected.abs().max().item())
        compared += 1
    assert compared >= logits.shape[0] * 0.9, "too many near-ties to judge"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(SOFTMAX_CONFIGS))
@pytest.mark.parametrize("m", [1, 4, 16, 40])
def test_router_is_each_families_formula(device, config, m):
    k, n, top_k, n_group, topk_group, renormalize, scale = SOFTMAX_CONFIGS[config]
    x, w, _ = make_case(m, n, k, top_k, n_group, topk_group, None, device, seed=m)
    if device == "cuda" and m <= 16:
        assert kimi_router_ops.chosen_router_variant(
            m, n, k, top_k, n_group, topk_group, scoring=SOFTMAX).startswith("router_")
    out = kimi_router_ops.ll_bf16_router(x, w, None, top_k, n_group, topk_group, renormalize, scale, SOFTMAX)
    check_router(out, x, w, None, top_k, n_group, topk_group, renormalize, scale, SOFTMAX)
    weights, ids, logits = out
    check_against_formula(config, weights, ids, logits, top_k, n_group, topk_group, renormalize, scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(SOFTMAX_CONFIGS))
@pytest.mark.parametrize("m", [1, 16, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routing_op_is_each_families_formula(device, config, m, dtype):
    _, n, top_k, n_group, topk_group, renormalize, scale = SOFTMAX_CONFIGS[config]
    logits, _ = make_logits(m, n, dtype, None, device, seed=m)
    weights, ids = check(logits, None, top_k, n_group, topk_group, renormalize, scale, SOFTMAX)
    check_against_formula(config, weights, ids, logits, top_k, n_group, topk_group, renormalize, scale)


@settings(max_examples=60, deadline=None)
@given(problem=routing_problems(max_m=40), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_routing_property_cpu(problem, renormalize, factor):
    logits, bias = make_logits(problem["m"], problem["n"], problem["dtype"], problem["bias_kind"], "cpu",
                               problem["seed"])
    check(logits, bias, problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, factor, SOFTMAX)


@requires_kernel_gpu
@settings(max_examples=150, deadline=None)
@given(problem=routing_problems(), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_routing_property_cuda(problem, renormalize, factor):
    logits, bias = make_logits(problem["m"], problem["n"], problem["dtype"], problem["bias_kind"], "cuda",
                               problem["seed"])
    check(logits, bias, problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, factor, SOFTMAX)


@settings(max_examples=40, deadline=None)
@given(problem=router_problems(), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_router_property_cpu(problem, renormalize, factor):
    x, w, bias = make_case(**problem)
    args = (problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, factor)
    check_router(kimi_router_ops.ll_bf16_router(x, w, bias, *args, SOFTMAX), x, w, bias, *args, SOFTMAX)


@requires_kernel_gpu
@settings(max_examples=150, deadline=None)
@given(problem=fused_router_problems(), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_router_property_cuda_fused(problem, renormalize, factor):
    x, w, bias = make_case(**problem, device="cuda")
    args = (problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, factor)
    chosen = kimi_router_ops.chosen_router_variant(x.shape[0], w.shape[0], x.shape[1], *args[:3])
    assert chosen.startswith("router_") != two_launches(x.shape[0], w.shape[0]), chosen
    out = kimi_router_ops.ll_bf16_router(x, w, bias, *args, SOFTMAX)
    check_router(out, x, w, bias, *args, SOFTMAX)
    # The routing op on the fused router's logits: its ids and weights, bit for bit.
    weights, ids = kimi_router_ops.moe_routing(out[2], bias, *args, SOFTMAX)
    assert torch.equal(ids, out[1]) and torch.equal(weights, out[0])


@requires_kernel_gpu
@settings(max_examples=60, deadline=None)
@given(problem=fused_router_problems(), row=st.sampled_from(tables.router.ROUTER_VARIANTS), renormalize=st.booleans())
def test_router_property_cuda_every_row(problem, row, renormalize):
    problem["k"] = row.k_only or problem["k"]  # K compiled in: that K
    x, w, bias = make_case(**problem, device="cuda")
    w = w.to(getattr(torch, row.weight_dtype))
    args = (problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, 1.0)
    if not (row.m_lo <= x.shape[0] <= row.m_hi and row.n_min <= w.shape[0] <= row.n_max):
        return  # the row does not serve this problem (test_router.py checks the error)
    out = kimi_router_ops.router_with_variant(x, w, bias, *args, row.name, SOFTMAX)
    check_router(out, x, w, bias, *args, SOFTMAX)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_lower_expert_id(device):
    """Equal logits are equal probabilities: the lower expert id goes first."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 1.0, -2.0, 3.0]] * 3, device=device)
    weights, ids = kimi_router_ops.moe_routing(logits, None, 3, scoring=SOFTMAX)
    assert ids.tolist() == [[1, 2, 4]] * 3
    torch.testing.assert_close(weights, torch.full_like(weights, 1 / 3))
    # All equal: the lowest ids, each 1/N before renormalizing.
    weights, ids = kimi_router_ops.moe_routing(torch.zeros(2, 96, device=device), None, 8,
                                               renormalize=False, scoring=SOFTMAX)
    assert ids.tolist() == [list(range(8))] * 2
    torch.testing.assert_close(weights, torch.full_like(weights, 1 / 96))


@pytest.mark.parametrize("device", DEVICES)
def test_equal_groups_go_to_the_lower_group(device):
    """A group's score with softmax is its best probability: groups 1 and 3 tie on it, and
    group 1 wins though group 3's second best is higher (with sigmoid, the sum of the two
    best would pick group 3)."""
    logits = torch.full((1, 16), -4.0, device=device)
    logits[0, 4], logits[0, 5] = 2.0, -3.0  # group 1
    logits[0, 12], logits[0, 13] = 2.0, 1.0  # group 3
    _, ids = kimi_router_ops.moe_routing(logits, None, 2, 4, 1, scoring=SOFTMAX)
    assert ids.tolist() == [[4, 5]]
    _, ids = kimi_router_ops.moe_routing(logits, None, 2, 4, 1)
    assert ids.tolist() == [[12, 13]]


@pytest.mark.parametrize("device", DEVICES)
def test_groups_of_one_expert(device):
    """With softmax a group's score is its best expert, so a group may be one expert."""
    logits, bias = make_logits(5, 16, device=device)
    check(logits, bias, 2, 16, 4, True, 1.0, SOFTMAX)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", ["qwen3-235b-a22b", "deepseek-v2", "mixtral-8x7b"])
def test_padding_rows_get_valid_distinct_ids_and_leave_the_others_alone(device, config):
    _, n, top_k, n_group, topk_group, renormalize, scale = SOFTMAX_CONFIGS[config]
    logits, _ = make_logits(12, n, device=device)
    pad = padding_rows(logits)
    args = (top_k, n_group, topk_group, renormalize, scale, SOFTMAX)
    weights, ids = kimi_router_ops.moe_routing(pad, None, *args)
    check_padding_rows(weights, ids, n, top_k, lambda r: kimi_router_ops.moe_routing(pad[r:r + 1], None, *args))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for m, n, top_k, n_group, topk_group in [(3, 64, 6, 4, 2), (1, 160, 6, 8, 3), (0, 16, 2, 1, 1), (33, 128, 8, 1, 1)]:
        logits, bias = make_logits(m, n, torch.bfloat16, "fp32", device)
        torch.library.opcheck(torch.ops.kimi.moe_routing.default,
                              (logits, bias, top_k, n_group, topk_group, True, 2.5, SOFTMAX))
        x, w, bias = make_case(m, n, 256, top_k, n_group, topk_group, "bf16", device)
        torch.library.opcheck(torch.ops.kimi.ll_bf16_router.default,
                              (x, w, bias, top_k, n_group, topk_group, False, 16.0, SOFTMAX))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()
    k, n, top_k, n_group, topk_group, renormalize, scale = SOFTMAX_CONFIGS["deepseek-v2"]
    _, w, _ = make_case(1, n, 512, top_k, n_group, topk_group, None, device)

    def route(x):
        weights, ids, logits = kimi_router_ops.ll_bf16_router(x, w, None, top_k, n_group, topk_group,
                                                              renormalize, scale, SOFTMAX)
        return weights, ids, kimi_router_ops.moe_routing(logits, None, top_k, scoring=SOFTMAX)[0]

    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    for m in (1, 3, 40, 5):
        x, _, _ = make_case(m, n, 512, top_k, n_group, topk_group, None, device, seed=m)
        for a, b in zip(compiled(x), route(x)):
            assert torch.equal(a, b)


@requires_kernel_gpu
@pytest.mark.parametrize("m", [4, 40])  # the fused kernel, the two launches
def test_cuda_graph_capture_and_replay_after_updates(m):
    k, n, top_k, n_group, topk_group, renormalize, scale = SOFTMAX_CONFIGS["qwen3-235b-a22b"]
    x, w, _ = make_case(m, n, k, top_k, n_group, topk_group, None, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        out = kimi_router_ops.ll_bf16_router(x, w, None, top_k, n_group, topk_group, renormalize, scale, SOFTMAX)
    for seed in range(3):
        x.copy_(make_case(m, n, k, top_k, n_group, topk_group, None, "cuda", seed=seed + 1)[0])
        graph.replay()
        torch.cuda.synchronize()
        check_router(out, x, w, None, top_k, n_group, topk_group, renormalize, scale, SOFTMAX)


@requires_kernel_gpu
@pytest.mark.parametrize("config", ["qwen3-235b-a22b", "deepseek-v2"])
def test_side_stream_and_bitwise_determinism(config):
    k, n, top_k, n_group, topk_group, renormalize, scale = SOFTMAX_CONFIGS[config]
    args = (top_k, n_group, topk_group, renormalize, scale, SOFTMAX)
    for m in (1, 8, 16, 100):
        x, w, _ = make_case(m, n, k, top_k, n_group, topk_group, None, "cuda", seed=m)
        expected = kimi_router_ops.ll_bf16_router(x, w, None, *args)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(10):
                out = kimi_router_ops.ll_bf16_router(x, w, None, *args)
                assert all(torch.equal(a, b) for a, b in zip(out, expected)), m
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_unknown_scoring_is_an_error(device):
    logits = torch.zeros(2, 16, device=device)
    with pytest.raises(RuntimeError, match="moe_routing: scoring must be 'sigmoid', 'softmax' or 'sqrtsoftplus', got 'relu'"):
        kimi_router_ops.moe_routing(logits, None, 2, scoring="relu")
    x, w, _ = make_case(2, 16, 64, 2, 1, 1, None, "cpu")
    with pytest.raises(RuntimeError, match="ll_bf16_router: scoring must be 'sigmoid', 'softmax' or 'sqrtsoftplus', got 'Softmax'"):
        kimi_router_ops.ll_bf16_router(x.to(device), w.to(device), None, 2, scoring="Softmax")
    with pytest.raises(RuntimeError, match="scoring must be 'sigmoid', 'softmax' or 'sqrtsoftplus'"):
        kimi_router_ops.chosen_router_variant(2, 16, 64, 2, scoring="")
    check(*make_logits(3, 16, device=device), 4, 4, 2, True, 1.0, SOFTMAX)  # still fine


def test_softmax_serves_the_same_rows_as_sigmoid():
    for k, n, top_k, n_group, topk_group, _, _ in SOFTMAX_CONFIGS.values():
        for m in (1, 2, 8, 16, 17):
            args = (m, n, k, top_k, n_group, topk_group)
            assert kimi_router_ops.chosen_router_variant(*args, scoring=SOFTMAX) == \
                kimi_router_ops.chosen_router_variant(*args)
