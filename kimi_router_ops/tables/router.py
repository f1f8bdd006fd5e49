"""The fused routers (kernels/router_fused.py): ROUTER_GEMMS (which GEMM row is fused for
which M and N ranges, with its launch flags) and ROUTER_VARIANTS, the rows it makes."""

from dataclasses import dataclass
from typing import NamedTuple

from . import ROUTER_N_RANGES, check_trigger
from .gemm import variant

@dataclass(frozen=True)
class RouterRow:
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
        check_trigger(self)

    @property
    def weight_dtype(self) -> str:
        return variant(self.gemm).kernel.weight_dtype

    @property
    def k_only(self) -> int:
        """The one K its GEMM row computes (K compiled in); 0: any K."""
        return getattr(variant(self.gemm).kernel, "k", 0)


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
# at M = 1 above 128 experts and M = 2 from 129 to 256 at K != 7168, where another kernel
# made the whole router faster (docs/api.md says which). The flags are each row's measured best;
# docs/kernel-notes.md says what each buys. Columns: GEMM row, M range, N ranges, exclusive,
# trigger, bias prefetch, routing at the publisher.
ROUTER_GEMMS = (
    # M = 1 at K = 7168 (DeepSeek-V3, Kimi-K2), 129..384 experts: the 128-thread kernel of one
    # expert a CTA, K compiled in (other K: the r4 rows below). After the layer 0.3-0.7 us
    # faster than r4 behind every producer (H100 at 9121f2d, docs/benchmarks.md), and faster
    # than the GEMM op's own 256-thread kernel behind AttnRes and rms_norm back to back.
    FusedGemm("m1_prefetch_r1_t128_k7168", 1, 1, (N256, N384), False, "after_x", True),
    FusedGemm("m1_prefetch_r4_t256", 1, 1, (N128, N256), True, "before_wait", True),
    FusedGemm("m1_prefetch_r4_t256", 1, 1, (N384,), True, "after_x", True),
    # M = 2 likewise: the GEMM op's kernel there (other K: the r4 row below).
    FusedGemm("m2_prefetch_r1_t128_k7168", 2, 2, (N256, N384), False, "after_x", True),
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
        RouterRow(f"router_{row.gemm}{_m_range(row, n_max)}_n{n_max}", row.gemm, row.m_lo, row.m_hi,
                      n_min, n_max, exclusive=row.exclusive, trigger=row.trigger,
                      bias_prefetch=row.bias_prefetch, at_publisher=row.at_publisher)
        for row in table
        for n_min, n_max in row.n_ranges
    )


def _m_range(row, n_max):
    split = sum(1 for r in ROUTER_GEMMS for _, n in r.n_ranges if (r.gemm, n) == (row.gemm, n_max)) > 1
    return f"_m{row.m_lo}_{row.m_hi}" if split else ""


ROUTER_VARIANTS = _router_rows(ROUTER_GEMMS)
