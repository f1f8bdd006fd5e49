"""What the kernel families share: the router GEMMs' entry points and the strided walk over
a row of the kernels that give a row to one CTA."""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..tables import TRIGGERS


def strided_columns(s, tidx, kv_count, threads: int, unroll: int):
    """A thread's vector columns in step s of a row that `threads` threads walk `unroll`
    vectors at a time, and the same clamped into [0, kv_count): a clamped vector is loaded
    (in bounds), then never used or stored."""
    kv = [s * (threads * unroll) + u * threads + tidx for u in range(unroll)]
    return kv, [cutlass.min(k, kv_count - 1) for k in kv]


@cute.jit
def load_vector(src: cute.Tensor, dst: cute.Tensor, vec: cutlass.Constexpr = 8):
    """One vector of `vec` elements of a row into registers, in one load (the views' rows are
    aligned to a vector)."""
    aligned = cute.make_tensor(src.iterator.align(vec * src.element_type.width // 8), src.layout)
    cute.autovec_copy(aligned, dst)


@cute.jit
def accumulate_products(acc, x_regs, xu: cutlass.Constexpr, w_regs, u: cutlass.Constexpr,
                        max_m: cutlass.Constexpr, rows: cutlass.Constexpr, vec: cutlass.Constexpr):
    """acc[m, r] += x_regs[:, xu, m] . w_regs[:, u, r] in fp32 for every token m and weight
    row r: one vector column of the dot products, element after element."""
    for m in cutlass.range_constexpr(max_m):
        xf = x_regs[None, xu, m].load().to(Float32)
        for r in cutlass.range_constexpr(rows):
            wf = w_regs[None, u, r].load().to(Float32)
            a = acc[m, r]
            for e in cutlass.range_constexpr(vec):
                a = a + xf[e] * wf[e]
            acc[m, r] = a


@cute.jit
def share_warp_sums(acc, partials, lane, warp, max_m: cutlass.Constexpr, rows: cutlass.Constexpr):
    """Each warp's sum over its lanes of acc[m, r] into partials[m * rows + r, warp], then a
    barrier: every warp's sums are there for any thread to read."""
    for m in cutlass.range_constexpr(max_m):
        for r in cutlass.range_constexpr(rows):
            total = cute.arch.warp_reduction_sum(acc[m, r])
            if lane == 0:
                partials[m * rows + r, warp] = total
    cute.arch.sync_threads()


@cute.jit
def sum_of_warps(partials, row, num_warps: cutlass.Constexpr):
    """partials[row, 0] + partials[row, 1] + ..., in warp order (bitwise repeatable)."""
    total = Float32(0.0)
    for wi in cutlass.range_constexpr(num_warps):
        total = total + partials[row, wi]
    return total


class GemmKernel:
    """A router GEMM kernel (the dot product, the tensor cores): out = x w^T (+ gate bias).
    A subclass gives vector_views, launch_shape and body(xv, wv, gate_bias, out,
    has_gate_bias, handoff=None, scoring=None, expert_block=None): the whole GEMM, which the
    fused router runs too, passing a handoff buffer (kernels/handoff.py) to publish every
    logit in as well and the routing's scoring (not sigmoid: it publishes logits, not sigmoid
    scores), and the gate-and-projection kernel, passing the block index along
    `expert_axis` (of `experts_per_cta()` experts) that the body takes for its own."""

    def _meet_the_kernel_before(self, prefetch: bool, pdl: bool, trigger: str):
        """Weights loaded before the PDL wait (prefetch), a PDL launch, and where the next
        kernel may launch (one of tables.TRIGGERS)."""
        if prefetch and not pdl:
            raise ValueError("prefetch only makes sense before a PDL grid-dependency wait")
        if trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {trigger!r}")
        self.prefetch, self.pdl, self.trigger = prefetch, pdl, trigger

    def _signal_dependents_at(self, point: str):
        """Let the next kernel launch here if `point` is this kernel's trigger point (of a
        PDL launch): it cannot read our output before its own wait returns, which is only
        once this grid has finished and flushed."""
        if const_expr(self.pdl and self.trigger == point):
            cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # [M, K], unit stride along K
        w: cute.Tensor,  # [N, K], unit stride along K
        gate_bias: cute.Tensor,  # [1, N] w's dtype; read only if has_gate_bias
        out: cute.Tensor,  # [M, N] float32 or bfloat16
        has_gate_bias: Int32,
        stream: cuda.CUstream,
    ):
        xv, wv = self.vector_views(x, w)
        self.kernel(xv, wv, gate_bias, out, has_gate_bias).launch(
            **self.launch_shape(w.shape[0], x.shape[0]), stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, xv: cute.Tensor, wv: cute.Tensor, gate_bias: cute.Tensor, out: cute.Tensor,
               has_gate_bias: Int32):
        self.body(xv, wv, gate_bias, out, has_gate_bias)
