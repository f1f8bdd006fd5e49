"""The kernel tables: the one place that says which kernels exist and which runs where.

VARIANTS (the GEMM kernels the dispatch runs) and LAB_VARIANTS (experiments, run by name),
ROUTER_VARIANTS (fused routers), ROUTING_KERNELS (the routing op), NORM_KERNELS and
ATTN_RES_KERNEL: the ahead-of-time build (kimi_router_ops.aot, one family record each)
compiles every row for each vector width, dtype and GPU architecture. CHOICES says which
GEMM kernel the dispatch runs for an M, N and K (first match); the rows and the choices go
into a generated C++ header that the CUDA dispatch (csrc/) includes, and the tests read them
from here. Standard library only: the build reads it before anything is built.

A new kernel is one row here; a new choice is one line of CHOICES, with the benchmark that
justifies it (`python -m kimi_router_ops.bench --sweep`, docs/benchmarks.md).
"""

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, Union

INT32_MAX = 2**31 - 1
# Where a kernel lets the next one launch (PDL's griddepcontrol.launch_dependents): once its
# first step's loads are issued ("after_x"), right after its weight prefetch, before its
# own grid-dependency wait ("before_wait"), at kernel entry, before that prefetch
# ("at_entry"), or after its stores ("at_exit", the dot product only). Each is safe: the next
# kernel reads nothing of ours before its own wait returns, after our grid has finished.
# Results do not change; only what the next kernel's weight stream overlaps
# (docs/kernel-notes.md).
TRIGGERS = ("after_x", "before_wait", "at_entry", "at_exit")


def _check_trigger(row):
    if row.trigger not in TRIGGERS:
        raise ValueError(f"{row.name}: trigger must be one of {TRIGGERS}, got {row.trigger!r}")


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
class Variant:
    """One GEMM kernel: its family's compile-time parameters and how it meets the kernel
    before it (PDL)."""

    name: str
    kernel: Union[Dotprod, Mma]
    prefetch: bool = True  # load the first weight step before the PDL grid-dependency wait
    pdl: bool = True  # launched with programmatic dependent launch
    trigger: str = "after_x"  # one of TRIGGERS

    def __post_init__(self):
        _check_trigger(self)

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
    return Variant(name, Mma(tiles, cluster_k, warps, unroll, tokens, pass_tokens), **launch)


def _dotprod(name, tokens, rows, unroll, threads=128, k=0, **launch):
    return Variant(name, Dotprod(tokens, rows, unroll, threads, k=k), **launch)


def _f32w(name, tokens, rows, unroll, threads, tiles=False):
    """An fp32-weight dot product."""
    return Variant(name, Dotprod(tokens, rows, unroll, threads, weight_dtype="float32", token_tiles=tiles))


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
    Variant("m1_prefetch_r4_t256_tiles", Dotprod(1, 4, 4, 256, token_tiles=True)),
    Variant("m1_prefetch_r1_t128_k7168_tiles", Dotprod(1, 1, 7, 128, token_tiles=True, k=7168)),
    _f32w("f32w_m1_r2_u4_t256_tiles", 1, rows=2, unroll=4, threads=256, tiles=True),
    _f32w("f32w_m1_r1_u8_t256_tiles", 1, rows=1, unroll=8, threads=256, tiles=True),
)

# Experiments, run only when named: what the prefetch, PDL and the trigger point are worth.
# The benchmarks (bench/chain.py) and tests (test_cuda.py) compare each to its product twin.
LAB_VARIANTS = (
    _dotprod("m1_r4_t256", 1, rows=4, unroll=4, threads=256, prefetch=False),  # no weights before the wait
    _dotprod("m1_r4_t256_nopdl", 1, rows=4, unroll=4, threads=256, prefetch=False, pdl=False),  # no PDL
    _dotprod("m1_prefetch_r4_t256_before_wait", 1, rows=4, unroll=4, threads=256, trigger="before_wait"),
    # K at run time, one expert a CTA: what compiling K in is worth after the layer.
    _dotprod("m1_prefetch_r1_t128", 1, rows=1, unroll=7),
    _mma("mma8_t2c4w8u7_noprefetch", 8, tiles=2, cluster_k=4, warps=8, unroll=7, prefetch=False),
    _mma("mma8_t2c4w8u7_before_wait", 8, tiles=2, cluster_k=4, warps=8, unroll=7, trigger="before_wait"),
)

# Every compiled GEMM kernel (the C++ table's rows, in this order).
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


@dataclass(frozen=True)
class RouterVariant:
    """The fused router (kernels/router_fused.py): the GEMM row `gemm`, then routing in
    the same grid. Chosen for m_lo <= M <= m_hi and n_min <= N <= n_max (first match);
    n_max also sets the experts a lane holds (n_max / 32, compiled in)."""

    name: str
    gemm: str  # a row of VARIANTS
    m_lo: int
    m_hi: int
    n_min: int
    n_max: int
    # Alone on its SM: enough shared memory that no other CTA, of this kernel or of the next
    # one launched early by PDL, shares an SM with a routing CTA (whose polls would queue
    # behind that CTA's weight loads). Free where the grid fits in one CTA per SM.
    exclusive: bool = False
    trigger: str = "after_x"  # one of TRIGGERS
    # The routing warps ask L2 for the bias at kernel entry, before the PDL wait (one
    # cp.async.bulk.prefetch.L2: it reads nothing into registers, so it is safe whatever
    # the previous kernel writes). A model's per-layer bias is cold in L2 by the time the
    # routing reads it (docs/kernel-notes.md).
    bias_prefetch: bool = False
    # Tensor-core rows: each token routed by a warp of the last cluster's CTA that publishes
    # it, not by the m-th CTA from the end (kernels/router_fused.py, _routing_unit).
    at_publisher: bool = False

    def __post_init__(self):
        _check_trigger(self)

    @property
    def weight_dtype(self) -> str:
        return variant(self.gemm).kernel.weight_dtype


# A lane's share of the experts is a chain of instructions in one warp, so each N range gets
# its own kernels: 4 experts a lane for Qwen3-MoE, 8 for DeepSeek-V3, 12 for Kimi-K2, 28 for
# Kimi-K3, 32 up to 1024 experts (docs/kernel-notes.md).
ROUTER_N_RANGES = ((1, 128), (129, 256), (257, 384), (385, 896), (897, 1024))
N128, N256, N384, N896, N1024 = ROUTER_N_RANGES


class FusedGemm(NamedTuple):
    """One entry of ROUTER_GEMMS: a GEMM row fused for an M range and some N ranges."""

    gemm: str  # a row of VARIANTS
    m_lo: int
    m_hi: int
    n_ranges: tuple  # of ROUTER_N_RANGES
    exclusive: bool
    trigger: str
    bias_prefetch: bool
    at_publisher: bool = False


# Each entry fuses the GEMM kernel the GEMM op picks for the same M and N, or one that sums
# the same way (one 16-expert tile a CTA instead of two: bit for bit the same logits), except
# at M = 1 above 384 experts and M = 2 from 129 to 256, where another kernel made the whole
# router faster (docs/api.md says which). The flags are each row's measured best;
# docs/kernel-notes.md says what each buys. Columns: GEMM row, M range, N ranges, exclusive,
# trigger, bias prefetch, routing at the publisher.
ROUTER_GEMMS = (
    FusedGemm("m1_prefetch_r4_t256", 1, 1, (N128, N256), True, "before_wait", True),
    FusedGemm("m1_prefetch_r4_t256", 1, 1, (N384,), True, "after_x", True),
    FusedGemm("m2_prefetch_r4_t256", 2, 2, (N256,), True, "before_wait", True),
    FusedGemm("mma8_t2c4w8u7", 1, 8, (N896, N1024), False, "before_wait", False),
    FusedGemm("mma8_t2c4w8u7", 2, 8, (N128,), False, "after_x", True),
    FusedGemm("mma8_t2c4w8u7", 2, 4, (N256,), False, "before_wait", True, at_publisher=True),
    FusedGemm("mma8_t2c4w8u7", 5, 8, (N256,), False, "after_x", True),
    FusedGemm("mma8_t1c4w8u7", 2, 8, (N384,), False, "at_entry", False),
    FusedGemm("mma16_t1c4w8u7", 9, 16, (N128, N256), False, "after_x", False),
    FusedGemm("mma16_t1c4w8u7", 9, 16, (N384,), False, "before_wait", True, at_publisher=True),
    # Kimi-K3's 385..896 experts at M = 9..16 take the two launches: after the layer they
    # were 0.2-1.8 us faster behind every producer (H200 at e36c09f: AttnRes 16.50 -> 14.74,
    # rms_norm 12.46 -> 12.13 at M = 16; H100 at 6943400 likewise), the front winning over
    # the fused row's back-to-back lead (docs/benchmarks.md).
    FusedGemm("mma16_t2c4w8u7", 9, 16, (N1024,), False, "before_wait", False, at_publisher=True),
    # fp32 weights, bf16 tokens: the fp32 GEMM's kernels for K <= 4096 (MiniMax-M2). Alone on
    # an SM where the grid (2 experts a CTA, one token tile) fits in one wave.
    FusedGemm("f32w_m1_r2_u4_t256", 1, 1, (N128, N256), True, "before_wait", True),
    FusedGemm("f32w_m4_r2_u4_t256", 2, 4, (N128, N256), True, "before_wait", True),
    FusedGemm("f32w_m8_r2_u2_t256", 5, 8, (N128, N256), True, "before_wait", True),
    FusedGemm("f32w_m8_r2_u2_t256", 9, 16, (N128, N256), False, "before_wait", True),
    FusedGemm("f32w_m1_r2_u4_t256", 1, 1, (N384,), False, "before_wait", True),
    FusedGemm("f32w_m4_r2_u4_t256", 2, 4, (N384,), False, "before_wait", True),
    FusedGemm("f32w_m8_r2_u2_t256", 5, 16, (N384,), False, "before_wait", True),
)


def _router_rows(table):
    """Rows named router_<gemm>_n<n_max>, with _m<lo>_<hi> after the GEMM row where
    ROUTER_GEMMS splits one GEMM row and N range by M."""
    return tuple(
        RouterVariant(f"router_{row.gemm}{_m_range(row, n_max)}_n{n_max}", row.gemm, row.m_lo, row.m_hi,
                      n_min, n_max, exclusive=row.exclusive, trigger=row.trigger,
                      bias_prefetch=row.bias_prefetch, at_publisher=row.at_publisher)
        for row in table
        for n_min, n_max in row.n_ranges
    )


def _m_range(row, n_max):
    split = sum(1 for r in ROUTER_GEMMS for _, n in r.n_ranges if (r.gemm, n) == (row.gemm, n_max)) > 1
    return f"_m{row.m_lo}_{row.m_hi}" if split else ""


ROUTER_VARIANTS = _router_rows(ROUTER_GEMMS)


@dataclass(frozen=True)
class ProjectionKernel:
    """The gate and a second bf16 projection of the same tokens in one persistent grid
    (kernels/gate_projection.py, the `router_and_projection` op), for m_lo <= M <= m_hi (bf16
    tokens and weights, K <= 8 * threads * unroll); the routing follows as the routing op's
    kernel. `ctas_per_sm` CTAs an SM, tiles of `rows` rows, `unroll` 16-byte vectors a thread
    (all of K at once)."""

    name: str
    m_lo: int
    m_hi: int
    rows: int
    unroll: int = 4
    threads: int = 256
    ctas_per_sm: int = 2

    @property
    def max_k(self) -> int:
        return 8 * self.threads * self.unroll


# Each the fastest of the candidates measured on an H200 for Kimi-K3's front (N 896 + L 3584,
# K 7168; docs/benchmarks.md). Above M = 2 the CUDA-core products bound the stream (M = 4:
# 38 us against 25 at M = 1): the router op and the GEMM op serve M >= 3.
PROJECTION_KERNELS = (
    ProjectionKernel("proj_m1_r1", 1, 1, rows=1, ctas_per_sm=3),
    ProjectionKernel("proj_m2_r2", 2, 2, rows=2),
)


@dataclass(frozen=True)
class NormKernel:
    """A PDL-launched RMSNorm (kernels/rms_norm.py): `op` is rms_norm or fused_add_rms_norm;
    vec 8 (16-byte loads: K % 8 == 0, aligned rows) or 1 (any K, any alignment). One CTA of
    `threads` per row; a step loads `unroll` vectors per thread at once (8 x 128 x 8 = 8192
    elements: a 7168-wide row in one step). 512 threads of 2 vectors measured no faster
    behind a router and 0.3 us slower alone (docs/kernel-notes.md)."""

    op: str
    vec: int
    threads: int = 128
    unroll: int = 8


NORM_KERNELS = tuple(NormKernel(op, vec) for op in ("rms_norm", "fused_add_rms_norm") for vec in (8, 1))


@dataclass(frozen=True)
class AttnResKernel:
    """Kimi-K3's AttnRes producer (kernels/attn_res.py): one token over a cluster of
    `cluster` CTAs of `threads` threads, one 16-byte vector of the hidden size a thread (so
    H <= cluster * threads * 8), up to `max_blocks` block sources besides the prefix (a lane
    of the cross-CTA exchange holds one of the 2 * (max_blocks + 1) per-source sums)."""

    cluster: int = 8
    threads: int = 128
    max_blocks: int = 15

    @property
    def max_hidden(self) -> int:
        return self.cluster * self.threads * 8


ATTN_RES_KERNEL = AttnResKernel()


# The router's top_k ids are spread over the lanes of a warp, its group scores too.
ROUTER_MAX_TOP_K = 32
ROUTER_MAX_GROUPS = 32


class Scoring(IntEnum):
    """How logits become routing scores: the ops' `scoring` argument (the member's name in
    lower case) and the kernels' `scoring` value. Each is an elementwise function of the
    logit (its formula in kernels/handoff.py's score_bits and in csrc/moe_routing.cpp's
    reference) except SOFTMAX, over a token's N logits; a group's score is the sum of its two
    best choice values, with SOFTMAX its best one.
    - SIGMOID: 1 / (1 + e^-x) (DeepSeek-V3, Kimi, GLM)
    - SOFTMAX: e^x / sum e^x over the experts (DeepSeek-V2, Qwen-MoE, Mixtral, gpt-oss)
    - SQRTSOFTPLUS: sqrt(softplus(x)), softplus(x) = x above 20, else log(1 + e^x)
      (DeepSeek-V4)"""

    SIGMOID = 0
    SOFTMAX = 1
    SQRTSOFTPLUS = 2


# The routing arguments every routing kernel takes after its tensors, in order: one C struct
# (RoutingScalars) carries them to the fused router and the routing op's kernels. A hash-routed
# call (DeepSeek-V4's first layers: ids = hash_table[input_ids]) gives the int32 words an
# element of input_ids and of hash_table spans (1 for int32, 2 for int64); 0: not hashed.
# The outputs: `shared_experts` fused shared-expert slots after the top_k (ids N, N + 1, ...,
# weight `shared_weight`), topk_ids as int32 words (`id_words` 2: int64), and expert counts
# (`has_counts`: one atomic add a routed slot into the `counts` tensor).
ROUTING_SCALARS = (
    ("top_k", "int32"), ("n_group", "int32"), ("topk_group", "int32"), ("renormalize", "int32"),
    ("has_bias", "int32"), ("scoring", "int32"), ("scaling", "float32"),
    ("ids_words", "int32"), ("table_words", "int32"),
    ("shared_experts", "int32"), ("shared_weight", "float32"), ("id_words", "int32"), ("has_counts", "int32"),
)


@dataclass(frozen=True)
class RoutingKernel:
    """The routing op's kernel (kernels/moe_routing.py) for n_min <= N <= n_max experts (a
    lane's share compiled in, as in the fused router), one logits dtype and one bias dtype;
    ROUTING_WARPS tokens a CTA."""

    n_min: int
    n_max: int
    logits_dtype: str
    bias_dtype: str


OUT_DTYPES = ("float32", "bfloat16")
BIAS_DTYPES = ("float32", "bfloat16")  # e_score_correction_bias, fp32 or the model's bf16
ROUTING_WARPS = 4
ROUTING_KERNELS = tuple(
    RoutingKernel(lo, hi, logits, bias) for lo, hi in ROUTER_N_RANGES for logits in OUT_DTYPES for bias in BIAS_DTYPES
)

# (CuTe DSL target, compute capability major*10+minor it serves)
ARCHS = (("sm_90a", 90), ("sm_100a", 100))
MAX_M = max(c.m_hi for c in CHOICES if c.variant != "cublas")  # the largest M a kernel is chosen for


def variant(name: str) -> Variant:
    """The GEMM row called `name` (product or lab)."""
    return next(v for v in ALL_VARIANTS if v.name == name)
