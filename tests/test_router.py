"""The router op (GEMM + routing): semantics against a float64 transformers-formula
reference, the tie rule, opcheck, torch.compile, CUDA graphs, streams and bad input."""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops import tables
from kimi_router_ops.testing import reference_router
from conftest import HAS_CUDA, call_in, dot_error, random_bf16, requires_kernel_gpu
from test_moe_routing import check_routing

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])

# name: (N experts, top_k, n_group, topk_group, routed_scaling_factor)
MODEL_CONFIGS = {
    "deepseek-v3": (256, 8, 8, 4, 2.5),
    "kimi-k2": (384, 8, 1, 1, 2.827),
    "kimi-k3": (896, 16, 1, 1, 1.0),
}
def check_router(out, x, w, bias, top_k, n_group, topk_group, renormalize, scale, scoring="sigmoid"):
    weights, ids, logits = out
    m, n = x.shape[0], w.shape[0]
    assert logits.shape == (m, n) and logits.dtype == torch.float32
    assert logits.device == x.device
    # Logits: fp32 accumulation, judged against the scale of its rounding (a single logit
    # may nearly cancel, where a relative error says nothing).
    assert dot_error(logits, x, w) <= 1e-5
    ref_w, ref_ids, _, masked, group_scores = reference_router(
        x, w, bias, top_k, n_group, topk_group, renormalize, scale, scoring
    )
    check_routing(weights, ids, logits, bias, top_k, topk_group, (ref_w, ref_ids, masked, group_scores),
                  scoring)


def make_case(m, n, k, top_k, n_group, topk_group, bias_kind="fp32", device="cpu", scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = random_bf16(m, k, scale=scale, generator=g, device=device)
    w = random_bf16(n, k, scale=k ** -0.5, generator=g, device=device)
    bias = None
    if bias_kind is not None:
        bias = (torch.randn(n, generator=g) * 0.1).to(torch.float32 if bias_kind == "fp32" else torch.bfloat16)
        bias = bias.to(device)
    return x, w, bias


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("m", [1, 4, 16])
def test_model_configs(device, config, m):
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    x, w, bias = make_case(m, n, 7168, top_k, n_group, topk_group, device=device, seed=m)
    out = kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, scale)
    check_router(out, x, w, bias, top_k, n_group, topk_group, True, scale)
    assert torch.equal(out[2], fused_rows_gemm(x, w, top_k, n_group, topk_group))


def fused_rows_gemm(x, w, top_k, n_group=1, topk_group=1):
    """The logits the router op returns: on a GPU, those of the GEMM kernel its fused row
    runs (the GEMM op's own arithmetic but at M = 1 with N > 128 and M = 2 with 129 <= N <= 256;
    test_fused_rows_run_the_gemm_ops_kernel); otherwise the GEMM op's."""
    row = "reference"
    if x.is_cuda:
        major, minor = torch.cuda.get_device_capability(x.device)
        row = kimi_router_ops.chosen_router_variant(
            x.shape[0], w.shape[0], x.shape[1], top_k, n_group, topk_group, major * 10 + minor)
    if not row.startswith("router_"):  # two launches (or the reference): the GEMM op first
        return kimi_router_ops.ll_bf16_gemm(x, w)
    gemm = next(r.gemm for r in tables.router.ROUTER_VARIANTS if r.name == row)
    return kimi_router_ops.router_gemm_with_variant(x, w, gemm)


def two_launches(m, n):
    """Where the router op runs the GEMM op and then moe_routing, with no fused row: Kimi-K3's
    385..896 experts at M = 9..16, faster so behind every producer (tables.router.ROUTER_GEMMS)."""
    return 9 <= m <= 16 and 384 < n <= 896


def faster_other_kernel(m, n, k=7168):
    """The GEMM kernel a fused row runs where it is not the GEMM op's arithmetic (the whole
    router measured faster on it), or None."""
    if m == 1 and 128 < n <= 384 and k == 7168:
        return "m1_prefetch_r1_t128_k7168"  # the 128-thread kernel of one expert a CTA
    if m == 1 and n > 384:
        return "mma8_t2c4w8u7"  # the tensor-core kernel of M = 2..8
    if m == 2 and 128 < n <= 256 and k != 7168:
        return "m2_prefetch_r4_t256"  # the M = 1 dot product's shape with two tokens
    if 9 <= m <= 16 and n > 896:
        return "mma16_t2c4w8u7"  # the GEMM op runs cuBLAS there (docs/api.md)
    return None


def test_fused_rows_run_the_gemm_ops_kernel():
    """Each fused router row runs the GEMM kernel the GEMM op picks for the same M and N, or
    one with the same arithmetic (only where it lets the next kernel launch, how many
    16-expert tensor-core tiles or dot-product experts a CTA holds, may differ), so the router's logits are the GEMM
    op's, bit for bit (test_router_logits_are_the_gemm_ops checks it on the GPU); the
    exceptions run another kernel: M = 1 with more than 384 experts (the tensor-core kernel
    of M = 2..8) and with 129..384 at K = 7168 (the 128-thread one-expert-a-CTA kernel) and M = 2 from 129 to 256 at other K (the M = 1 dot product's shape with two tokens) route
    faster on it, and at M = 9..16 above 896 experts the GEMM op runs cuBLAS."""
    def arithmetic(name):
        v = tables.gemm.variant(name)
        kernel = v.kernel
        if isinstance(kernel, tables.gemm.Mma):
            # An expert's row in its MMA tile and each warp's K chunks do not depend on the
            # tiles a CTA holds.
            return (kernel.cluster_k, kernel.warps, kernel.unroll, kernel.tokens), v.prefetch, v.pdl
        # Each expert's dot product is its own, whatever the experts a CTA and whether K is
        # compiled in.
        return replace(kernel, rows_per_cta=1, k=0), v.prefetch, v.pdl

    for n in (8, 128, 129, 256, 384, 385, 896, 1024):
        for m in range(1, 17):
            row = kimi_router_ops.chosen_router_variant(m, n, 7168, 8)
            if two_launches(m, n):
                assert row == "gemm+moe_routing", (m, n, row)
                continue
            gemm = next(r.gemm for r in tables.router.ROUTER_VARIANTS if r.name == row)
            if faster_other_kernel(m, n):
                assert gemm == faster_other_kernel(m, n), (m, n, gemm)
            else:
                chosen, vec = kimi_router_ops.chosen_variant(m, n, 7168).split(":")
                assert vec == "vec8" and arithmetic(chosen) == arithmetic(gemm), (m, n, chosen, gemm)


@requires_kernel_gpu
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
def test_router_logits_are_the_gemm_ops(config):
    """On the GPU, at every M the fused kernel serves: the router's logits are the GEMM op's,
    bit for bit, but for the two exceptions of test_fused_rows_run_the_gemm_ops_kernel."""
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    for m in range(1, 17):
        if faster_other_kernel(m, n):
            continue
        x, w, bias = make_case(m, n, 7168, top_k, n_group, topk_group, device="cuda", seed=m)
        out = kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, scale)
        assert torch.equal(out[2], kimi_router_ops.ll_bf16_gemm(x, w)), m


@requires_kernel_gpu
@pytest.mark.parametrize("tokens", [8, 16])
def test_one_tile_tensor_core_kernels_sum_as_the_two_tile_ones(tokens):
    """What lets the fused rows on the one-tile kernels count as the GEMM op's arithmetic:
    the same logits, bit for bit, for any N (tails included) and every M of the bucket."""
    for n in (8, 200, 256, 300, 384, 1000):
        for m in range(1, tokens + 1):
            x, w, _ = make_case(m, n, 7168, 1, 1, 1, None, "cuda", seed=n + m)
            one = kimi_router_ops.router_gemm_with_variant(x, w, f"mma{tokens}_t1c4w8u7")
            two = kimi_router_ops.router_gemm_with_variant(x, w, f"mma{tokens}_t2c4w8u7")
            assert torch.equal(one, two), (n, m)


@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
def test_model_configs_are_fused_up_to_16_tokens_but_k3s_two_launches(config):
    n, top_k, n_group, topk_group, _ = MODEL_CONFIGS[config]
    for m in range(1, 17):
        for sm in (90, 100):
            row = kimi_router_ops.chosen_router_variant(m, n, 7168, top_k, n_group, topk_group, sm)
            assert row == "gemm+moe_routing" if two_launches(m, n) else row.startswith("router_"), (m, sm, row)


def test_router_with_all_groups_kept_has_no_group_limit():
    """topk_group == n_group masks nothing, so any n_group is fine for the fused kernel."""
    assert kimi_router_ops.chosen_router_variant(4, 256, 7168, 8, 64, 64).startswith("router_")


@st.composite
def router_problems(draw):
    n_group = draw(st.sampled_from([1, 2, 4, 8]))
    group_size = draw(st.integers(1 if n_group == 1 else 2, 24))
    topk_group = draw(st.integers(1, n_group))
    top_k = draw(st.integers(1, topk_group * group_size))
    return dict(
        m=draw(st.integers(0, 20)),
        n=n_group * group_size,
        k=draw(st.integers(1, 300)),
        top_k=top_k,
        n_group=n_group,
        topk_group=topk_group,
        bias_kind=draw(st.sampled_from([None, "fp32", "bf16"])),
        scale=draw(st.floats(1e-2, 10.0)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@st.composite
def fused_router_problems(draw):
    """Problems inside the fused rows: M <= 16, N <= 1024, K % 8 == 0, up to 32 groups."""
    n_group = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    group_size = draw(st.one_of(
        st.integers(1 if n_group == 1 else 2, 1024 // n_group),
        # Groups of 32 experts or multiples (DeepSeek-V3's shape, and the lanes' slots):
        # rare among the sizes above.
        st.integers(1, 32 // n_group).map(lambda slots: 32 * slots),
    ))
    topk_group = draw(st.integers(1, n_group))
    return dict(
        m=draw(st.integers(1, 16)),
        n=n_group * group_size,
        k=8 * draw(st.integers(1, 1000)),
        top_k=draw(st.integers(1, min(32, topk_group * group_size))),
        n_group=n_group,
        topk_group=topk_group,
        bias_kind=draw(st.sampled_from([None, "fp32", "bf16"])),
        scale=draw(st.floats(1e-2, 10.0)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@requires_kernel_gpu
@settings(max_examples=150, deadline=None)
@given(problem=fused_router_problems(), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_property_cuda_fused(problem, renormalize, factor):
    x, w, bias = make_case(**problem, device="cuda")
    args = (problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, factor)
    chosen = kimi_router_ops.chosen_router_variant(x.shape[0], w.shape[0], x.shape[1], *args[:3])
    assert chosen.startswith("router_") != two_launches(x.shape[0], w.shape[0]), chosen
    out = kimi_router_ops.ll_bf16_router(x, w, bias, *args)
    check_router(out, x, w, bias, *args)
    assert torch.equal(out[2], fused_rows_gemm(x, w, *args[:3]))


@settings(max_examples=80, deadline=None)
@given(problem=router_problems(), renormalize=st.booleans(), factor=st.floats(0.25, 4.0))
def test_property_cpu(problem, renormalize, factor):
    x, w, bias = make_case(**problem)
    args = (problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, factor)
    out = kimi_router_ops.ll_bf16_router(x, w, bias, *args)
    check_router(out, x, w, bias, *args)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_lower_expert_id(device):
    """Zero weights make every score sigmoid(0) = 0.5, so the bias alone decides, with
    exact ties: equal experts go to the lower id, equal groups keep the lower group."""
    x, w = random_bf16(3, 64, device=device), torch.zeros(8, 64, dtype=torch.bfloat16, device=device)
    bias = torch.tensor([0.3, 0.1, 0.2, 0.0, 0.3, 0.1, 0.0, 0.0], device=device)
    # Choice values 0.8 0.6 0.7 0.5 0.8 0.6 0.5 0.5: experts 0 and 4 tie at the top.
    _, ids, _ = kimi_router_ops.ll_bf16_router(x, w, bias, 3)
    assert ids.tolist() == [[0, 4, 2]] * 3
    # Groups of 2: scores 1.4, 1.2, 1.4, 1.0; groups 0 and 2 tie, keeping one keeps group 0.
    _, ids, _ = kimi_router_ops.ll_bf16_router(x, w, bias, 2, 4, 1)
    assert ids.tolist() == [[0, 1]] * 3
    _, ids, _ = kimi_router_ops.ll_bf16_router(x, w, bias, 4, 4, 2)
    assert ids.tolist() == [[0, 4, 1, 5]] * 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [33, 256, 1024])
def test_many_equal_experts_go_to_the_lowest_ids(device, n):
    """Every expert equal (zero weights, no bias): the top_k are the lowest ids, in order.
    (The fused kernel ranks at most 32 candidates at once; more, as here, take its other
    way, one pick after another.)"""
    x, w = random_bf16(2, 64, device=device), torch.zeros(n, 64, dtype=torch.bfloat16, device=device)
    weights, ids, _ = kimi_router_ops.ll_bf16_router(x, w, None, 8)
    assert ids.tolist() == [list(range(8))] * 2
    torch.testing.assert_close(weights, torch.full_like(weights, 1 / 8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_many_equal_experts_in_groups_go_to_the_lowest_ids(device, m):
    """DeepSeek-V3's grouping with all experts equal but one: its group and the three lowest
    others are kept (ties to the lower group), and after it come the lowest ids. On every
    fused row for the M: 128 candidates, more than the ranking's list holds, take the
    kernel's other way, one pick after another."""
    x, w = random_bf16(m, 64, device=device), torch.zeros(256, 64, dtype=torch.bfloat16, device=device)
    bias = torch.zeros(256, device=device)
    bias[200] = 1.0  # group 6 beats every other group, and expert 200 every other expert
    rows = [None] + [r for r in tables.router.ROUTER_VARIANTS
                     if device == "cuda" and r.n_max == 256 and r.m_lo <= m <= r.m_hi and r.k_only in (0, 64)]
    args = (x, w, bias, 8, 8, 4, True, 2.5)
    for row in rows:
        if row is None:
            out = kimi_router_ops.ll_bf16_router(*args)
        else:
            out = kimi_router_ops.router_with_variant(
                x, w.to(getattr(torch, row.weight_dtype)), *args[2:], row.name)
        assert out[1].tolist() == [[200] + list(range(7))] * m, getattr(row, "name", row)
        torch.testing.assert_close(out[0], torch.full_like(out[0], 2.5 / 8))


@requires_kernel_gpu
@pytest.mark.parametrize("n_group, topk_group, top_k", [(12, 5, 8), (16, 3, 6), (32, 7, 16)])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_more_than_eight_groups_of_32(m, n_group, topk_group, top_k):
    """Groups of exactly 32 experts take the fused kernel's shared-memory path, eight groups
    at a time: more than eight (and a last batch of fewer) must give the same answer."""
    x, w, bias = make_case(m, 32 * n_group, 1024, top_k, n_group, topk_group, device="cuda", seed=n_group + m)
    chosen = kimi_router_ops.chosen_router_variant(m, 32 * n_group, 1024, top_k, n_group, topk_group)
    assert chosen.startswith("router_") != two_launches(m, 32 * n_group), chosen
    out = kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, 1.5)
    check_router(out, x, w, bias, top_k, n_group, topk_group, True, 1.5)


@requires_kernel_gpu
def test_one_stream_serves_every_shape_in_turn():
    """A stream's handoff buffer serves calls of any M and N one after another, with no
    synchronization in between: each call leaves it empty for the next."""
    shapes = [(16, 1024), (1, 256), (8, 384), (3, 896), (16, 256), (1, 1024), (12, 100)] * 3
    cases = [make_case(m, n, 512, 8, 1, 1, device="cuda", seed=i) for i, (m, n) in enumerate(shapes)]
    outs = [kimi_router_ops.ll_bf16_router(x, w, b, 8) for x, w, b in cases]
    for out, (x, w, b) in zip(outs, cases):
        check_router(out, x, w, b, 8, 1, 1, True, 1.0)


def test_bias_steers_the_choice_but_not_the_weights():
    x, w = random_bf16(2, 64), random_bf16(16, 64)
    bias = torch.full((16,), -10.0)
    bias[[3, 7]] = 10.0
    weights, ids, logits = kimi_router_ops.ll_bf16_router(x, w, bias, 2, renormalize=False)
    assert all(sorted(row) == [3, 7] for row in ids.tolist())
    torch.testing.assert_close(weights, logits.sigmoid().gather(1, ids.long()))


@requires_kernel_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0, 1, 3, 5])
def test_bias_at_any_alignment(dtype, offset):
    """A bias that starts inside a 16-byte unit (a slice of a larger tensor): the kernels'
    bias prefetch covers only whole units inside it, and every row routes it right."""
    n = 384
    for row in tables.router.ROUTER_VARIANTS:
        if not row.n_min <= n <= row.n_max:
            continue
        x, w, bias = make_case(row.m_lo, n, 7168, 8, 1, 1, None, "cuda", seed=offset)
        w = w.to(getattr(torch, row.weight_dtype))
        bias = (torch.randn(n + offset, device="cuda") * 0.1).to(dtype)[offset:]
        assert bias.data_ptr() % 16 == (offset * bias.element_size()) % 16
        args = (8, 1, 1, True, 2.5)
        out = kimi_router_ops.router_with_variant(x, w, bias, *args, row.name)
        check_router(out, x, w, bias, *args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for m, n, k, top_k, n_group, topk_group in [(3, 64, 96, 6, 4, 2), (1, 256, 512, 8, 8, 4), (0, 16, 8, 2, 1, 1)]:
        for bias_kind in (None, "fp32"):
            x, w, bias = make_case(m, n, k, top_k, n_group, topk_group, bias_kind, device)
            torch.library.opcheck(
                torch.ops.kimi.ll_bf16_router.default, (x, w, bias, top_k, n_group, topk_group, True, 2.5)
            )


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["deepseek-v3"]
    _, w, bias = make_case(1, n, 512, top_k, n_group, topk_group, device=device)

    def route(x):
        return kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, scale)

    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    for m in (1, 3, 8, 5):
        x = random_bf16(m, 512, device=device)
        for a, b in zip(compiled(x), route(x)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("m", [2, 40])  # the fused kernel, the two launches (GPU)
@pytest.mark.parametrize("device", DEVICES)
def test_no_derivative(device, m):
    x = random_bf16(m, 64, device=device).requires_grad_()
    w = random_bf16(8, 64, device=device).requires_grad_()
    outputs = kimi_router_ops.ll_bf16_router(x, w, None, 2)
    assert not any(t.requires_grad for t in outputs)  # on every path, CPU reference included
    with pytest.raises(RuntimeError, match="does not require grad"):
        outputs[0].sum().backward()


def bad_router_calls(device):
    bf = lambda *s: random_bf16(*s, device=device)  # noqa: E731
    x, w = bf(2, 64), bf(16, 64)
    f32 = lambda *s: torch.zeros(*s, device=device)  # noqa: E731
    return {
        "n_group does not divide N": ((x, w, None, 2, 3, 1), RuntimeError, "n_group must divide the number of experts, got n_group=3 and N=16"),
        "n_group zero": ((x, w, None, 2, 0, 1), RuntimeError, "n_group must divide"),
        "topk_group > n_group": ((x, w, None, 2, 4, 5), RuntimeError, r"topk_group must be in \[1, n_group=4\], got 5"),
        "topk_group zero": ((x, w, None, 2, 4, 0), RuntimeError, "topk_group must be in"),
        "groups of one": ((x, w, None, 2, 16, 4), RuntimeError, "each group needs at least 2 experts"),
        "top_k > N": ((x, w, None, 17), RuntimeError, r"top_k must be in \[1, experts in the kept groups=16\], got 17"),
        "top_k > kept experts": ((x, w, None, 9, 4, 2), RuntimeError, "experts in the kept groups=8"),
        "top_k zero": ((x, w, None, 0), RuntimeError, "top_k must be in"),
        "scale NaN": ((x, w, None, 2, 1, 1, True, float("nan")), RuntimeError,
                      "routed_scaling_factor must be finite and > 0, got nan"),
        "scale negative": ((x, w, None, 2, 1, 1, True, -3.0), RuntimeError, "routed_scaling_factor must be finite"),
        "scale zero": ((x, w, None, 2, 1, 1, True, 0.0), RuntimeError, "routed_scaling_factor must be finite"),
        "bias wrong length": ((x, w, f32(15), 2), RuntimeError, r"e_score_correction_bias must have shape \[N\]=\[16\]"),
        "bias 2-D": ((x, w, f32(1, 16), 2), RuntimeError, "e_score_correction_bias must have shape"),
        "bias float64": ((x, w, f32(16).double(), 2), RuntimeError, "e_score_correction_bias must be torch.float32 or torch.bfloat16, got torch.float64"),
        "bias int32": ((x, w, f32(16).int(), 2), RuntimeError, "e_score_correction_bias must be"),
        "x float32": ((x.float(), w, None, 2), RuntimeError, "ll_bf16_router: hidden_states must be torch.bfloat16"),
        "K mismatch": ((x, bf(16, 63), None, 2), RuntimeError, "ll_bf16_router: .* must have the same K"),
        "w 3-D": ((x, bf(1, 16, 64), None, 2), RuntimeError, "ll_bf16_router: router_weight must be 2-D"),
    }


@pytest.mark.parametrize("device", DEVICES + ["compiled"])
@pytest.mark.parametrize("case", list(bad_router_calls("cpu")))
def test_bad_input(device, case):
    args, error, message = bad_router_calls("cpu" if device == "compiled" else device)[case]
    with pytest.raises(error, match=message):
        call_in(device, kimi_router_ops.ll_bf16_router, *args)
    device = "cpu" if device == "compiled" else device  # the process (and the CUDA context) is still fine
    x, w, bias = make_case(2, 16, 64, 4, 4, 2, device=device)
    check_router(kimi_router_ops.ll_bf16_router(x, w, bias, 4, 4, 2), x, w, bias, 4, 4, 2, True, 1.0)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_bias_on_another_device_is_an_error():
    x, w = random_bf16(2, 64, device="cuda"), random_bf16(16, 64, device="cuda")
    with pytest.raises(RuntimeError, match="e_score_correction_bias must be on the device of router_weight"):
        kimi_router_ops.ll_bf16_router(x, w, torch.zeros(16), 2)


@requires_kernel_gpu
def test_cuda_graph_capture_and_replay_after_updates():
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["deepseek-v3"]
    x, w, bias = make_case(4, n, 7168, top_k, n_group, topk_group, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        out = kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, scale)
    for seed in range(3):
        fresh_x, fresh_w, fresh_bias = make_case(4, n, 7168, top_k, n_group, topk_group, device="cuda", seed=seed + 1)
        x.copy_(fresh_x), w.copy_(fresh_w), bias.copy_(fresh_bias)
        graph.replay()
        torch.cuda.synchronize()
        check_router(out, x, w, bias, top_k, n_group, topk_group, True, scale)


@requires_kernel_gpu
def test_two_streams_route_concurrently():
    """Calls on two streams at once each get their own, correct results."""
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["deepseek-v3"]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    cases = [make_case(8, n, 7168, top_k, n_group, topk_group, device="cuda", seed=s) for s in range(2)]
    expected = [kimi_router_ops.ll_bf16_router(x, w, b, top_k, n_group, topk_group, True, scale) for x, w, b in cases]
    torch.cuda.synchronize()
    for _ in range(50):
        outs = []
        for stream, (x, w, b) in zip(streams, cases):
            with torch.cuda.stream(stream):
                outs.append(kimi_router_ops.ll_bf16_router(x, w, b, top_k, n_group, topk_group, True, scale))
        torch.cuda.synchronize()
        for out, ref in zip(outs, expected):
            assert all(torch.equal(a, b) for a, b in zip(out, ref))


def test_forced_router_variant_on_cpu_is_the_reference():
    x, w, bias = make_case(3, 64, 96, 6, 4, 2)
    expected = kimi_router_ops.ll_bf16_router(x, w, bias, 6, 4, 2, True, 2.5)
    for r in tables.router.ROUTER_VARIANTS:
        out = kimi_router_ops.router_with_variant(x, w, bias, 6, 4, 2, True, 2.5, r.name)
        assert all(torch.equal(a, b) for a, b in zip(out, expected))
    with pytest.raises(RuntimeError, match="router_with_variant: unknown variant 'router_nope'; expected one of: "
                                           "router_m1"):
        kimi_router_ops.router_with_variant(x, w, bias, 6, 4, 2, True, 2.5, "router_nope")
    gate_bias = random_bf16(64)  # router's contract and reference, gate bias included
    expected = kimi_router_ops.router(x, w, bias, 6, 4, 2, True, 2.5, gate_bias=gate_bias)
    out = kimi_router_ops.router_with_variant(x, w, bias, 6, 4, 2, True, 2.5, tables.router.ROUTER_VARIANTS[0].name,
                                              gate_bias=gate_bias)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def test_forced_router_variant_opcheck():
    x, w, bias = make_case(3, 64, 96, 6, 4, 2)
    for gate_bias in (None, random_bf16(64)):
        torch.library.opcheck(
            torch.ops.kimi.router_with_variant.default,
            (x, w, bias, 6, 4, 2, True, 2.5, tables.router.ROUTER_VARIANTS[0].name, "sigmoid", gate_bias),
        )


@requires_kernel_gpu
@pytest.mark.parametrize("row", tables.router.ROUTER_VARIANTS, ids=lambda r: r.name)
def test_every_router_variant(row):
    """Each fused row, forced, on every model config it can route, at both ends of its M
    range and with each bias kind: the reference's routing and the GEMM row's logits."""
    for config, (n, top_k, n_group, topk_group, scale) in MODEL_CONFIGS.items():
        if n > row.n_max:
            continue
        for m in sorted({row.m_lo, row.m_hi}):
            for bias_kind in (None, "fp32", "bf16"):
                x, w, bias = make_case(m, n, 7168, top_k, n_group, topk_group, bias_kind, "cuda", seed=m)
                w = w.to(getattr(torch, row.weight_dtype))
                args = (top_k, n_group, topk_group, True, scale)
                out = kimi_router_ops.router_with_variant(x, w, bias, *args, row.name)
                check_router(out, x, w, bias, *args)
                assert torch.equal(out[2], kimi_router_ops.router_gemm_with_variant(x, w, row.gemm))


@requires_kernel_gpu
@settings(max_examples=100, deadline=None)
@given(problem=fused_router_problems(), row=st.sampled_from(tables.router.ROUTER_VARIANTS), renormalize=st.booleans())
def test_property_cuda_forced_rows(problem, row, renormalize):
    problem["m"] = min(problem["m"], row.m_hi)
    problem["k"] = row.k_only or problem["k"]  # K compiled in: that K (other K: the misfit test)
    if problem["n"] > row.n_max:
        return  # outside the row (the misfit error has its own test)
    x, w, bias = make_case(**problem, device="cuda")
    w = w.to(getattr(torch, row.weight_dtype))
    args = (problem["top_k"], problem["n_group"], problem["topk_group"], renormalize, 1.5)
    out = kimi_router_ops.router_with_variant(x, w, bias, *args, row.name)
    check_router(out, x, w, bias, *args)


@requires_kernel_gpu
def test_forced_router_variant_that_cannot_serve_is_an_error():
    x, w, bias = make_case(4, 384, 7168, 8, 1, 1, device="cuda")
    small = next(r for r in tables.router.ROUTER_VARIANTS if r.n_max == 256 and r.m_lo <= 4 <= r.m_hi)
    with pytest.raises(RuntimeError, match=f"variant {small.name} routes N <= 256 experts, got N = 384"):
        kimi_router_ops.router_with_variant(x, w, bias, 8, 1, 1, True, 1.0, small.name)
    m1 = tables.router.ROUTER_VARIANTS[0]
    with pytest.raises(RuntimeError, match=f"variant {m1.name} handles 1 <= M <= 1, got M = 4"):
        kimi_router_ops.router_with_variant(x, w, bias, 8, 1, 1, True, 1.0, m1.name)
    fits = next(r for r in tables.router.ROUTER_VARIANTS if r.n_min <= 384 <= r.n_max and r.m_lo <= 4 <= r.m_hi)
    with pytest.raises(RuntimeError, match="picks top_k <= 32, got 33"):
        kimi_router_ops.router_with_variant(x, w, bias, 33, 1, 1, True, 1.0, fits.name)
    k_only = next(r for r in tables.router.ROUTER_VARIANTS if r.k_only)  # K compiled in: others refused
    x, w, bias = make_case(1, k_only.n_max, k_only.k_only + 8, 8, 1, 1, device="cuda")
    with pytest.raises(RuntimeError, match=f"variant {k_only.name} computes K = {k_only.k_only} only "
                                           f"\\(compiled in\\), got K = {k_only.k_only + 8}"):
        kimi_router_ops.router_with_variant(x, w, bias, 8, 1, 1, True, 1.0, k_only.name)
    check_router(kimi_router_ops.ll_bf16_router(x, w, bias, 8), x, w, bias, 8, 1, 1, True, 1.0)


@requires_kernel_gpu
def test_two_graphs_replayed_side_by_side():
    """Two captured router calls replayed at once on two streams, many times: each graph's
    call has its own handoff buffer, so both stay correct."""
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["kimi-k2"]
    cases = [make_case(m, n, 7168, top_k, n_group, topk_group, device="cuda", seed=m) for m in (1, 8)]
    expected = [kimi_router_ops.ll_bf16_router(x, w, b, top_k, n_group, topk_group, True, scale) for x, w, b in cases]
    capture = torch.cuda.Stream()
    graphs, outs = [], []
    for x, w, b in cases:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture):
            outs.append(kimi_router_ops.ll_bf16_router(x, w, b, top_k, n_group, topk_group, True, scale))
        graphs.append(graph)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    for _ in range(100):
        for stream, graph in zip(streams, graphs):
            with torch.cuda.stream(stream):
                graph.replay()
        torch.cuda.synchronize()
        for out, ref in zip(outs, expected):
            assert all(torch.equal(a, b) for a, b in zip(out, ref))


@requires_kernel_gpu
def test_cuda_bitwise_deterministic():
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS["kimi-k3"]
    x, w, bias = make_case(16, n, 7168, top_k, n_group, topk_group, device="cuda")
    first = kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, scale)
    for _ in range(10):
        again = kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, scale)
        assert all(torch.equal(a, b) for a, b in zip(again, first))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("m", [12, 16, 40])
def test_padding_rows_get_valid_distinct_ids_and_leave_the_others_alone(device, config, m):
    """hidden_states rows of NaN, +-inf or zeros, on the fused path (M <= 16) and above it."""
    from test_moe_routing import check_padding_rows, padding_rows

    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    x, w, bias = make_case(m, n, 7168, top_k, n_group, topk_group, device=device, seed=m)
    pad = padding_rows(x)
    args = (top_k, n_group, topk_group, True, scale)
    weights, ids, logits = kimi_router_ops.ll_bf16_router(pad, w, bias, *args)
    # Each row as the routing op routes that row of the logits (the fused router's bit for
    # bit on the GPU: test_moe_routing).
    check_padding_rows(weights, ids, n, top_k, lambda r: kimi_router_ops.moe_routing(logits[r:r + 1], bias, *args))
