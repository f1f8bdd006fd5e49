"""The routing op: semantics against a float64 reference, the tie rule, bitwise agreement
with the fused router, padding rows, opcheck, torch.compile, CUDA graphs, streams, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops.testing import NEAR, near_tie, reference_routing
from conftest import HAS_CUDA, call_in, random_bf16, requires_kernel_gpu

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# name: (N experts, top_k, n_group, topk_group, routed_scaling_factor)
MODEL_CONFIGS = {
    "deepseek-v3": (256, 8, 8, 4, 2.5),
    "kimi-k2": (384, 8, 1, 1, 2.827),
    "kimi-k3": (896, 16, 1, 1, 1.0),
}


def op_scores(logits, scoring):
    """The scores in fp32, as the ops compute them up to an ulp."""
    logits = logits.float()
    return {"softmax": lambda: logits.softmax(-1), "sigmoid": logits.sigmoid,
            "sqrtsoftplus": lambda: torch.nn.functional.softplus(logits).sqrt()}[scoring]()


def check_routing(weights, ids, logits, bias, top_k, topk_group, reference, scoring="sigmoid"):
    """Routing outputs against the float64 `reference` (weights, ids, masked choice values,
    group scores): the same expert set per token unless a near-tie sits at a cut, sorted by
    the op's own choice values with ties to the lower id, weights within 1e-5."""
    m = logits.shape[0]
    assert weights.shape == (m, top_k) and weights.dtype == torch.float32
    assert ids.shape == (m, top_k) and ids.dtype == torch.int32
    assert weights.device == ids.device == logits.device
    ref_w, ref_ids, masked, group_scores = reference
    ours_ids, ours_w = ids.long().cpu(), weights.double().cpu()
    # The op's own fp32 choice values (same device, same elementwise ops).
    scores = op_scores(logits, scoring)
    choice_ours = (scores + (bias.float() if bias is not None else 0.0)).cpu()
    for t in range(m):
        ours, theirs = set(ours_ids[t].tolist()), set(ref_ids[t].tolist())
        assert len(ours) == top_k, "an expert chosen twice"
        # Sorted by biased score, descending; equal scores by ascending id. (The kernels
        # compute their own sigmoid or softmax, which may differ from torch's by an ulp:
        # near-equal neighbours may come in either order.)
        c = choice_ours[t, ours_ids[t]]
        for i in range(top_k - 1):
            assert c[i] - c[i + 1] > -NEAR
            # Exact ties go to the lower id. On a GPU the kernel's own sigmoid may split
            # values that tie in torch's (found by hypothesis with bf16 logits and bias).
            if not logits.is_cuda:
                assert not (c[i] == c[i + 1] and ours_ids[t, i] > ours_ids[t, i + 1])
        if ours != theirs:
            # Only a near-tie at a cut (groups or experts) may change the set.
            assert near_tie(group_scores[t], topk_group) or near_tie(masked[t], top_k), (t, ours, theirs)
            continue
        ref_by_id = dict(zip(ref_ids[t].tolist(), ref_w[t].tolist()))
        expected = torch.tensor([ref_by_id[i] for i in ours_ids[t].tolist()], dtype=torch.float64)
        # A weight of a far-below-the-top expert comes from exp (or sigmoid) of an argument
        # rounded in fp32: relative error eps * |logit gap|, and weight / top weight is
        # exp(-gap), so its absolute error stays below eps * top weight / e.
        torch.testing.assert_close(ours_w[t], expected, rtol=1e-5, atol=2.0**-21 * expected.abs().max().item())


def check(logits, bias, top_k, n_group=1, topk_group=1, renormalize=True, scale=1.0, scoring="sigmoid"):
    """Run the op and judge it against the float64 reference."""
    weights, ids = kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, renormalize, scale,
                                               scoring)
    reference = reference_routing(logits, bias, top_k, n_group, topk_group, renormalize, scale, scoring)
    check_routing(weights, ids, logits, bias, top_k, topk_group, reference, scoring)
    return weights, ids


def make_logits(m, n, dtype=torch.float32, bias_kind="fp32", device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(m, n, generator=g) * 2).to(dtype).to(device)
    bias = None
    if bias_kind is not None:
        bias = (torch.randn(n, generator=g) * 0.1).to(torch.float32 if bias_kind == "fp32" else torch.bfloat16)
        bias = bias.to(device)
    return logits, bias


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("m", [1, 5, 16, 17, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_configs(device, config, m, dtype):
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    logits, bias = make_logits(m, n, dtype, device=device, seed=m)
    check(logits, bias, top_k, n_group, topk_group, True, scale)


@st.composite
def routing_problems(draw, max_m=300):
    n_group = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    group_size = draw(st.one_of(
        st.integers(1 if n_group == 1 else 2, 1024 // n_group),
        st.integers(1, 32 // n_group).map(lambda slots: 32 * slots),  # groups of 32 experts
    ))
    topk_group = draw(st.integers(1, n_group))
    return dict(
        m=draw(st.integers(0, max_m)),
        n=n_group * group_size,
        top_k=draw(st.integers(1, min(32, topk_group * group_size))),
        n_group=n_group,
        topk_group=topk_group,
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        bias_kind=draw(st.sampled_from([None, "fp32", "bf16"])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def run_problem(problem, device, renormalize, factor):
    logits, bias = make_logits(problem["m"], problem["n"], problem["dtype"], problem["bias_kind"], device,
                               problem["seed"])
    check(logits, bias, problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, factor)


@settings(max_examples=60, deadline=None)
@given(problem=routing_problems(max_m=40), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_property_cpu(problem, renormalize, factor):
    run_problem(problem, "cpu", renormalize, factor)


@requires_kernel_gpu
@settings(max_examples=150, deadline=None)
@given(problem=routing_problems(), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_property_cuda(problem, renormalize, factor):
    run_problem(problem, "cuda", renormalize, factor)


@requires_kernel_gpu
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
def test_given_the_fused_routers_logits_routes_as_it_does_bit_for_bit(config):
    from test_router import make_case, two_launches

    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    for m in (m for m in range(1, 17) if not two_launches(m, n)):
        for bias_kind in (None, "fp32", "bf16"):
            x, w, bias = make_case(m, n, 7168, top_k, n_group, topk_group, bias_kind, "cuda", seed=m)
            for renormalize in (True, False):
                weights, ids, logits = kimi_router_ops.ll_bf16_router(
                    x, w, bias, top_k, n_group, topk_group, renormalize, scale)
                assert kimi_router_ops.chosen_router_variant(m, n, 7168, top_k, n_group, topk_group).startswith("router_")
                ours = kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, renormalize, scale)
                assert torch.equal(ours[1], ids), (m, bias_kind)
                assert torch.equal(ours[0], weights), (m, bias_kind)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_lower_expert_id(device):
    """Equal logits: the bias alone decides, with exact ties."""
    logits = torch.zeros(3, 8, device=device)
    bias = torch.tensor([0.3, 0.1, 0.2, 0.0, 0.3, 0.1, 0.0, 0.0], device=device)
    _, ids = kimi_router_ops.moe_routing(logits, bias, 3)
    assert ids.tolist() == [[0, 4, 2]] * 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 40])
def test_many_equal_experts_go_to_the_lowest_ids(device, m):
    for n, top_k, n_group, topk_group in [(256, 8, 8, 4), (896, 16, 1, 1), (100, 32, 1, 1)]:
        weights, ids = kimi_router_ops.moe_routing(torch.zeros(m, n, device=device), None, top_k, n_group,
                                                   topk_group)
        assert ids.tolist() == [list(range(top_k))] * m
        torch.testing.assert_close(weights, torch.full_like(weights, 1 / top_k))


def padding_rows(logits):
    """`logits` with rows 1, 3, 5, 7 of NaN, +inf, -inf and zeros (what CUDA-graph padding
    may hold) and row 9 mixing NaN, +-inf and finite logits."""
    out = logits.clone()
    for row, value in zip((1, 3, 5, 7), (float("nan"), float("inf"), float("-inf"), 0.0)):
        out[row] = value
    out[9, ::3], out[9, 1::7], out[9, 2::11] = float("nan"), float("inf"), float("-inf")
    return out


def check_padding_rows(weights, ids, n, top_k, route_row):
    """Ids in [0, N), none twice; every row as it is routed alone (`route_row(r)`)."""
    assert ((ids >= 0) & (ids < n)).all()
    for row in ids.tolist():
        assert len(set(row)) == top_k
    for r in range(ids.shape[0]):
        alone_w, alone_ids = route_row(r)
        assert torch.equal(ids[r], alone_ids[0]), r
        assert torch.equal(weights[r].isnan(), alone_w[0].isnan()), r
        assert torch.equal(weights[r].nan_to_num(), alone_w[0].nan_to_num()), r
    assert weights[1].isnan().all()  # NaN logits: NaN weights


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_rows_get_valid_distinct_ids_and_leave_the_others_alone(device, config, dtype):
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    logits, bias = make_logits(12, n, dtype, device=device)
    pad = padding_rows(logits)
    args = (top_k, n_group, topk_group, True, scale)
    weights, ids = kimi_router_ops.moe_routing(pad, bias, *args)
    check_padding_rows(weights, ids, n, top_k, lambda r: kimi_router_ops.moe_routing(pad[r:r + 1], bias, *args))
    # Zero logits: equal scores, so the bias alone decides.
    assert torch.equal(ids[7], kimi_router_ops.moe_routing(torch.zeros_like(pad[:1]), bias, *args)[1][0])


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for m, n, top_k, n_group, topk_group in [(3, 64, 6, 4, 2), (1, 256, 8, 8, 4), (0, 16, 2, 1, 1), (33, 384, 8, 1, 1)]:
        for dtype in (torch.float32, torch.bfloat16):
            for bias_kind in (None, "fp32", "bf16"):
                logits, bias = make_logits(m, n, dtype, bias_kind, device)
                torch.library.opcheck(torch.ops.kimi.moe_routing.default,
                                      (logits, bias, top_k, n_group, topk_group, True, 2.5))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_strided_logits(device):
    """Row-strided, offset, transposed and expanded logits and a strided bias."""
    base, bias = make_logits(16, 130, device=device)
    big_bias = torch.randn(2 * 128, device=device)
    cases = [
        base[:, 1:129],  # row stride 130, offset 1
        base[3:11, :128],
        make_logits(128, 8, bias_kind=None, device=device)[0].t(),  # [8, 128], column-major
        base[:1, :128].expand(5, 128),  # stride 0 rows
    ]
    for logits in cases:
        for b in (None, big_bias[::2]):
            torch.library.opcheck(torch.ops.kimi.moe_routing.default, (logits, b, 4, 4, 2, True, 1.0))
            check(logits, b, 4, 4, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["deepseek-v3"]
    _, bias = make_logits(1, n, device=device)

    def route(logits):
        return kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, True, scale)

    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    for m in (1, 3, 40, 5):
        logits, _ = make_logits(m, n, device=device, seed=m)
        for a, b in zip(compiled(logits), route(logits)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_no_derivative(device):
    logits = torch.randn(2, 8, device=device, requires_grad=True)
    bias = torch.zeros(8, device=device, requires_grad=True)
    weights, ids = kimi_router_ops.moe_routing(logits, bias, 2)
    assert not (weights.requires_grad or ids.requires_grad)
    with pytest.raises(RuntimeError, match="does not require grad"):
        weights.sum().backward()


def bad_routing_calls(device):
    logits = torch.zeros(2, 16, device=device)
    f32 = lambda *s: torch.zeros(*s, device=device)  # noqa: E731
    return {
        "logits float64": ((logits.double(), None, 2), RuntimeError, "moe_routing: logits must be torch.float32 or torch.bfloat16, got torch.float64"),
        "logits float16": ((logits.half(), None, 2), RuntimeError, "moe_routing: logits must be"),
        "logits 1-D": ((logits[0], None, 2), RuntimeError, r"moe_routing: logits must be 2-D \[M, N\]"),
        "logits 3-D": ((logits[None], None, 2), RuntimeError, "moe_routing: logits must be 2-D"),
        "no experts": ((f32(2, 0), None, 1), RuntimeError, "moe_routing: logits must have N >= 1 experts"),
        "n_group does not divide N": ((logits, None, 2, 3, 1), RuntimeError, "moe_routing: n_group must divide the number of experts, got n_group=3 and N=16"),
        "topk_group > n_group": ((logits, None, 2, 4, 5), RuntimeError, r"topk_group must be in \[1, n_group=4\], got 5"),
        "groups of one": ((logits, None, 2, 16, 4), RuntimeError, "each group needs at least 2 experts"),
        "top_k > N": ((logits, None, 17), RuntimeError, r"top_k must be in \[1, experts in the kept groups=16\], got 17"),
        "top_k zero": ((logits, None, 0), RuntimeError, "top_k must be in"),
        "bias wrong length": ((logits, f32(15), 2), RuntimeError, r"e_score_correction_bias must have shape \[N\]=\[16\]"),
        "bias float64": ((logits, f32(16).double(), 2), RuntimeError, "e_score_correction_bias must be torch.float32 or torch.bfloat16"),
    }


@pytest.mark.parametrize("device", DEVICES + ["compiled"])
@pytest.mark.parametrize("case", list(bad_routing_calls("cpu")))
def test_bad_input(device, case):
    args, error, message = bad_routing_calls("cpu" if device == "compiled" else device)[case]
    with pytest.raises(error, match=message):
        call_in(device, kimi_router_ops.moe_routing, *args)
    device = "cpu" if device == "compiled" else device
    logits, bias = make_logits(3, 16, device=device)  # the process (and the CUDA context) is still fine
    check(logits, bias, 4, 4, 2)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_bias_on_another_device_is_an_error():
    with pytest.raises(RuntimeError, match="e_score_correction_bias must be on the device of logits"):
        kimi_router_ops.moe_routing(torch.zeros(2, 16, device="cuda"), torch.zeros(16), 2)


@requires_kernel_gpu
def test_cuda_graph_capture_and_replay_after_updates():
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["deepseek-v3"]
    logits, bias = make_logits(40, n, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        weights, ids = kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, True, scale)
    for seed in range(3):
        fresh, fresh_bias = make_logits(40, n, device="cuda", seed=seed + 1)
        logits.copy_(fresh), bias.copy_(fresh_bias)
        graph.replay()
        torch.cuda.synchronize()
        reference = reference_routing(logits, bias, top_k, n_group, topk_group, True, scale)
        check_routing(weights, ids, logits, bias, top_k, topk_group, reference)


@requires_kernel_gpu
def test_cuda_graph_capture_as_first_call_in_fresh_process():
    import subprocess
    import sys

    code = (
        "import torch, kimi_router_ops\n"
        "logits = torch.randn(20, 256, device='cuda'); bias = torch.randn(256, device='cuda')\n"
        "g = torch.cuda.CUDAGraph()\n"
        "with torch.cuda.graph(g):\n"
        "    w, i = kimi_router_ops.moe_routing(logits, bias, 8, 8, 4, True, 2.5)\n"
        "g.replay(); torch.cuda.synchronize()\n"
        "ref = kimi_router_ops.moe_routing(logits.cpu(), bias.cpu(), 8, 8, 4, True, 2.5)\n"
        "assert torch.equal(i.cpu(), ref[1]), (i, ref[1])\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@requires_kernel_gpu
def test_side_stream_and_bitwise_determinism():
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["kimi-k3"]
    logits, bias = make_logits(256, n, device="cuda")
    expected = kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, True, scale)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(20):
            out = kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, True, scale)
            assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1])
    torch.cuda.synchronize()


@pytest.mark.parametrize(
    "case, expected",
    [
        (dict(M=17, N=256, K=7168, top_k=8, n_group=8, topk_group=4), "gemm+moe_routing"),
        (dict(M=256, N=896, K=7168, top_k=16), "gemm+moe_routing"),
        (dict(M=4, N=256, K=7167, top_k=8), "gemm+moe_routing"),  # no 16-byte loads: not fused
        (dict(M=4, N=1025, K=7168, top_k=8), "reference"),  # more experts than a warp routes
        (dict(M=4, N=256, K=7168, top_k=33), "reference"),  # more picks than lanes
        (dict(M=4, N=256, K=7168, top_k=8, n_group=64, topk_group=4), "reference"),  # groups
        (dict(M=40, N=256, K=7168, top_k=8, sm=80), "reference"),  # not compiled for the GPU
        (dict(M=0, N=256, K=7168, top_k=8), "reference"),
    ],
)
def test_router_path_outside_the_fused_rows(case, expected):
    assert kimi_router_ops.chosen_router_variant(**case) == expected


@pytest.mark.parametrize("case", [dict(top_k=0), dict(top_k=8, n_group=3), dict(top_k=8, n_group=8, topk_group=9)])
def test_router_choice_for_a_rejected_problem_is_the_ops_error(case):
    with pytest.raises(RuntimeError, match="ll_bf16_router: "):
        kimi_router_ops.chosen_router_variant(4, 256, 7168, **case)
