"""Low-latency dot-product router GEMM in CuTe DSL.

    out[m, n] = sum_k x[m, k] * w[n, k] (+ gate_bias[n])      fp32 products and sums

W is bf16, or fp32 for the models that keep an fp32 gate (then x is bf16 or fp32, and W is
never rounded: every product is an fp32 FMA of the stored values).

Each CTA owns `rows_per_cta` consecutive rows of W (experts) and all of K. Its threads
split K into `vec`-element vectors (one 16-byte load when vec == 8); thread t takes vectors
t, t + threads, t + 2 * threads, ... The K loop advances `unroll` vectors per thread per
step, and every load of a step is issued before the first multiply, so each thread keeps
`rows_per_cta * unroll` weight loads in flight: at decode the kernel's whole cost is
reading W once, and only many loads in flight hide HBM latency.

M, N, K and the row strides are run-time values. `max_m` (the token bucket) is a
compile-time bound: rows of x past M are clamped to row M - 1 (cheap L1 hits) and never
stored, so one compiled kernel serves every M up to its bucket. A `token_tiles` kernel
takes more tokens along the grid's y, `max_m` a CTA (each re-reads its experts' weights,
from L2 after the first). Vectors past K are clamped
to the last vector and zeroed after the load, which keeps the loop free of branches around
loads (the compiler can then hoist all of them) and every address in bounds.
"""

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr

from . import handoff as handoff_buffer
from .common import GemmKernel, accumulate_products, load_vector, share_warp_sums, strided_columns, sum_of_warps


# The most registers a thread gives to one step's x; more tokens load x a vector at a time.
X_STEP_REGISTERS = 32


class GemmDotprod(GemmKernel):
    """One kernel variant; its compile-time parameters come from kimi_router_ops/tables/gemm.py."""

    def __init__(
        self,
        max_m: int,
        rows_per_cta: int,
        unroll: int,
        vec: int,
        prefetch: bool,
        pdl: bool,
        threads: int = 128,
        trigger: str = "after_x",  # tables.TRIGGERS: where the next kernel may launch
        weight_dtype=BFloat16,
        x_dtype=BFloat16,
        token_tiles: bool = False,
        k: int = 0,  # compile-time K (the dispatch runs the kernel for that K only); 0: any K
    ):
        if vec not in (1, 8 if weight_dtype is BFloat16 else 4):
            raise ValueError(f"vec must be 1 or one 16-byte vector of weights, got {vec}")
        if weight_dtype is BFloat16 and x_dtype is not BFloat16:
            raise ValueError("bf16 weights take bf16 hidden_states")
        self._meet_the_kernel_before(prefetch, pdl, trigger)
        self.weight_dtype, self.x_dtype, self.vec = weight_dtype, x_dtype, vec
        self.max_m, self.token_tiles = max_m, token_tiles
        if k and (vec != 8 or k % 8):
            raise ValueError(f"a compile-time K takes 16-byte loads of bf16 and K % 8 == 0, got vec {vec}, K {k}")
        self.k = k
        self.rows_per_cta, self.unroll, self.threads = rows_per_cta, unroll, threads
        self.num_warps = threads // cute.arch.WARP_SIZE
        # CTAs an SM holds: ptxas gives every variant at most 128 registers a thread.
        self.ctas_per_sm = max(1, 65536 // (128 * threads))

    def vector_views(self, x, w):
        # Vector views [rows, (vec, K / vec)]: K % vec == 0 is this variant's contract.
        return cute.logical_divide(x, (None, self.vec)), cute.logical_divide(w, (None, self.vec))

    # The grid axis along which CTAs take experts, and how many a CTA takes.
    expert_axis = 0

    def experts_per_cta(self) -> int:
        return self.rows_per_cta

    def launch_shape(self, n, m):  # m: up to max_m, one CTA's tokens
        """Grid, block and shared memory for N experts (the fused router reuses it)."""
        tiles = (m + self.max_m - 1) // self.max_m if self.token_tiles else 1
        return dict(
            grid=[(n + self.rows_per_cta - 1) // self.rows_per_cta, tiles, 1],
            block=[self.threads, 1, 1],
            smem=self.max_m * self.rows_per_cta * self.num_warps * 4,
        )

    @cute.jit
    def _load_weights(self, wv, w_regs, w_rows, kv_clamped):
        """One step's weight loads, rows_per_cta * unroll vectors a thread."""
        for u in cutlass.range_constexpr(self.unroll):
            for r in cutlass.range_constexpr(self.rows_per_cta):
                load_vector(wv[w_rows[r], (None, kv_clamped[u])], w_regs[None, u, r], self.vec)

    @cute.jit
    def _load_x(self, xv, x_regs, x_rows, columns, only_u: cutlass.Constexpr = -1):
        """x's vectors at the step's columns (only column only_u's into slot 0, if given)."""
        for u in cutlass.range_constexpr(self.unroll):
            if const_expr(only_u < 0 or u == only_u):
                for m in cutlass.range_constexpr(self.max_m):
                    load_vector(xv[x_rows[m], (None, columns[u])], x_regs[None, 0 if only_u >= 0 else u, m], self.vec)

    def _step_columns(self, s, tidx, kv_count):
        kv, clamped = strided_columns(s, tidx, kv_count, self.threads, self.unroll)
        # Columns known in range at compile time need no clamp: with one base address a
        # thread's loads are immediate offsets from it (fewer registers, as many loads).
        return kv, [kv[u] if self._in_range(s, u) else clamped[u] for u in range(self.unroll)]

    def _in_range(self, s, u: int) -> bool:
        """Column u of step s is inside K for every thread (known only where K and s are)."""
        return bool(self.k) and isinstance(s, int) and (
            s * self.threads * self.unroll + (u + 1) * self.threads <= self.k // self.vec)

    @cute.jit
    def _step(self, s, xv, wv, w_regs, x_regs, acc, w_rows, x_rows, tidx, kv_count, x_step: cutlass.Constexpr):
        """Step s of the K loop: its loads (but the first step's, where they went ahead of the
        loop) and its multiplies."""
        max_m, rows, unroll, vec = self.max_m, self.rows_per_cta, self.unroll, self.vec
        kv, kv_clamped = self._step_columns(s, tidx, kv_count)
        if const_expr(self.prefetch or x_step):
            if const_expr(isinstance(s, int)):
                if const_expr(s > 0):
                    self._load_step(xv, wv, w_regs, x_regs, w_rows, x_rows, kv_clamped, x_step)
            else:
                if s > 0:
                    self._load_step(xv, wv, w_regs, x_regs, w_rows, x_rows, kv_clamped, x_step)
        else:
            self._load_weights(wv, w_regs, w_rows, kv_clamped)
        for u in cutlass.range_constexpr(unroll):
            xu = u if x_step else 0
            if const_expr(not x_step):
                self._load_x(xv, x_regs, x_rows, kv_clamped, u)
            if const_expr(not self._in_range(s, u)):
                if kv[u] >= kv_count:
                    # A clamped column: zero both operands (x may hold inf or NaN).
                    for m in cutlass.range_constexpr(max_m):
                        x_regs[None, xu, m].fill(0.0)
                    for r in cutlass.range_constexpr(rows):
                        w_regs[None, u, r].fill(0.0)
            accumulate_products(acc, x_regs, xu, w_regs, u, max_m, rows, vec)

    @cute.jit
    def _load_step(self, xv, wv, w_regs, x_regs, w_rows, x_rows, columns, x_step: cutlass.Constexpr):
        self._load_weights(wv, w_regs, w_rows, columns)
        if const_expr(x_step):
            self._load_x(xv, x_regs, x_rows, columns)

    @cute.jit
    def body(self, xv: cute.Tensor, wv: cute.Tensor, gate_bias: cute.Tensor, out: cute.Tensor,
             has_gate_bias: Int32, handoff=None, scoring=None, expert_block=None):
        # Compile-time values.
        max_m, rows, unroll, vec = self.max_m, self.rows_per_cta, self.unroll, self.vec
        threads, num_warps = self.threads, self.num_warps

        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if const_expr(expert_block is not None):
            bidx = expert_block  # another grid's block index (kernels/gate_projection.py)
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()

        m_count = xv.shape[0]
        n_count = wv.shape[0]
        kv_count = self.k // vec if self.k else cute.size(xv.shape[1][1])  # vec-wide columns
        n_steps = (kv_count + threads * unroll - 1) // (threads * unroll)
        n_first = bidx * rows
        m_first = Int32(0)
        if const_expr(self.token_tiles):
            _, bidy, _ = cute.arch.block_idx()
            m_first = bidy * max_m

        acc = cute.make_rmem_tensor((max_m, rows), Float32)
        acc.fill(0.0)
        w_regs = cute.make_rmem_tensor((vec, unroll, rows), self.weight_dtype)
        # x of a whole step in registers where it fits (X_STEP_REGISTERS), so all of the step's
        # x loads go out at once after the wait: loaded a vector at a time, the compiler sinks
        # each next to its multiplies and x's cold reads become one round trip after another.
        x_step = max_m * unroll * vec * self.x_dtype.width <= 32 * X_STEP_REGISTERS
        x_regs = cute.make_rmem_tensor((vec, unroll if x_step else 1, max_m), self.x_dtype)

        # Rows past N are clamped to N - 1: loaded, summed, never stored.
        w_rows = [cutlass.min(n_first + r, n_count - 1) for r in range(rows)]
        x_rows = [cutlass.min(m_first + m, m_count - 1) for m in range(max_m)]

        # As safe as later (below); the next kernel's CTAs start before our weight loads.
        self._signal_dependents_at("at_entry")
        _, first_columns = self._step_columns(0 if self.k else Int32(0), tidx, kv_count)
        if const_expr(self.prefetch):
            # W does not depend on the kernel before us: issue the first step's weight loads
            # now, so they travel from HBM while we wait for hidden_states to be written.
            self._load_weights(wv, w_regs, w_rows, first_columns)
        # A dependent router kernel can stream its weights while we finish.
        self._signal_dependents_at("before_wait")
        if const_expr(self.pdl):
            # Everything below may read hidden_states, which the previous kernel writes.
            cute.arch.griddepcontrol_wait()
        if const_expr(x_step):
            # The first step's loads in straight-line code ahead of the loop, x's all at once
            # (in the loop the compiler sinks each x load next to its multiplies).
            if const_expr(not self.prefetch):
                self._load_weights(wv, w_regs, w_rows, first_columns)
            self._load_x(xv, x_regs, x_rows, first_columns)
        self._signal_dependents_at("after_x")
        # The gate bias of this thread's output, if it stores one, asked for now: a model's
        # bias is cold, and read only after the sums it would be an HBM round trip there.
        gate = Float32(0.0)
        if has_gate_bias != 0:
            gate = gate_bias[0, cutlass.min(n_first + tidx % rows, n_count - 1)].to(Float32)

        if const_expr(self.k):
            for s in cutlass.range_constexpr(n_steps):
                self._step(s, xv, wv, w_regs, x_regs, acc, w_rows, x_rows, tidx, kv_count, x_step)
        else:
            for s in cutlass.range(n_steps, unroll=1):
                self._step(s, xv, wv, w_regs, x_regs, acc, w_rows, x_rows, tidx, kv_count, x_step)

        # Reduce: warp shuffle, one partial per warp in shared memory, then one thread per
        # (m, r) adds the warps' partials in a fixed order, so results are bitwise repeatable.
        smem = cutlass.utils.SmemAllocator()
        partials = smem.allocate_tensor(
            Float32, cute.make_layout((max_m * rows, num_warps), stride=(num_warps, 1)), 16
        )
        share_warp_sums(acc, partials, lane, warp, max_m, rows)
        if tidx < max_m * rows:
            m = tidx // rows
            r = tidx - m * rows
            total = sum_of_warps(partials, tidx, num_warps)
            if m_first + m < m_count and n_first + r < n_count:
                if has_gate_bias != 0:
                    total = total + gate
                out[m_first + m, n_first + r] = total.to(out.element_type)
                if const_expr(handoff is not None):
                    handoff_buffer.publish(handoff, m_first + m, n_first + r, total, scoring)
        self._signal_dependents_at("at_exit")
