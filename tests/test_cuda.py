"""CUDA kernels: numerics, variants, CUDA graphs, torch.compile, streams, determinism."""

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops import tables
from kimi_router_ops.testing import gemm_row_linked
from conftest import MODEL_SHAPES, assert_gemm_close, gemm_rows, random_bf16, requires_kernel_gpu

pytestmark = requires_kernel_gpu
OUT_DTYPES = [torch.float32, torch.bfloat16]


def check(out, x, w, out_dtype):
    assert out.shape == (x.shape[0], w.shape[0]) and out.dtype == out_dtype and out.is_cuda
    assert_gemm_close(out, x, w, out_dtype)


@pytest.mark.parametrize("model", list(MODEL_SHAPES))
@pytest.mark.parametrize("m", list(range(1, 17)) + [17, 64, 300])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_model_shapes(model, m, out_dtype):
    n, k = MODEL_SHAPES[model]
    x, w = random_bf16(m, k, device="cuda"), random_bf16(n, k, device="cuda")
    check(kimi_router_ops.ll_bf16_gemm(x, w, out_dtype), x, w, out_dtype)


@pytest.mark.parametrize("variant", gemm_rows(tables.gemm.ALL_VARIANTS) + ["cublas"])
@pytest.mark.parametrize("aligned", [True, False])
def test_every_variant(variant, aligned):
    row = next((v for v in tables.gemm.ALL_VARIANTS if v.name == variant), None)
    tokens = row.tokens if row else 16
    k = 7168 if aligned else 7167
    for m in sorted({1, tokens}):
        for out_dtype in OUT_DTYPES:
            x, w = random_bf16(m, k, device="cuda"), random_bf16(300, k, device="cuda")
            if row:
                w = w.to(getattr(torch, row.kernel.weight_dtype))
            if row and not aligned and 1 not in row.kernel.vecs:
                with pytest.raises(RuntimeError, match=f"variant {variant} needs K % {row.kernel.vecs[0]} == 0"):
                    kimi_router_ops.router_gemm_with_variant(x, w, variant, out_dtype)
                continue
            check(kimi_router_ops.router_gemm_with_variant(x, w, variant, out_dtype), x, w, out_dtype)


@pytest.mark.parametrize("variant", gemm_rows(tables.gemm.ALL_VARIANTS))
def test_every_variant_odd_shapes(variant):
    """Tails of every split: N not a multiple of the expert tile, K not a multiple of the
    32-element chunk or of the warps' and cluster's share of it, M inside the token bucket."""
    row = next(v for v in tables.gemm.ALL_VARIANTS if v.name == variant)
    k_only = getattr(row.kernel, "k", 0)  # K compiled in: that K, every N tail; others refused
    shapes = [(1, k_only), (17, k_only), (895, k_only)] if k_only else [(1, 8), (17, 40), (33, 7176), (895, 1000)]
    for n, k in shapes:
        for m in sorted({1, 3, row.tokens} & set(range(1, row.tokens + 1))):
            x, w = random_bf16(m, k, device="cuda"), random_bf16(n, k, device="cuda")
            w = w.to(getattr(torch, row.kernel.weight_dtype))
            check(kimi_router_ops.router_gemm_with_variant(x, w, variant), x, w, torch.float32)
    if k_only:
        x, w = random_bf16(1, k_only + 8, device="cuda"), random_bf16(17, k_only + 8, device="cuda")
        with pytest.raises(RuntimeError, match=f"variant {variant} computes K = {k_only} only"):
            kimi_router_ops.router_gemm_with_variant(x, w, variant)


@pytest.mark.parametrize("variant", gemm_rows(v for v in tables.gemm.ALL_VARIANTS if isinstance(v.kernel, tables.gemm.Mma)))
def test_tensor_core_variants_take_any_m_in_token_tiles(variant):
    """More tokens than a CTA computes take more CTAs (grid z): each tile's rows, the
    partial last tile and every output of every tile."""
    tokens = tables.gemm.variant(variant).kernel.tokens
    for n, k in [(33, 7176), (300, 1000)]:
        for m in (tokens + 1, 2 * tokens + 3, 5 * tokens):
            x, w = random_bf16(m, k, device="cuda"), random_bf16(n, k, device="cuda")
            check(kimi_router_ops.router_gemm_with_variant(x, w, variant), x, w, torch.float32)


def test_tensor_core_kernels_of_one_k_split_sum_alike():
    """Kernels that split K alike (cluster, warps, chunks a step) add each output's products
    in the same order, whatever their tokens a CTA, passes or tiles: the same logits, bit
    for bit. (So a token-tiled kernel above M = 16 gives each token what the 16-token kernel
    gives it.)"""
    groups = {}
    for v in tables.gemm.ALL_VARIANTS:
        if isinstance(v.kernel, tables.gemm.Mma) and gemm_row_linked(v.name):
            groups.setdefault((v.kernel.cluster_k, v.kernel.warps, v.kernel.unroll), []).append(v.name)
    compared = 0
    for names in groups.values():
        if len(names) < 2:
            continue
        for n, m in [(200, 5), (896, 40), (33, 70)]:
            x, w = random_bf16(m, 7168, device="cuda"), random_bf16(n, 7168, device="cuda")
            outs = [kimi_router_ops.router_gemm_with_variant(x, w, name) for name in names]
            for name, out in zip(names[1:], outs[1:]):
                assert torch.equal(out, outs[0]), (names[0], name, n, m)
            compared += 1
    assert compared >= 3  # every (N, M) case of the one group of u7 kernels


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 300),
    n=st.integers(1, 1100),
    k=st.integers(1, 9000),
    x_offset=st.integers(0, 9),
    w_offset=st.integers(0, 9),
    scale=st.floats(1e-4, 1e2),
    out_dtype=st.sampled_from(OUT_DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_cuda(m, n, k, x_offset, w_offset, scale, out_dtype, seed):
    """Any shape; offsets make misaligned pointers and row strides (the vec1 kernels)."""
    g = torch.Generator().manual_seed(seed)
    x = random_bf16(m, k + x_offset, scale=scale, generator=g, device="cuda")[:, x_offset:]
    w = random_bf16(n, k + w_offset, generator=g, device="cuda")[:, w_offset:]
    check(kimi_router_ops.ll_bf16_gemm(x, w, out_dtype), x, w, out_dtype)


@pytest.mark.parametrize("model", list(MODEL_SHAPES))
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_the_chosen_m1_kernel_sums_as_its_run_time_k_twins(model, out_dtype):
    """The M = 1 choice (K compiled in where a row has the model's K) gives the bits of every
    dot-product row with its threads and unroll, whatever their experts a CTA and K."""
    n, k = MODEL_SHAPES[model]
    x, w = random_bf16(1, k, device="cuda"), random_bf16(n, k, device="cuda")
    chosen = tables.gemm.variant(kimi_router_ops.chosen_variant(1, n, k).split(":")[0]).kernel
    twins = [v.name for v in tables.gemm.ALL_VARIANTS if isinstance(v.kernel, tables.gemm.Dotprod) and v.kernel.tokens == 1
             and not v.kernel.token_tiles and v.kernel.weight_dtype == "bfloat16"
             and (v.kernel.threads, v.kernel.unroll, v.kernel.k) == (chosen.threads, chosen.unroll, 0)]
    assert twins, chosen
    linked = [name for name in twins if gemm_row_linked(name)]
    if not linked:
        pytest.skip(f"the run-time-K twins {twins} are lab rows: _C was built without KIMI_ROUTER_OPS_LAB=1")
    for twin in linked:
        assert torch.equal(kimi_router_ops.ll_bf16_gemm(x, w, out_dtype),
                           kimi_router_ops.router_gemm_with_variant(x, w, twin, out_dtype)), twin


@pytest.mark.parametrize("model", list(MODEL_SHAPES))
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_prefetch_is_bitwise_equal_to_no_prefetch(model, out_dtype):
    """Each lab twin (no prefetch, no PDL, another trigger point) sums as its product row."""
    missing = [name for name in ("m1_r4_t256", "mma8_t2c4w8u7_noprefetch") if not gemm_row_linked(name)]
    if missing:
        pytest.skip(f"the lab twins {missing}: _C was built without KIMI_ROUTER_OPS_LAB=1")
    n, k = MODEL_SHAPES[model]
    x, w = random_bf16(1, k, device="cuda"), random_bf16(n, k, device="cuda")
    prefetch = kimi_router_ops.router_gemm_with_variant(x, w, "m1_prefetch_r4_t256", out_dtype)
    assert torch.equal(prefetch, kimi_router_ops.router_gemm_with_variant(x, w, "m1_r4_t256", out_dtype))
    assert torch.equal(prefetch, kimi_router_ops.router_gemm_with_variant(x, w, "m1_r4_t256_nopdl", out_dtype))
    early = kimi_router_ops.router_gemm_with_variant(x, w, "m1_prefetch_r4_t256_before_wait", out_dtype)
    assert torch.equal(prefetch, early)  # the next kernel launched before our wait
    for m in (1, 5):  # the tensor-core twins
        xm = random_bf16(m, k, device="cuda")
        assert torch.equal(
            kimi_router_ops.router_gemm_with_variant(xm, w, "mma8_t2c4w8u7", out_dtype),
            kimi_router_ops.router_gemm_with_variant(xm, w, "mma8_t2c4w8u7_noprefetch", out_dtype),
        )
    for m, name in ((5, "mma8_t2c4w8u7"), (12, "mma16_t2c4w8u7")):  # the next kernel launched earlier
        xm = random_bf16(m, k, device="cuda")
        assert torch.equal(
            kimi_router_ops.router_gemm_with_variant(xm, w, name, out_dtype),
            kimi_router_ops.router_gemm_with_variant(xm, w, f"{name}_before_wait", out_dtype),
        )


@pytest.mark.parametrize("m", [1, 2, 5, 16, 40, 256])
def test_bitwise_deterministic(m):
    x, w = random_bf16(m, 7168, device="cuda"), random_bf16(896, 7168, device="cuda")
    first = kimi_router_ops.ll_bf16_gemm(x, w)
    for _ in range(20):
        assert torch.equal(kimi_router_ops.ll_bf16_gemm(x, w), first)


def test_every_output_element_is_written():
    """Outputs come from torch's caching allocator: poison the block, then reuse it."""
    for m, n in [(1, 896), (7, 33), (16, 1), (100, 300)]:
        torch.empty(m * n, dtype=torch.float32, device="cuda").fill_(float("nan"))
        x, w = random_bf16(m, 256, device="cuda"), random_bf16(n, 256, device="cuda")
        out = kimi_router_ops.ll_bf16_gemm(x, w)
        assert torch.isfinite(out).all()


def test_non_contiguous_inputs():
    x = random_bf16(64, 5, device="cuda").t()  # inner stride 5: copied once
    w = random_bf16(40, 64, device="cuda")
    check(kimi_router_ops.ll_bf16_gemm(x, w), x, w, torch.float32)
    x = random_bf16(1, 64, device="cuda").expand(4, 64)  # row stride 0
    check(kimi_router_ops.ll_bf16_gemm(x, w), x, w, torch.float32)


def test_cuda_graph_replay_sees_updated_inputs():
    n, k = MODEL_SHAPES["kimi-k3"]
    x, w = random_bf16(1, k, device="cuda"), random_bf16(n, k, device="cuda")
    kimi_router_ops.ll_bf16_gemm(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kimi_router_ops.ll_bf16_gemm(x, w)
    for _ in range(3):
        x.copy_(random_bf16(1, k, device="cuda"))
        w.copy_(random_bf16(n, k, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, kimi_router_ops.ll_bf16_gemm(x, w))
        check(out, x, w, torch.float32)


def test_cuda_graph_capture_as_first_call_in_fresh_process():
    script = textwrap.dedent(
        """
        import torch, kimi_router_ops
        x = torch.randn(1, 7168, device="cuda").bfloat16()
        w = torch.randn(896, 7168, device="cuda").bfloat16()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # the op's very first call: kernels load inside capture
            out = kimi_router_ops.ll_bf16_gemm(x, w)
        graph.replay()
        torch.cuda.synchronize()
        ref = x.double() @ w.double().t()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, err
        print("ok", err)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_compile_reduce_overhead():
    torch._dynamo.reset()
    w = random_bf16(384, 7168, device="cuda")

    def router(x):
        logits = kimi_router_ops.ll_bf16_gemm(x, w)
        return logits, torch.topk(logits, 8, dim=-1).indices

    compiled = torch.compile(router, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        for m in (1, 4):
            x = random_bf16(m, 7168, device="cuda")
            (logits, top), (logits_ref, top_ref) = compiled(x), router(x)
            assert torch.equal(logits, logits_ref) and torch.equal(top, top_ref)


def test_compile_graph_trees_dynamic_m():
    """reduce-overhead with dynamic M: never skips CUDA graphs, and compiles at most twice
    (M == 1 is specialized by dynamo's 0/1 rule; every other M shares one dynamic graph)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    w = random_bf16(896, 7168, device="cuda")

    def router(x):
        return kimi_router_ops.ll_bf16_gemm(x, w)

    compiled = torch.compile(router, mode="reduce-overhead", fullgraph=True, dynamic=True)
    for m in (1, 2, 4, 8, 3, 16, 2, 1, 64):
        x = random_bf16(m, 7168, device="cuda")
        for _ in range(3):
            assert torch.equal(compiled(x), router(x))
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_opcheck_cuda_model_shape():
    for m in (1, 2, 16):
        x, w = random_bf16(m, 7168, device="cuda"), random_bf16(256, 7168, device="cuda")
        torch.library.opcheck(torch.ops.kimi.ll_bf16_gemm.default, (x, w, torch.float32))


def test_side_stream():
    x, w = random_bf16(4, 7168, device="cuda"), random_bf16(896, 7168, device="cuda")
    expected = kimi_router_ops.ll_bf16_gemm(x, w)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2  # producer on the side stream
        out = kimi_router_ops.ll_bf16_gemm(y, w)
        doubled = out / 2  # consumer on the side stream
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(doubled, expected)


def test_side_stream_graph_capture():
    x, w = random_bf16(1, 7168, device="cuda"), random_bf16(256, 7168, device="cuda")
    kimi_router_ops.ll_bf16_gemm(x, w)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = kimi_router_ops.ll_bf16_gemm(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, kimi_router_ops.ll_bf16_gemm(x, w))
