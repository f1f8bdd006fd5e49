"""The kernel variant table: the one place that says which kernels exist.

The ahead-of-time build (aot.py) compiles every row for each vector width its kernel family
supports, each output dtype and each GPU architecture below, and writes the rows into a generated C++ header that the CUDA
dispatch (csrc/) includes; tests read the table from here. This module imports nothing
but the standard library, so setup.py can read it before anything is built.

Adding a variant is one row here, plus the benchmark number that justifies it
(docs/benchmarks.md).
"""

from dataclasses import dataclass
from typing import NamedTuple, Union

INT32_MAX = 2**31 - 1
# Where a kernel lets the next one launch (PDL's griddepcontrol.launch_dependents): once its
# first step's loads are issued ("after_x"), right after its weight prefetch, before its
# own grid-dependency wait ("before_wait"), or at kernel entry, before that prefetch
# ("at_entry"). Each is safe: the next kernel reads nothing of ours before its own wait
# returns, after our grid has finished. Results do not change; only what the next kernel's
# weight stream overlaps (docs/benchmarks.md, steps 32-33 and 56).
TRIGGERS = ("after_x", "before_wait", "at_entry")


def _check_trigger(row):
    if row.trigger not in TRIGGERS:
        raise ValueError(f"{row.name}: trigger must be one of {TRIGGERS}, got {row.trigger!r}")


@dataclass(frozen=True)
class Dotprod:
    """CUDA-core dot product (kernels/ll_bf16_dotprod.py): one CTA per `rows_per_cta`
    experts, all of K, `unroll` vectors per thread in flight."""

    rows_per_cta: int
    unroll: int
    threads: int = 128
    # Weight loads per thread before the PDL wait in a prefetch variant; 0: the whole
    # first step (rows_per_cta * unroll).
    prefetch_window: int = 0
    # Elements per load it is compiled for: 8 (16-byte vectors) where K, the row strides and
    # the pointers allow it, else 1 (scalar loads: any K, any alignment, same kernel).
    vecs = (8, 1)

    def prefetch_loads(self) -> int:
        """Global loads per thread before the PDL wait in a prefetch variant."""
        return self.prefetch_window or self.rows_per_cta * self.unroll


@dataclass(frozen=True)
class Mma:
    """Tensor cores (kernels/ll_bf16_mma.py): `tiles` 16-expert tiles and `tokens` tokens per
    CTA (more tokens take more CTAs), K split over the `cluster_k` CTAs of a cluster and the
    `warps` warps of each, `unroll` 32-element chunks per warp and step."""

    tiles: int
    cluster_k: int
    warps: int
    unroll: int
    tokens: int
    pass_tokens: int = 0  # tokens loaded at once, in passes over the same weights (0: all)
    vecs = (8,)  # 16-byte loads only: K % 8 == 0 and 16-byte aligned rows

    def prefetch_loads(self) -> int:
        return 2 * self.tiles * self.unroll


@dataclass(frozen=True)
class Variant:
    name: str
    m_lo: int  # the dispatch picks this row for m_lo <= M <= m_hi and n_min <= N <= n_max ...
    m_hi: int  # ... (first match wins); a dot product's m_hi is also its token bucket
    n_min: int
    n_max: int
    kernel: Union[Dotprod, Mma]
    prefetch: bool  # load the first weight step before the PDL grid-dependency wait
    pdl: bool  # launched with programmatic dependent launch
    automatic: bool  # False: run only when asked for by name (benchmarks, tests)
    trigger: str = "after_x"  # one of TRIGGERS

    def __post_init__(self):
        _check_trigger(self)

    @property
    def max_m(self) -> int:
        """The largest M the kernel computes: a dot product's bucket; the tensor-core kernels
        take any M (grid z: 65535 CTAs of `tokens`)."""
        return 65535 * self.kernel.tokens if isinstance(self.kernel, Mma) else self.m_hi


def _mma(name, m_lo, m_hi, n_min, n_max, tiles, cluster_k, warps, unroll, prefetch=True, automatic=False,
         trigger="after_x", tokens=None, pass_tokens=0):
    """A tensor-core row; `tokens` (tokens per CTA) defaults to m_hi."""
    return Variant(name, m_lo, m_hi, n_min, n_max,
                   Mma(tiles, cluster_k, warps, unroll, tokens or m_hi, pass_tokens),
                   prefetch=prefetch, pdl=True, automatic=automatic, trigger=trigger)


def _dotprod(name, m_lo, m_hi, rows, unroll, threads=128, prefetch=True, pdl=True, automatic=False, window=0,
             trigger="after_x"):
    return Variant(name, m_lo, m_hi, 1, INT32_MAX, Dotprod(rows, unroll, threads, window),
                   prefetch=prefetch, pdl=pdl, automatic=automatic, trigger=trigger)


# The automatic rows, first match wins; each was the fastest compiled kernel for its M and N
# on an H200 (docs/benchmarks.md, "Choosing the table"). Every kernel issues all the weight
# loads of its share of K at once, and the prefetching ones do it before the PDL wait.
# The other rows run only when named: the previous choices and the no-prefetch/no-PDL twins,
# kept so the benchmarks can show what each choice is worth.
VARIANTS = (
    # M = 1: CUDA cores, 4 experts per CTA, 256 threads, 4 vectors per thread and expert.
    _dotprod("m1_prefetch_r4_t256", 1, 1, rows=4, unroll=4, threads=256, automatic=True),
    # M = 2..16: tensor cores, 32 experts per CTA, K split over the CTAs of a cluster and
    # their warps so that each warp owns 7 chunks of 32 (K = 7168) and loads them at once.
    _mma("mma8_t2c4w8u7", 2, 8, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=7, automatic=True),
    # M = 9..16: the same with 16 tokens a tile. (mma16_t2c8w4u7, half the warps and twice
    # the CTAs of a cluster, was chosen before for N outside 320..511; this one measured
    # 0.0-0.26 us faster there at d0c137e, and its 8 warps route twice as many tokens at
    # once in the fused router.) For more than 384 experts it lets the next kernel launch
    # before its PDL wait: 0.23-0.37 us faster for Kimi-K3 at M = 9..16, twice; Kimi-K2's
    # N measured 0.23-0.29 slower, DeepSeek-V3's the same (docs/benchmarks.md, step 33).
    _mma("mma16_t2c4w8u7_before_wait", 9, 16, 385, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=7,
         automatic=True, trigger="before_wait"),
    _mma("mma16_t2c4w8u7", 9, 16, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=7, automatic=True),
    # M = 2..4 when 16-byte loads are impossible (odd K, misaligned rows): the dot product
    # with scalar loads. Larger such M go to cuBLAS.
    _dotprod("m2", 2, 2, rows=2, unroll=4, prefetch=False, automatic=True),
    _dotprod("m4", 3, 4, rows=2, unroll=4, prefetch=False, automatic=True),
    # Named only.
    _dotprod("m1_r4_t256", 1, 1, rows=4, unroll=4, threads=256, prefetch=False),
    _dotprod("m1_r4_t256_nopdl", 1, 1, rows=4, unroll=4, threads=256, prefetch=False, pdl=False),
    _dotprod("m1_prefetch_r2", 1, 1, rows=2, unroll=8),
    _dotprod("m1_prefetch", 1, 1, rows=1, unroll=8),
    _dotprod("m1_prefetch_r2_t512", 1, 1, rows=2, unroll=2, threads=512),
    # The chosen M = 1 kernel with a smaller prefetch window (of its 16 loads per thread,
    # only the first 1, 2, 4 or 8 go before the PDL wait): behind a producer, fewer early
    # requests may crowd it less (bench_chain sweeps them).
    *(_dotprod(f"m1_prefetch_r4_t256_w{w}", 1, 1, rows=4, unroll=4, threads=256, window=w) for w in (1, 2, 4, 8)),
    # The M = 1 kernel's shape with two tokens: the fused router's GEMM at M = 2 up to 256
    # experts (ROUTER_GEMMS).
    _dotprod("m2_prefetch_r4_t256", 2, 2, rows=4, unroll=4, threads=256),
    _dotprod("m8", 5, 8, rows=4, unroll=2, prefetch=False),
    _dotprod("m16", 9, 16, rows=4, unroll=1, prefetch=False),
    _mma("mma8_t2c4w8u7_noprefetch", 1, 8, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=7, prefetch=False),
    _mma("mma8_t2c4w8u8", 1, 8, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=8),
    _mma("mma8_t1c8w8u4", 1, 8, 1, INT32_MAX, tiles=1, cluster_k=8, warps=8, unroll=4),
    _mma("mma16_t1c8w8u4", 1, 16, 1, INT32_MAX, tiles=1, cluster_k=8, warps=8, unroll=4),
    _mma("mma16_t2c8w4u7", 9, 16, 1, INT32_MAX, tiles=2, cluster_k=8, warps=4, unroll=7),
    # The M = 1..8 choices letting the next kernel launch before their PDL wait: the GEMM
    # alone measured no faster (M = 1: 0.2-0.4 us slower; step 33).
    _dotprod("m1_prefetch_r4_t256_before_wait", 1, 1, rows=4, unroll=4, threads=256, trigger="before_wait"),
    _mma("mma8_t2c4w8u7_before_wait", 2, 8, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=7,
         trigger="before_wait"),
    # One 16-expert tile a CTA: twice the CTAs of the chosen rows (64 for DeepSeek-V3's N,
    # 96 for Kimi-K2's), each streaming half the weights. Alone slower back to back
    # (DeepSeek-V3 0.03-0.24 us, Kimi-K2 0.3-0.7: the next call's CTAs find fewer free SMs),
    # 0.45-0.55 faster serialized; the fused router's GEMM for Kimi-K2-sized N at M = 2..16
    # and DeepSeek-V3-sized at M = 9..16 (ROUTER_GEMMS).
    _mma("mma8_t1c4w8u7", 1, 8, 1, INT32_MAX, tiles=1, cluster_k=4, warps=8, unroll=7),
    _mma("mma16_t1c4w8u7", 1, 16, 1, INT32_MAX, tiles=1, cluster_k=4, warps=8, unroll=7),
    # Candidates for M = 17..256: 32 or 64 tokens a CTA, fewer chunks a step to stay within
    # the registers.
    _mma("mma32_t2c4w8u4", 17, 32, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=4, tokens=32,
         automatic=True),
    _mma("mma32_t1c4w8u7", 17, 256, 1, INT32_MAX, tiles=1, cluster_k=4, warps=8, unroll=7, tokens=32),
    _mma("mma32_t4c4w8u2", 17, 256, 1, INT32_MAX, tiles=4, cluster_k=4, warps=8, unroll=2, tokens=32),
    _mma("mma32_t1c8w8u4", 17, 256, 1, INT32_MAX, tiles=1, cluster_k=8, warps=8, unroll=4, tokens=32),
    _mma("mma64_t2c4w8u2", 33, 256, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=2, tokens=64,
         automatic=True),
    _mma("mma64_t1c4w8u4", 17, 256, 1, INT32_MAX, tiles=1, cluster_k=4, warps=8, unroll=4, tokens=64),
    _mma("mma64_t1c8w8u2", 17, 256, 1, INT32_MAX, tiles=1, cluster_k=8, warps=8, unroll=2, tokens=64),
    # 32 or 64 tokens a CTA in passes of 16 or 8 over the weights in its registers.
    _mma("mma32p16_t2c4w8u7_before_wait", 17, 256, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=7,
         tokens=32, pass_tokens=16, trigger="before_wait"),
    _mma("mma32p8_t2c4w8u7_before_wait", 17, 256, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=7,
         tokens=32, pass_tokens=8, trigger="before_wait"),
    _mma("mma64p16_t2c4w8u4_before_wait", 17, 256, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=4,
         tokens=64, pass_tokens=16, trigger="before_wait"),
    _mma("mma32_t2c4w8u4_before_wait", 17, 256, 1, INT32_MAX, tiles=2, cluster_k=4, warps=8, unroll=4,
         tokens=32, trigger="before_wait"),
)



@dataclass(frozen=True)
class RouterVariant:
    """The fused router (kernels/ll_bf16_router.py): the GEMM row `gemm`, then routing in
    the same grid. Chosen for m_lo <= M <= m_hi and n_min <= N <= n_max (first match);
    n_max also sets the experts a lane holds (n_max / 32, compiled in)."""

    name: str
    gemm: str  # a row of VARIANTS
    m_lo: int
    m_hi: int
    n_min: int
    n_max: int
    automatic: bool = True  # False: run only when asked for by name
    # Alone on its SM: enough shared memory that no other CTA, of this kernel or of the next
    # one launched early by PDL, shares an SM with a routing CTA (whose polls would queue
    # behind that CTA's weight loads). Free where the grid fits in one CTA per SM.
    exclusive: bool = False
    trigger: str = "after_x"  # one of TRIGGERS
    # The routing warps ask L2 for the bias at kernel entry, before the PDL wait (one
    # cp.async.bulk.prefetch.L2: it reads nothing into registers, so it is safe whatever
    # the previous kernel writes). A model's per-layer bias is cold in L2 by the time the
    # routing reads it (docs/benchmarks.md, step 34).
    bias_prefetch: bool = False
    # Tensor-core rows: each token routed by a warp of the last cluster's CTA that publishes
    # it, not by the m-th CTA from the end (kernels/ll_bf16_router.py, _routing_unit).
    at_publisher: bool = False

    def __post_init__(self):
        _check_trigger(self)


# A lane's share of the experts is a chain of instructions in one warp, so each N range gets
# its own kernels: 8 experts a lane for DeepSeek-V3, 12 for Kimi-K2, 28 for Kimi-K3, 32 up
# to 1024 experts (docs/benchmarks.md, "The whole router").
ROUTER_N_RANGES = ((1, 256), (257, 384), (385, 896), (897, 1024))


class RouterGemm(NamedTuple):
    """One entry of ROUTER_GEMMS: a GEMM row fused for an M range and some N ranges."""

    gemm: str  # a row of VARIANTS
    m_lo: int
    m_hi: int
    n_ranges: tuple  # of ROUTER_N_RANGES
    exclusive: bool
    trigger: str
    bias_prefetch: bool
    at_publisher: bool = False


# Each entry fuses the GEMM kernel that the GEMM op picks for the same M and N, or one
# that computes the same logits bit for bit: the tensor-core kernels with one 16-expert tile
# a CTA instead of two (t1c4 against t2c4) split K the same way and give each expert the
# same row of its MMA tile, so every sum is the same. With twice the CTAs (64 and 96), they
# made the whole router 0.09-0.25 us faster for Kimi-K2-sized N at M = 2..16 and
# DeepSeek-V3-sized N at M = 9..16, in three runs on two machines, though alone they are
# slower back to back; for DeepSeek-V3-sized N at M = 2..8 they were 0.1-0.35 slower
# (docs/benchmarks.md, step 38).
# In two places the logits are the fused kernel's, bit for bit, not the GEMM op's: at M = 1
# for more than 384 experts the tensor-core kernel of M = 2..8 made the whole router 1.5 us
# faster than the dot product (Kimi-K3: 5.83 against 7.36 us), though the dot product is the
# faster GEMM alone; at M = 2 up to 256 experts the M = 1 dot product's shape with two
# tokens, alone on its SMs like the M = 1 rows, made it 0.15 us faster than the tensor-core
# kernel, twice (DeepSeek-V3 3.35 against 3.50, 3.38 against 3.54). For Kimi-K2's N it
# measured 0.12 us faster on one machine and 0.68 slower on another; with four tokens 1.1-2.1
# us slower (docs/benchmarks.md, step 37).
# The dot product's grids (64 and 96 CTAs) fit one CTA per SM, and alone its routing CTA
# ran Kimi-K2 at M = 1 in 2.91 us instead of 3.69 (docs/benchmarks.md, step 25); the
# tensor-core kernels hold a whole SM each anyway.
# The trigger point is "before_wait" where that measured faster for the whole router,
# twice: DeepSeek-V3 at M = 1 (-0.2 us), Kimi-K2 at M = 2..8 (-0.1 to -0.2; on the one-tile
# kernel -0.05 to -0.15, step 38), and, with the bias prefetch, Kimi-K3 at M = 9..16 (-0.22
# and -0.24, step 35; the GEMM op's own point there); since step 45 also Kimi-K3 at M = 1..8
# (-0.03 to -0.08, serialized faster too), Kimi-K2 at M = 9..16 (-0.17) and, with the routing
# at the publisher, DeepSeek-V3 at M = 3..4 (-0.05 to -0.12); elsewhere it measured slower
# (steps 32-33 and 45). Kimi-K2 at M = 2..8 lets the next kernel launch earlier still, at
# kernel entry ("at_entry"): -0.05 to -0.12 against "before_wait" in two runs (step 56);
# on every other row that was slower (Kimi-K2 at M = 16 +0.15, the others +0.03 to +0.28).
# The routing warps are the publishers' (at_publisher: token m routed in the last cluster's
# CTA that finishes it) where that measured faster, twice (step 45): Kimi-K3 at M = 9..16
# (-0.12 to -0.14), DeepSeek-V3 at M = 3..4 with the earlier trigger (see above) and
# Kimi-K2 at M = 9..16 with it (the same back to back, serialized faster). Routed by the
# last CTAs, a CTA with no token of its own to publish polls before its cluster has
# published (step 45); on the one-tile kernels a warp finishes two tokens, so the other
# routing warps wait for it at a CTA barrier, and alone there it measured slower.
# The bias prefetch is on where it measured faster with a cold bias in every run (step 34):
# the dot products at M = 1 (DeepSeek-V3 -0.25 us, Kimi-K2 -0.22, serialized faster too),
# and since step 40 Kimi-K2-sized N at M = 9..16 (-0.10 to -0.18 in six runs) and
# DeepSeek-V3-sized N at M = 5..8 (-0.06 to -0.07 at M = 8 in six runs; step 42); since
# step 50 also at M = 3..4, with the routing at the publisher and the earlier trigger
# (M = 4: 3.45-3.50 us in six runs, against 3.48-3.67 without it; 0.01 slower once, never
# more). The other tensor-core rows were 0.05-0.18 us slower with it serialized, and back
# to back from 0.06 faster to 0.18 slower. Kimi-K3-sized N at M = 9..16 had it from step
# 35 (-0.08 to -0.20 then); since the routing moved to the publisher (step 45) it measured
# 0.05-0.09 us slower in four runs of seven and 0.02-0.07 faster in three: within the
# noise of that cell. Since step 53 that row does without.
# Neither choice changes the results. (What it changes is when the routing warp's polls
# reach L2, step 41: the bias loads just before them time them.)
ROUTER_GEMMS = (
    RouterGemm("m1_prefetch_r4_t256", 1, 1, ROUTER_N_RANGES[:1], True, "before_wait", True),
    RouterGemm("m1_prefetch_r4_t256", 1, 1, ROUTER_N_RANGES[1:2], True, "after_x", True),
    RouterGemm("m2_prefetch_r4_t256", 2, 2, ROUTER_N_RANGES[:1], True, "before_wait", True),
    RouterGemm("mma8_t2c4w8u7", 1, 8, ROUTER_N_RANGES[2:], False, "before_wait", False),
    RouterGemm("mma8_t2c4w8u7", 2, 4, ROUTER_N_RANGES[:1], False, "before_wait", True, at_publisher=True),
    RouterGemm("mma8_t2c4w8u7", 5, 8, ROUTER_N_RANGES[:1], False, "after_x", True),
    RouterGemm("mma8_t1c4w8u7", 2, 8, ROUTER_N_RANGES[1:2], False, "at_entry", False),
    RouterGemm("mma16_t1c4w8u7", 9, 16, ROUTER_N_RANGES[:1], False, "after_x", False),
    RouterGemm("mma16_t1c4w8u7", 9, 16, ROUTER_N_RANGES[1:2], False, "before_wait", True, at_publisher=True),
    RouterGemm("mma16_t2c4w8u7", 9, 16, ROUTER_N_RANGES[2:], False, "before_wait", False, at_publisher=True),
)
# Named only: candidates while they are measured, and twins of table rows whose choice is
# still within the noise of its cell. Every other twin and alternative (the GEMM op's
# trigger point, the other bias choice, routing at the last CTAs, the two-tile kernels on
# the one-tile rows) measured slower in three or more runs and is gone from the build
# (docs/benchmarks.md, steps 33-57 for the numbers, "Named rows" for the list): each router
# kernel costs about 4 s a bias dtype and arch to compile, most of the build.
ROUTER_ALTERNATIVES = ()


def _table_row(gemm, m_lo):
    return next(row for row in ROUTER_GEMMS if (row.gemm, row.m_lo) == (gemm, m_lo))


# Kimi-K2-sized N at M = 2..8 at the previous trigger point ("before_wait"): 0.05-0.12 us
# slower in two runs, 0.03-0.05 faster in three (steps 56-57, the runs of bfc9b5d and
# eb9f4c5). Kimi-K3-sized N at M = 9..16 with the bias prefetch: from 0.09 us slower to 0.10
# faster in nine runs, the same on average (step 53, the same two runs).
ROUTER_TWINS = (
    (_table_row("mma8_t1c4w8u7", 2)._replace(trigger="before_wait"), "_before_wait"),
    (_table_row("mma16_t2c4w8u7", 9)._replace(n_ranges=ROUTER_N_RANGES[2:3], bias_prefetch=True), "_bias_prefetch"),
)


def _router_rows(table, automatic, suffix=""):
    """Rows named router_<gemm>_n<n_max><suffix>, with _m<lo>_<hi> after the GEMM row where
    ROUTER_GEMMS splits one GEMM row and N range by M."""
    return tuple(
        RouterVariant(f"router_{row.gemm}{_m_range(row, n_max)}_n{n_max}{suffix}", row.gemm, row.m_lo, row.m_hi,
                      n_min, n_max,
                      automatic=automatic, exclusive=row.exclusive, trigger=row.trigger,
                      bias_prefetch=row.bias_prefetch, at_publisher=row.at_publisher)
        for row in table
        for n_min, n_max in row.n_ranges
    )


def _m_range(row, n_max):
    split = sum(1 for r in ROUTER_GEMMS for _, n in r.n_ranges if (r.gemm, n) == (row.gemm, n_max)) > 1
    return f"_m{row.m_lo}_{row.m_hi}" if split else ""


ROUTER_VARIANTS = (
    _router_rows(ROUTER_GEMMS, True)
    + sum((_router_rows([row], False, suffix) for row, suffix in ROUTER_TWINS), ())
    + _router_rows(ROUTER_ALTERNATIVES, False)
)


@dataclass(frozen=True)
class NormKernel:
    """A PDL-launched RMSNorm (kernels/rms_norm.py): `op` is rms_norm or fused_add_rms_norm;
    vec 8 (16-byte loads: K % 8 == 0, aligned rows) or 1 (any K, any alignment). One CTA of
    `threads` per row; a step loads `unroll` vectors per thread at once (8 x 128 x 8 = 8192
    elements: a 7168-wide row in one step). 512 threads of 2 vectors measured no faster
    behind a router and 0.3 us slower alone (docs/benchmarks.md, step 18)."""

    op: str
    vec: int
    threads: int = 128
    unroll: int = 8


NORM_KERNELS = tuple(NormKernel(op, vec) for op in ("rms_norm", "fused_add_rms_norm") for vec in (8, 1))


# The router's top_k ids are spread over the lanes of a warp, its group scores too.
ROUTER_MAX_TOP_K = 32
ROUTER_MAX_GROUPS = 32

OUT_DTYPES = ("float32", "bfloat16")
BIAS_DTYPES = ("float32", "bfloat16")  # e_score_correction_bias, fp32 or the model's bf16
# (CuTe DSL target, compute capability major*10+minor it serves)
ARCHS = (("sm_90a", 90), ("sm_100a", 100))
MAX_M = max(v.m_hi for v in VARIANTS)  # the largest M the dispatch gives a kernel


def kernel_symbol(variant: Variant, vec: int, out_dtype: str, arch: str) -> str:
    """C symbol prefix of one compiled kernel, e.g. kimi_m1_prefetch_v8_f32_sm_90a."""
    short = {"float32": "f32", "bfloat16": "bf16"}[out_dtype]
    return f"kimi_{variant.name}_v{vec}_{short}_{arch}"


def variant(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def router_kernel_symbol(router: RouterVariant, bias_dtype: str, arch: str) -> str:
    """e.g. kimi_router_m1_prefetch_r4_t256_f32_sm_90a (f32: the bias dtype)."""
    short = {"float32": "f32", "bfloat16": "bf16"}[bias_dtype]
    return f"kimi_{router.name}_{short}_{arch}"


def compiled_router_kernels():
    """Every (router variant, bias dtype, arch, sm) the build compiles, in table order."""
    return [(r, dt, arch, sm) for arch, sm in ARCHS for r in ROUTER_VARIANTS for dt in BIAS_DTYPES]


@dataclass(frozen=True)
class RoutingKernel:
    """The routing op's kernel (kernels/moe_routing.py) for n_min <= N <= n_max experts (a
    lane's share compiled in, as in the fused router), one logits dtype and one bias dtype;
    ROUTING_WARPS tokens a CTA."""

    n_min: int
    n_max: int
    logits_dtype: str
    bias_dtype: str


ROUTING_WARPS = 4
ROUTING_KERNELS = tuple(
    RoutingKernel(lo, hi, logits, bias) for lo, hi in ROUTER_N_RANGES for logits in OUT_DTYPES for bias in BIAS_DTYPES
)


def routing_kernel_symbol(kernel: RoutingKernel, arch: str) -> str:
    """e.g. kimi_moe_routing_n256_f32_bf16_sm_90a (logits dtype, then bias dtype)."""
    short = {"float32": "f32", "bfloat16": "bf16"}
    return f"kimi_moe_routing_n{kernel.n_max}_{short[kernel.logits_dtype]}_{short[kernel.bias_dtype]}_{arch}"


def compiled_routing_kernels():
    """Every (routing kernel, arch, sm) the build compiles."""
    return [(k, arch, sm) for arch, sm in ARCHS for k in ROUTING_KERNELS]


def norm_kernel_symbol(norm: NormKernel, arch: str) -> str:
    """e.g. kimi_fused_add_rms_norm_v8_sm_90a."""
    return f"kimi_{norm.op}_v{norm.vec}_{arch}"


def compiled_norm_kernels():
    """Every (norm kernel, arch, sm) the build compiles."""
    return [(k, arch, sm) for arch, sm in ARCHS for k in NORM_KERNELS]


def compiled_kernels():
    """Every (variant, vec, out_dtype, arch) the build compiles, in table order."""
    return [
        (v, vec, dt, arch, sm)
        for arch, sm in ARCHS
        for v in VARIANTS
        for vec in v.kernel.vecs
        for dt in OUT_DTYPES
    ]


def write_variant_table_header(path: str) -> None:
    """The rows above as a C++ array (csrc/ includes it; selection order = row order)."""
    rows = "\n".join(
        f'    {{"{v.name}", {v.m_lo}, {v.m_hi}, {v.max_m}, {v.n_min}, {v.n_max}, '
        f"{str(1 in v.kernel.vecs).lower()}, {str(v.prefetch).lower()}, "
        f"{str(v.pdl).lower()}, {str(v.automatic).lower()}}},"
        for v in VARIANTS
    )
    router_rows = "\n".join(
        f'    {{"{r.name}", {r.m_lo}, {r.m_hi}, {r.n_min}, {r.n_max}, {str(r.automatic).lower()}}},'
        for r in ROUTER_VARIANTS
    )
    text = (
        "// Generated from kimi_router_ops/variants.py by setup.py. Do not edit.\n"
        "#pragma once\n"
        '#include "variant_row.h"\n\n'
        "namespace kimi {\n"
        "// inline: one array for the whole program, so row pointers compare across files.\n"
        "inline constexpr VariantRow kVariantRows[] = {\n"
        f"{rows}\n"
        "};\n\n"
        "inline constexpr RouterRow kRouterRows[] = {\n"
        f"{router_rows}\n"
        "};\n"
        f"inline constexpr int kRouterMaxTopK = {ROUTER_MAX_TOP_K};\n"
        f"inline constexpr int kRouterMaxM = {max(r.m_hi for r in ROUTER_VARIANTS)};\n"
        f"inline constexpr int kRouterMaxN = {max(r.n_max for r in ROUTER_VARIANTS)};\n"
        f"inline constexpr int kRouterMaxGroups = {ROUTER_MAX_GROUPS};\n"
        "}  // namespace kimi\n"
    )
    _write_if_changed(path, text)


def _write_if_changed(path: str, text: str) -> None:
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)
