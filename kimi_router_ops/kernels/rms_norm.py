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
    r, and with it every normed element, is the norm op's bit for bit. Its steps load `unroll`
    vectors a thread at once (one memory round trip a step; the order of the sums does not
    depend on the step size). A kernel of more threads norms several rows at once (group g
    takes rows g, g + groups, ...). The GEMM body then passes each x vector it loads through
    `normalize`, and one CTA of the grid writes the normed rows out at its end (`write_out`)."""

    def __init__(self, add_residual: bool, threads: int, tokens: int, kernel_threads: int, unroll: int = 8):
        if kernel_threads % threads != 0:
            raise ValueError(f"a kernel of {kernel_threads} threads cannot hold groups of {threads}")
        self.norm = RmsNorm(8, add_residual, threads, unroll)
        self.add_residual = add_residual
        self.threads, self.tokens, self.unroll = threads, tokens, unroll
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
        threads, tokens, warps, unroll = self.threads, self.tokens, self.warps, self.unroll
        smem = cutlass.utils.SmemAllocator()
        partials = smem.allocate_tensor(Float32, cute.make_layout((tokens, warps), stride=(warps, 1)), 16)
        inverse = smem.allocate_tensor(Float32, cute.make_layout(tokens), 16)
        kv_count = cute.size(xv.shape[1][1])
        n_steps = (kv_count + threads * unroll - 1) // (threads * unroll)
        lane = cute.arch.lane_idx()
        x_regs = cute.make_rmem_tensor((8, unroll), cutlass.BFloat16)
        r_regs = cute.make_rmem_tensor((8, unroll), cutlass.BFloat16)
        group = tidx // threads
        t = tidx - group * threads
        warp = t // cute.arch.WARP_SIZE
        for m in cutlass.range_constexpr(tokens):
            if group == m % self.groups:
                row = cutlass.min(first_row + m, m_count - 1)
                sum_sq = Float32(0.0)
                # The norm kernel's loop (kernels/rms_norm.py), step for step.
                for s in cutlass.range(n_steps, unroll=1):
                    kv, columns = self.norm._step_columns(s, t, kv_count)
                    self.norm._load_row(xv, rv, row, columns, x_regs, r_regs)
                    for u in cutlass.range_constexpr(unroll):
                        if kv[u] < kv_count:
                            v = self.norm._summed(x_regs, r_regs, u)
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
    def normalize(self, x_vec, rv, wv, row, column, r: Float32):
        """x_vec (8 bf16 of row `row`, vector `column`, in registers) made the normed vector,
        in place. No branches: the body's loads stay in flight together."""
        s = x_vec.load().to(Float32)
        s_regs = cute.make_rmem_tensor((8,), cutlass.BFloat16)
        w_regs = cute.make_rmem_tensor((8,), cutlass.BFloat16)
        if const_expr(self.add_residual):
            self.norm._copy(rv[row, (None, column)], s_regs)
            s = (s + s_regs.load().to(Float32)).to(cutlass.BFloat16).to(Float32)
        self.norm._copy(wv[0, (None, column)], w_regs)
        x_vec.store(((s * r) * w_regs.load().to(Float32)).to(cutlass.BFloat16))

    @cute.jit
    def write_out(self, xv, rv, wv, ov, rov, first_row, m_count, tidx, inverse):
        """normed (and residual_out) of the rows that exist, by the CTA the body names, after
        its own stores: the rows again from L1 or L2, each vector once."""
        threads, unroll = self.threads, self.unroll
        kv_count = cute.size(xv.shape[1][1])
        n_steps = (kv_count + threads * unroll - 1) // (threads * unroll)
        x_regs = cute.make_rmem_tensor((8, unroll), cutlass.BFloat16)
        r_regs = cute.make_rmem_tensor((8, unroll), cutlass.BFloat16)
        o_regs = cute.make_rmem_tensor((8, unroll), cutlass.BFloat16)
        w_regs = cute.make_rmem_tensor((8, unroll), cutlass.BFloat16)
        group = tidx // threads
        t = tidx - group * threads
        for m in cutlass.range_constexpr(self.tokens):
            if group == m % self.groups and first_row + m < m_count:
                row = first_row + m
                r = inverse[m]
                for s in cutlass.range(n_steps, unroll=1):
                    kv, columns = self.norm._step_columns(s, t, kv_count)
                    self.norm._load_row(xv, rv, row, columns, x_regs, r_regs)
                    for u in cutlass.range_constexpr(unroll):
                        self.norm._copy(wv[0, (None, columns[u])], w_regs[None, u])
                    for u in cutlass.range_constexpr(unroll):
                        if kv[u] < kv_count:
                            v = self.norm._summed(x_regs, r_regs, u)
                            o_regs[None, u].store(((v * r) * w_regs[None, u].load().to(Float32)).to(cutlass.BFloat16))
                            self.norm._copy(o_regs[None, u], ov[row, (None, kv[u])])
                            if const_expr(self.add_residual):
                                o_regs[None, u].store(v.to(cutlass.BFloat16))
                                self.norm._copy(o_regs[None, u], rov[row, (None, kv[u])])


class NormInput:
    """A NormPrologue bound to one call's tensors: what a GEMM body takes as `norm` (and hands
    to the functions below: a method call on it inside a run-time loop would make CuTe DSL
    carry it through the loop)."""

    def __init__(self, prologue: NormPrologue, rv, wv, ov, rov, eps):
        self.prologue, self.rv, self.wv, self.ov, self.rov, self.eps = prologue, rv, wv, ov, rov, eps


def inverse_rms(norm: NormInput, xv, first_row, m_count, tidx):
    return norm.prologue.inverse_rms(xv, norm.rv, first_row, m_count, tidx, norm.eps)


def normalize(norm: NormInput, x_vec, row, column, r):
    norm.prologue.normalize(x_vec, norm.rv, norm.wv, row, column, r)


def write_out(norm: NormInput, xv, first_row, m_count, tidx, inverse):
    norm.prologue.write_out(xv, norm.rv, norm.wv, norm.ov, norm.rov, first_row, m_count, tidx, inverse)
