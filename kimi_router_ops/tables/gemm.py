"""The GEMM kernels (kernels/gemm_dotprod.py, kernels/gemm_mma.py): VARIANTS (the rows the
dispatch runs), LAB_VARIANTS (experiments, run by name), CHOICES (which row runs for an M, N
and K: first match) and BATCH_INVARIANT_CHOICES."""

from dataclasses import dataclass
from typing import NamedTuple, Union

from . import INT32_MAX, check_trigger

@dataclass(frozen=True)
class Dotprod:
    """CUDA-core dot product (kernels/gemm_dotprod.py): one CTA per `rows_per_cta`
    experts and `tokens` tokens, all of K, `unroll` vectors per thread in flight; bf16 or
    fp32 weights."""

    tokens: int
    rows_per_cta: int
    unroll: int
    threads: int = 128
    weight_dtype: str = "bfloat16"
    # More tokens than `tokens` take more CTAs along the grid's y (any M); otherwise M <= tokens.
    token_tiles: bool = False
    # K compiled in (bf16, 16-byte loads; the kernel computes that K only: a choice of it must
    # bound K to it); 0: K is a run-time value.
    k: int = 0

    @property
    def vecs(self) -> tuple:
        """Elements per load it is compiled for: one 16-byte vector where K, the row strides
        and the pointers allow it; bf16 also 1 (scalar loads: any K, any alignment)."""
        if self.k:
            return (8,)
        return (8, 1) if self.weight_dtype == "bfloat16" else (4,)

    def prefetch_loads(self) -> int:
        """Global loads per thread before the PDL wait in a prefetch variant."""
        return self.rows_per_cta * self.unroll


@dataclass(frozen=True)
class Mma:
    """Tensor cores (kernels/gemm_mma.py): `tiles` 16-expert tiles and `tokens` tokens per
    CTA (more tokens take more CTAs), K split over the `cluster_k` CTAs of a cluster and the
    `warps` warps of each, `unroll` 32-element chunks per warp and step."""

    tiles: int
    cluster_k: int
    warps: int
    unroll: int
    tokens: int
    pass_tokens: int = 0  # tokens loaded at once, in passes over the same weights (0: all)
    vecs = (8,)  # 16-byte loads only: K % 8 == 0 and 16-byte aligned rows
    weight_dtype = "bfloat16"
    token_tiles = True  # grid z

    def prefetch_loads(self) -> int:
        return 2 * self.tiles * self.unroll


@dataclass(frozen=True)
class GemmRow:
    """One GEMM kernel: its family's compile-time parameters and how it meets the kernel
    before it (PDL)."""

    name: str
    kernel: Union[Dotprod, Mma]
    prefetch: bool = True  # load the first weight step before the PDL grid-dependency wait
    pdl: bool = True  # launched with programmatic dependent launch
    trigger: str = "after_x"  # one of TRIGGERS

    def __post_init__(self):
        check_trigger(self)

    @property
    def tokens(self) -> int:
        """Tokens one CTA computes."""
        return self.kernel.tokens

    @property
    def max_m(self) -> int:
        """The largest M the kernel computes: 65535 CTAs of `tokens` along the grid where it
        tiles tokens, one CTA's otherwise."""
        return 65535 * self.tokens if self.kernel.token_tiles else self.tokens

    @property
    def x_dtypes(self) -> tuple:
        """hidden_states dtypes it is compiled for: fp32 weights take bf16 or fp32 tokens."""
        return ("bfloat16",) if self.kernel.weight_dtype == "bfloat16" else ("bfloat16", "float32")


def _mma(name, tokens, tiles, cluster_k, warps, unroll, pass_tokens=0, **launch):
    return GemmRow(name, Mma(tiles, cluster_k, warps, unroll, tokens, pass_tokens), **launch)


def _dotprod(name, tokens, rows, unroll, threads=128, k=0, **launch):
    return GemmRow(name, Dotprod(tokens, rows, unroll, threads, k=k), **launch)


def _f32w(name, tokens, rows, unroll, threads, tiles=False):
    """An fp32-weight dot product."""
    return GemmRow(name, Dotprod(tokens, rows, unroll, threads, weight_dtype="float32", token_tiles=tiles))


# The GEMM kernels the dispatch runs (CHOICES) and the fused routers build on (ROUTER_GEMMS).
# Why each knob is set as it is: docs/kernel-notes.md.
VARIANTS = (
    _dotprod("m1_prefetch_r4_t256", 1, rows=4, unroll=4, threads=256),  # M = 1
    # M = 1 at K = 7168 (Kimi, DeepSeek), K compiled in: no clamps, a thread's loads offsets of
    # one address, so few registers and every CTA resident at once: one expert a CTA of 256
    # threads up to 384 experts (r4's sums), of 128 threads (70 registers, 7 an SM) for
    # Kimi-K3's 896 in one wave. After the layer they start cold faster (docs/benchmarks.md).
    # The 256-thread kernel lets the next kernel launch only after its stores: as fast after
    # the layer, 0.6-0.7 us faster back to back behind a producer. The 128-thread one signals
    # after its x loads: there the signal also keeps ptxas from sinking them (kernel-notes.md).
    _dotprod("m1_prefetch_r1_t256_k7168_at_exit", 1, rows=1, unroll=4, threads=256, k=7168, trigger="at_exit"),
    _dotprod("m1_prefetch_r1_t128_k7168", 1, rows=1, unroll=7, k=7168),
    # M = 2 likewise, 129..384 experts (126 registers, 4 CTAs an SM): after the layer 0.6-1.3 us
    # faster than the tensor cores behind every producer (H100, docs/benchmarks.md). Kimi-K3's
    # 896 stay on the tensor cores: there the dot product is 0.3 slower behind AttnRes. Back to
    # back its fused router is 0.3-1.0 slower behind a producer (the SMs stay full).
    _dotprod("m2_prefetch_r1_t128_k7168", 2, rows=1, unroll=7, k=7168),
    _mma("mma8_t2c4w8u7", 8, tiles=2, cluster_k=4, warps=8, unroll=7),  # M = 2..8: 7 chunks a warp at K = 7168
    _mma("mma16_t2c4w8u7", 16, tiles=2, cluster_k=4, warps=8, unroll=7),  # M = 9..16
    _mma("mma16_t2c4w8u7_before_wait", 16, tiles=2, cluster_k=4, warps=8, unroll=7, trigger="before_wait"),
    _mma("mma8_t2c4w8u8", 8, tiles=2, cluster_k=4, warps=8, unroll=8),  # K up to 8192 in one step
    _mma("mma16_t1c8w8u4", 16, tiles=1, cluster_k=8, warps=8, unroll=4),  # the same for 16 tokens
    # 32 tokens a CTA in two passes of 16 over the weights in its registers (M = 17..96).
    _mma("mma32p16_t2c4w8u7_before_wait", 32, tiles=2, cluster_k=4, warps=8, unroll=7, pass_tokens=16,
         trigger="before_wait"),
    # Scalar loads (any K, any alignment); also N > 896 at small K, where the tensor-core
    # grid (32 clusters) does not fit at once.
    _dotprod("m2", 2, rows=2, unroll=4, prefetch=False),
    _dotprod("m4", 4, rows=2, unroll=4, prefetch=False),
    _dotprod("m8", 8, rows=4, unroll=2, prefetch=False),
    # The fused router's GEMMs (ROUTER_GEMMS) where the GEMM op runs another kernel.
    _dotprod("m2_prefetch_r4_t256", 2, rows=4, unroll=4, threads=256),
    _mma("mma8_t1c4w8u7", 8, tiles=1, cluster_k=4, warps=8, unroll=7),  # also the GEMM op's for N <= 128
    _mma("mma16_t1c4w8u7", 16, tiles=1, cluster_k=4, warps=8, unroll=7),
    # fp32 weights (gates kept in fp32): 16-byte loads of 4 weights, fp32 FMAs. Two experts a
    # CTA up to K = 4096 (the step's 1024 vectors fit K), one above it (twice the CTAs).
    _f32w("f32w_m1_r2_u4_t256", 1, rows=2, unroll=4, threads=256),
    _f32w("f32w_m4_r2_u4_t256", 4, rows=2, unroll=4, threads=256),
    *(_f32w(f"f32w_m{m}_r1_u8_t256", m, rows=1, unroll=8, threads=256) for m in (1, 2, 4)),
    # Five tokens and more: 8 or 16 a CTA, more along the grid's y.
    _f32w("f32w_m8_r2_u2_t256", 8, rows=2, unroll=2, threads=256, tiles=True),
    _f32w("f32w_m16_r2_u2_t128", 16, rows=2, unroll=2, threads=128, tiles=True),
    # Batch-invariant mode (BATCH_INVARIANT_CHOICES): the M = 1 kernels with one token a CTA
    # along the grid's y, for any M.
    GemmRow("m1_prefetch_r4_t256_tiles", Dotprod(1, 4, 4, 256, token_tiles=True)),
    GemmRow("m1_prefetch_r1_t128_k7168_tiles", Dotprod(1, 1, 7, 128, token_tiles=True, k=7168)),
    _f32w("f32w_m1_r2_u4_t256_tiles", 1, rows=2, unroll=4, threads=256, tiles=True),
    _f32w("f32w_m1_r1_u8_t256_tiles", 1, rows=1, unroll=8, threads=256, tiles=True),
)

# Experiments, run only when named: what the prefetch, PDL and the trigger point are worth.
# The benchmarks (bench/chain.py) and tests (test_cuda.py) compare each to its product twin.
# Compiled only by a build with KIMI_ROUTER_OPS_LAB=1 (aot.lab_build); a wheel has none.
LAB_VARIANTS = (
    _dotprod("m1_r4_t256", 1, rows=4, unroll=4, threads=256, prefetch=False),  # no weights before the wait
    _dotprod("m1_r4_t256_nopdl", 1, rows=4, unroll=4, threads=256, prefetch=False, pdl=False),  # no PDL
    _dotprod("m1_prefetch_r4_t256_before_wait", 1, rows=4, unroll=4, threads=256, trigger="before_wait"),
    # K at run time, one expert a CTA: what compiling K in is worth after the layer.
    _dotprod("m1_prefetch_r1_t128", 1, rows=1, unroll=7),
    _mma("mma8_t2c4w8u7_noprefetch", 8, tiles=2, cluster_k=4, warps=8, unroll=7, prefetch=False),
    _mma("mma8_t2c4w8u7_before_wait", 8, tiles=2, cluster_k=4, warps=8, unroll=7, trigger="before_wait"),
)

# Every GEMM row (the C++ table's rows, in this order; the lab rows' kernels where built).
ALL_VARIANTS = VARIANTS + LAB_VARIANTS


class Choice(NamedTuple):
    """One line of the automatic choice: `variant` ("cublas": at::mm) for m_lo <= M <= m_hi,
    n_min <= N <= n_max and k_min <= K <= k_max and router weights of `weight_dtype`. A row
    built for 16-byte loads only is passed over when the input does not allow them."""

    variant: str
    m_lo: int
    m_hi: int
    n_min: int = 1
    n_max: int = INT32_MAX
    k_min: int = 1
    k_max: int = INT32_MAX
    weight_dtype: str = "bfloat16"


def _f32w_choice(name, m_lo, m_hi, **bounds):
    return Choice(name, m_lo, m_hi, weight_dtype="float32", **bounds)


# The automatic choice, first match wins; each line was the fastest on an H200 where it
# applies (docs/benchmarks.md). Problems no line takes go to cuBLAS.
CHOICES = (
    Choice("m1_prefetch_r1_t256_k7168_at_exit", 1, 1, n_max=384, k_min=7168, k_max=7168),
    Choice("m1_prefetch_r1_t128_k7168", 1, 1, n_min=385, n_max=896, k_min=7168, k_max=7168),
    Choice("m1_prefetch_r4_t256", 1, 1),
    Choice("m2_prefetch_r1_t128_k7168", 2, 2, n_min=129, n_max=384, k_min=7168, k_max=7168),
    Choice("mma8_t2c4w8u8", 2, 8, k_min=7169, k_max=8192),  # u7 takes two steps there
    Choice("mma8_t1c4w8u7", 2, 8, n_max=128),
    Choice("m2", 2, 2, n_min=897, k_max=4096),
    Choice("m4", 3, 4, n_min=897, k_max=4096),
    Choice("m8", 5, 8, n_min=897, k_max=2048),
    Choice("mma8_t2c4w8u7", 2, 8),
    Choice("mma16_t1c8w8u4", 9, 16, n_max=256, k_min=7169, k_max=8192),
    Choice("cublas", 9, 16, n_min=897),
    Choice("mma16_t2c4w8u7_before_wait", 9, 16, n_min=385),
    Choice("mma16_t2c4w8u7", 9, 16),
    # Above 16 tokens, measured at K = 7168 only: more token tiles of 16 (grid z) while the
    # clusters fit at once, then 32 tokens a CTA in two passes; cuBLAS beyond.
    Choice("mma16_t2c4w8u7_before_wait", 17, 48, n_max=256, k_max=7168),
    Choice("mma16_t2c4w8u7_before_wait", 17, 32, n_min=257, n_max=384, k_max=7168),
    Choice("mma32p16_t2c4w8u7_before_wait", 49, 96, n_max=256, k_max=7168),
    Choice("mma32p16_t2c4w8u7_before_wait", 33, 64, n_min=257, n_max=384, k_max=7168),
    Choice("mma32p16_t2c4w8u7_before_wait", 17, 32, n_min=385, n_max=896, k_max=7168),
    # K % 8 != 0 or misaligned rows: scalar loads up to M = 4, cuBLAS beyond.
    Choice("m2", 2, 2),
    Choice("m4", 3, 4),
    # fp32 weights. K % 4 != 0 or misaligned rows: cuBLAS in fp32.
    _f32w_choice("f32w_m1_r2_u4_t256", 1, 1, k_max=4096),
    _f32w_choice("f32w_m1_r1_u8_t256", 1, 1),
    _f32w_choice("f32w_m4_r2_u4_t256", 2, 4, k_max=4096),  # at M = 2 too: faster than a bucket of 2
    _f32w_choice("f32w_m2_r1_u8_t256", 2, 2),
    _f32w_choice("f32w_m4_r1_u8_t256", 3, 4),
    _f32w_choice("f32w_m8_r2_u2_t256", 5, 16),
    _f32w_choice("f32w_m8_r2_u2_t256", 17, 64, n_max=128),
    _f32w_choice("f32w_m16_r2_u2_t128", 17, 64),
)

# The choice in batch-invariant mode (kimi_router_ops.set_batch_invariant): a token's logits
# are the same bits whatever else is in the batch, because every M runs the kernel that M = 1
# runs, token-tiled (each line the twin of CHOICES' M = 1 line for the same problems: the
# same threads, unroll and vectors a step, so each expert's sum in the same order, whatever
# the experts a CTA and whether K is compiled in; a test holds the two tables to it). No
# line: cuBLAS one token at a time.
BATCH_INVARIANT_CHOICES = (
    Choice("m1_prefetch_r1_t128_k7168_tiles", 1, INT32_MAX, n_min=385, n_max=896, k_min=7168, k_max=7168),
    Choice("m1_prefetch_r4_t256_tiles", 1, INT32_MAX),
    _f32w_choice("f32w_m1_r2_u4_t256_tiles", 1, INT32_MAX, k_max=4096),
    _f32w_choice("f32w_m1_r1_u8_t256_tiles", 1, INT32_MAX),
)
MAX_M = max(c.m_hi for c in CHOICES if c.variant != "cublas")  # the largest M a kernel is chosen for

def variant(name: str) -> GemmRow:
    """The GEMM row called `name` (product or lab)."""
    return next(v for v in ALL_VARIANTS if v.name == name)
