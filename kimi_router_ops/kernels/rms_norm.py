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
    """One compiled norm kernel; the rows of variants.NORM_KERNELS give its parameters."""

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


class NormPrologue:
    """rms_norm's (or fused_add_rms_norm's) norm inside another kernel, of the token rows it
    is about to read: the norm → router fronts (kernels/router_fused.py, NormRouter).

    Each group of `threads` threads (the norm kernel's own count, variants.NORM_KERNELS) sums a
    row's squares as that kernel does: thread t adds the 16-byte vectors t, t + threads, ...
    in order, element by element, then warp shuffles and the warps' partials in warp order, so
    r, and with it every normed element, is the norm op's bit for bit. A kernel of more
    threads norms several rows at once (group g takes rows g, g + groups, ...). The GEMM body
    then passes each x vector it loads through `normalize`, which also writes it out where
    the body says (one CTA of the grid writes each vector once)."""

    def __init__(self, add_residual: bool, threads: int, tokens: int, kernel_threads: int):
        if kernel_threads % threads != 0:
            raise ValueError(f"a kernel of {kernel_threads} threads cannot hold groups of {threads}")
        self.norm = RmsNorm(8, add_residual, threads, unroll=1)
        self.add_residual = add_residual
        self.threads, self.tokens = threads, tokens
        self.groups = kernel_threads // threads
        self.warps = threads // cute.arch.WARP_SIZE

    def smem_bytes(self) -> int:
        return 4 * self.tokens * (self.warps + 1) + 32

    def views(self, *tensors):
        """[rows, (8, K / 8)] views of residual, norm_weight, normed and residual_out."""
        return [cute.logical_divide(t, (None, 8)) for t in tensors]

    @cute.jit
    def inverse_rms(self, xv, rv, first_row, m_count, tidx, eps: Float32):
        """1 / sqrt(mean(s^2) + eps) of rows first_row ... first_row + tokens - 1 (clamped to
        the last row), in shared memory, visible to every thread of the CTA on return."""
        threads, tokens, warps = self.threads, self.tokens, self.warps
        smem = cutlass.utils.SmemAllocator()
        partials = smem.allocate_tensor(Float32, cute.make_layout((tokens, warps), stride=(warps, 1)), 16)
        inverse = smem.allocate_tensor(Float32, cute.make_layout(tokens), 16)
        kv_count = cute.size(xv.shape[1][1])
        group = tidx // threads
        t = tidx - group * threads
        lane = cute.arch.lane_idx()
        warp = t // cute.arch.WARP_SIZE
        x_regs = cute.make_rmem_tensor((8, 1), cutlass.BFloat16)
        r_regs = cute.make_rmem_tensor((8, 1), cutlass.BFloat16)
        n_vecs = (kv_count + threads - 1) // threads
        for m in cutlass.range_constexpr(tokens):
            if group == m % self.groups:
                row = cutlass.min(first_row + m, m_count - 1)
                sum_sq = Float32(0.0)
                # The vectors in the norm kernel's order (its steps of `unroll` vectors a
                # thread are vectors j = s * unroll + u of this walk); clamped loads, so the
                # compiler may issue several at once (half as many with the residual's: the
                # GEMM's prefetched weights hold most registers).
                for j in cutlass.range(n_vecs, unroll=4 if self.add_residual else 8):
                    kv = j * threads + t
                    column = cutlass.min(kv, kv_count - 1)
                    self.norm._copy(xv[row, (None, column)], x_regs[None, 0])
                    if const_expr(self.add_residual):
                        self.norm._copy(rv[row, (None, column)], r_regs[None, 0])
                    v = self.norm._summed(x_regs, r_regs, 0)
                    if kv < kv_count:
                        for e in cutlass.range_constexpr(8):
                            sum_sq = sum_sq + v[e] * v[e]
                warp_sum = cute.arch.warp_reduction_sum(sum_sq)
                if lane == 0:
                    partials[m, warp] = warp_sum
        cute.arch.sync_threads()
        if tidx < tokens:
            total = Float32(0.0)
            for w in cutlass.range_constexpr(warps):
                total = total + partials[tidx, w]
            inverse[tidx] = Float32(1.0) / cute.math.sqrt(total / Float32(kv_count * 8) + eps, fastmath=False)
        cute.arch.sync_threads()
        return inverse

    @cute.jit
    def normalize(self, x_vec, rv, wv, ov, rov, row, column, r: Float32, store):
        """x_vec (8 bf16 of row `row`, vector `column`, in registers) made the normed vector,
        in place; where `store`, also written to normed (and s to residual_out)."""
        s = x_vec.load().to(Float32)
        s_regs = cute.make_rmem_tensor((8,), cutlass.BFloat16)
        w_regs = cute.make_rmem_tensor((8,), cutlass.BFloat16)
        if const_expr(self.add_residual):
            self.norm._copy(rv[row, (None, column)], s_regs)
            s = (s + s_regs.load().to(Float32)).to(cutlass.BFloat16).to(Float32)
        self.norm._copy(wv[0, (None, column)], w_regs)
        x_vec.store(((s * r) * w_regs.load().to(Float32)).to(cutlass.BFloat16))
        if store:
            self.norm._copy(x_vec, ov[row, (None, column)])
            if const_expr(self.add_residual):
                s_regs.store(s.to(cutlass.BFloat16))
                self.norm._copy(s_regs, rov[row, (None, column)])


class NormInput:
    """A NormPrologue bound to one call's tensors: what a GEMM body takes as `norm` (and hands
    to inverse_rms and normalize below: a method call on it inside a run-time loop would
    make CuTe DSL carry it through the loop)."""

    def __init__(self, prologue: NormPrologue, rv, wv, ov, rov, eps):
        self.prologue, self.rv, self.wv, self.ov, self.rov, self.eps = prologue, rv, wv, ov, rov, eps


def inverse_rms(norm: NormInput, xv, first_row, m_count, tidx):
    return norm.prologue.inverse_rms(xv, norm.rv, first_row, m_count, tidx, norm.eps)


def normalize(norm: NormInput, x_vec, row, column, r, store):
    norm.prologue.normalize(x_vec, norm.rv, norm.wv, norm.ov, norm.rov, row, column, r, store)
