"""RMSNorm (and residual add + RMSNorm), the producer in front of a router, in CuTe DSL.

    s      = bf16(x + residual)              (add_residual; else s = x)
    r      = 1 / sqrt(sum_k s[k]^2 / K + eps)   fp32, IEEE sqrt and divide
    out[k] = bf16((s[k] * r) * weight[k])       fp32 math, one rounding

One CTA per row. Its threads split K into `vec`-element vectors (16-byte loads when vec ==
8); a step covers threads * unroll vectors and issues all of its loads before the first
use, so a row of 7168 is one step and one memory round trip (128 threads of 8 vectors).
The second pass reuses the registers (longer rows read each step again, from L1) and the
weight step loaded before the wait.

Launched with programmatic dependent launch. It lets its dependents launch at entry:
their own grid-dependency wait returns only once this grid has finished and flushed, so the
signal is always safe, and the earlier it comes the longer a router kernel behind it can
stream its weights. It waits before reading x and residual (an earlier kernel writes
them); the norm weight is a parameter, so its first step is loaded before the wait.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .common import strided_columns


class RmsNorm:
    """One compiled norm kernel; the rows of tables.norm.NORM_KERNELS give its parameters."""

    def __init__(self, vec: int, add_residual: bool, threads: int, unroll: int):
        if vec not in (1, 8):
            raise ValueError(f"vec must be 1 or 8, got {vec}")
        self.vec = vec
        self.add_residual = add_residual
        self.threads = threads
        self.unroll = unroll
        self.num_warps = threads // cute.arch.WARP_SIZE

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # [M, K] bf16
        residual: cute.Tensor,  # [M, K] bf16; read only if add_residual
        weight: cute.Tensor,  # [1, K] bf16
        out: cute.Tensor,  # [M, K] bf16
        residual_out: cute.Tensor,  # [M, K] bf16, s; written only if add_residual
        eps: Float32,
        stream: cuda.CUstream,
    ):
        views = [cute.logical_divide(t, (None, self.vec)) for t in (x, residual, weight, out, residual_out)]
        self.kernel(*views, eps).launch(
            grid=[x.shape[0], 1, 1], block=[self.threads, 1, 1], smem=self.num_warps * 4,
            stream=stream, use_pdl=True,
        )

    @cute.jit
    def _copy(self, src: cute.Tensor, dst: cute.Tensor):
        """One vector between global memory and registers (16 bytes when vec == 8)."""
        if const_expr(src.memspace == cute.AddressSpace.gmem):
            src = cute.make_tensor(src.iterator.align(self.vec * 2), src.layout)
        else:
            dst = cute.make_tensor(dst.iterator.align(self.vec * 2), dst.layout)
        cute.autovec_copy(src, dst)

    @cute.jit
    def _load_row(self, xv, rv, row, columns, x_regs, r_regs):
        for u in cutlass.range_constexpr(self.unroll):
            self._copy(xv[row, (None, columns[u])], x_regs[None, u])
            if const_expr(self.add_residual):
                self._copy(rv[row, (None, columns[u])], r_regs[None, u])

    @cute.jit
    def _summed(self, x_regs, r_regs, u):
        """s for vector u of the step, as fp32 (x, or bf16(x + residual))."""
        s = x_regs[None, u].load().to(Float32)
        if const_expr(self.add_residual):
            s = (s + r_regs[None, u].load().to(Float32)).to(cutlass.BFloat16).to(Float32)
        return s

    def _step_columns(self, s, tidx, kv_count):
        return strided_columns(s, tidx, kv_count, self.threads, self.unroll)

    @cute.kernel
    def kernel(self, xv, rv, wv, ov, rov, eps: Float32):
        vec, unroll, threads = self.vec, self.unroll, self.threads  # compile-time values
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        kv_count = cute.size(xv.shape[1][1])  # vec-wide columns; K = vec * kv_count
        n_steps = (kv_count + threads * unroll - 1) // (threads * unroll)

        x_regs = cute.make_rmem_tensor((vec, unroll), cutlass.BFloat16)
        r_regs = cute.make_rmem_tensor((vec, unroll), cutlass.BFloat16)
        w_regs = cute.make_rmem_tensor((vec, unroll), cutlass.BFloat16)
        o_regs = cute.make_rmem_tensor((vec, unroll), cutlass.BFloat16)

        cute.arch.griddepcontrol_launch_dependents()
        _, first_columns = self._step_columns(Int32(0), tidx, kv_count)
        for u in cutlass.range_constexpr(unroll):
            self._copy(wv[0, (None, first_columns[u])], w_regs[None, u])
        # x and residual come from the kernels before us.
        cute.arch.griddepcontrol_wait()

        sum_sq = Float32(0.0)
        for s in cutlass.range(n_steps, unroll=1):
            kv, columns = self._step_columns(s, tidx, kv_count)
            self._load_row(xv, rv, row, columns, x_regs, r_regs)
            for u in cutlass.range_constexpr(unroll):
                if kv[u] < kv_count:
                    v = self._summed(x_regs, r_regs, u)
                    for e in cutlass.range_constexpr(vec):
                        sum_sq = sum_sq + v[e] * v[e]
                    if const_expr(self.add_residual):
                        o_regs[None, u].store(v.to(cutlass.BFloat16))
                        self._copy(o_regs[None, u], rov[row, (None, kv[u])])

        # Block sum: warp shuffles, one partial per warp, then every thread adds the
        # partials in the same order, so r is the same in every thread and every run.
        smem = cutlass.utils.SmemAllocator()
        partials = smem.allocate_tensor(Float32, cute.make_layout(self.num_warps), 4)
        warp_sum = cute.arch.warp_reduction_sum(sum_sq)
        if lane == 0:
            partials[warp] = warp_sum
        cute.arch.sync_threads()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(self.num_warps):
            total = total + partials[w]
        r = Float32(1.0) / cute.math.sqrt(total / Float32(kv_count * vec) + eps, fastmath=False)

        for s in cutlass.range(n_steps, unroll=1):
            kv, columns = self._step_columns(s, tidx, kv_count)
            if n_steps > 1:  # else the registers still hold the row (K <= 8192 at vec 8)
                self._load_row(xv, rv, row, columns, x_regs, r_regs)
            if s > 0:
                for u in cutlass.range_constexpr(unroll):
                    self._copy(wv[0, (None, columns[u])], w_regs[None, u])
            for u in cutlass.range_constexpr(unroll):
                if kv[u] < kv_count:
                    v = self._summed(x_regs, r_regs, u)
                    o_regs[None, u].store(((v * r) * w_regs[None, u].load().to(Float32)).to(cutlass.BFloat16))
                    self._copy(o_regs[None, u], ov[row, (None, kv[u])])
