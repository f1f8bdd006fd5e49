"""The gate and a projection in one grid (kernels/gate_projection.py)."""

from dataclasses import dataclass


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

