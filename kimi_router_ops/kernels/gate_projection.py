"""The router's gate and a second projection of the same tokens in one grid.

    logits[m, n]     = sum_k x[m, k] * w[n, k] (+ gate_bias[n])   fp32 out   (the gate)
    projection[m, l] = sum_k x[m, k] * p[l, k]                    bf16 out   (e.g. Kimi-K3's
                                                                  latent down-projection)

At decode both are weight streams over the same x, 64 MB for Kimi-K3: the kernel's whole
cost is reading them, so it is built to keep HBM busy from the first cycle to the last.
The rows of W and then of P are cut into tiles of `rows` rows (each row all of K); a
persistent grid (`ctas` CTAs, a few an SM) walks the tiles with a stride of the grid, and
each thread holds two tiles' weights in registers: while it multiplies and reduces one, the
next one's loads are in flight (a grid of one tile a CTA instead streams in waves, each
ending in a reduction and a launch with nothing in flight: 2.5 TB/s where HBM gives 4.1).
The first tile's loads go before the PDL wait, so the producer of x (a norm, AttnRes)
overlaps them. Thread t takes the 16-byte vectors t, t + threads, ... of a row, `unroll`
of them, which must cover K (the host checks). x is loaded once a CTA for up to
`RESIDENT_TOKENS` tokens (it is the same for every tile), else again for each tile (L1 hits).
A tile's sums are reduced by warp shuffles and one shared-memory exchange (two slots, one per
register buffer, so one barrier a tile suffices), in a fixed order: bitwise repeatable.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr

from .common import accumulate_products, load_vector, share_warp_sums, sum_of_warps

VEC = 8  # bf16 elements of one 16-byte load
RESIDENT_TOKENS = 2


class GateProjection:
    """One kernel: `max_m` tokens, tiles of `rows` rows, `unroll` vectors a thread cover K."""

    def __init__(self, max_m: int, rows: int, unroll: int, threads: int, ctas_per_sm: int):
        self.max_m, self.rows, self.unroll, self.threads = max_m, rows, unroll, threads
        self.ctas_per_sm = ctas_per_sm
        self.num_warps = threads // cute.arch.WARP_SIZE
        self.x_resident = max_m <= RESIDENT_TOKENS

    def max_k(self) -> int:
        return VEC * self.threads * self.unroll

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # [M, K] bf16, unit stride along K, M <= max_m
        w: cute.Tensor,  # [N, K] bf16: the gate
        gate_bias: cute.Tensor,  # [1, N] bf16; read only if has_gate_bias
        logits: cute.Tensor,  # [M, N] float32, out
        p: cute.Tensor,  # [L, K] bf16: the projection
        projection: cute.Tensor,  # [M, L] bf16, out
        has_gate_bias: Int32,
        ctas: Int32,  # the persistent grid's size (the host: CTAs an SM holds x SMs)
        stream: cuda.CUstream,
    ):
        xv = cute.logical_divide(x, (None, VEC))
        wv = cute.logical_divide(w, (None, VEC))
        pv = cute.logical_divide(p, (None, VEC))
        gate_tiles = (w.shape[0] + self.rows - 1) // self.rows
        tiles = gate_tiles + (p.shape[0] + self.rows - 1) // self.rows
        smem = 2 * self.max_m * self.rows * self.num_warps * 4
        self.kernel(xv, wv, gate_bias, logits, pv, projection, has_gate_bias, gate_tiles, tiles).launch(
            grid=[cutlass.min(ctas, tiles), 1, 1], block=[self.threads, 1, 1], smem=smem, stream=stream,
            use_pdl=True, min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=-1)  # no GPU query at build

    @cute.jit
    def _load_tile(self, wv, pv, buf, tile, gate_tiles, tiles, columns):
        """Tile `tile`'s weights (clamped to the last tile, rows to the last row: loaded,
        never stored) into the register buffer `buf`."""
        t = cutlass.min(tile, tiles - 1)
        if t < gate_tiles:
            for r in cutlass.range_constexpr(self.rows):
                row = cutlass.min(t * self.rows + r, wv.shape[0] - 1)
                for u in cutlass.range_constexpr(self.unroll):
                    load_vector(wv[row, (None, columns[u])], buf[None, u, r])
        else:
            for r in cutlass.range_constexpr(self.rows):
                row = cutlass.min((t - gate_tiles) * self.rows + r, pv.shape[0] - 1)
                for u in cutlass.range_constexpr(self.unroll):
                    load_vector(pv[row, (None, columns[u])], buf[None, u, r])

    @cute.jit
    def _load_x(self, xv, x_regs, columns, only_u: cutlass.Constexpr = -1):
        """x's vectors of this thread's columns (of column `only_u` alone, if given)."""
        for m in cutlass.range_constexpr(self.max_m):
            row = cutlass.min(Int32(m), xv.shape[0] - 1)
            for u in cutlass.range_constexpr(self.unroll):
                if const_expr(only_u < 0 or u == only_u):
                    load_vector(xv[row, (None, columns[u])], x_regs[None, u, m])

    @cute.jit
    def _finish_tile(self, xv, x_regs, buf, partials, slot, tile, gate_tiles, tiles, columns, padding,
                     gate_bias, logits, projection, has_gate_bias):
        """Multiply tile `tile` (in `buf`), reduce, store; nothing if it is past the last."""
        max_m, rows, unroll, num_warps = self.max_m, self.rows, self.unroll, self.num_warps
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        if tile < tiles:
            acc = cute.make_rmem_tensor((max_m, rows), Float32)
            acc.fill(0.0)
            for u in cutlass.range_constexpr(unroll):
                if const_expr(not self.x_resident):
                    self._load_x(xv, x_regs, columns, u)
                if padding[u]:
                    # A clamped column: zero both operands (either may hold inf or NaN).
                    x_regs[None, u, None].fill(0.0)
                    buf[None, u, None].fill(0.0)
                accumulate_products(acc, x_regs, u, buf, u, max_m, rows, VEC)
            mine = partials[slot, None, None]
            share_warp_sums(acc, mine, lane, warp, max_m, rows)
            if tidx < max_m * rows:
                m = tidx // rows
                r = tidx - m * rows
                total = sum_of_warps(mine, tidx, num_warps)
                if m < xv.shape[0]:
                    if tile < gate_tiles:
                        row = tile * rows + r
                        if row < logits.shape[1]:
                            if has_gate_bias != 0:
                                total = total + gate_bias[0, row].to(Float32)
                            logits[m, row] = total
                    else:
                        row = (tile - gate_tiles) * rows + r
                        if row < projection.shape[1]:
                            projection[m, row] = total.to(BFloat16)

    @cute.kernel
    def kernel(self, xv: cute.Tensor, wv: cute.Tensor, gate_bias: cute.Tensor, logits: cute.Tensor,
               pv: cute.Tensor, projection: cute.Tensor, has_gate_bias: Int32, gate_tiles: Int32, tiles: Int32):
        max_m, rows, unroll, threads, num_warps = self.max_m, self.rows, self.unroll, self.threads, self.num_warps
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        kv_count = cute.size(xv.shape[1][1])
        kv = [u * threads + tidx for u in range(unroll)]
        columns = [cutlass.min(k, kv_count - 1) for k in kv]
        padding = [k >= kv_count for k in kv]

        bufs = [cute.make_rmem_tensor((VEC, unroll, rows), BFloat16) for _ in range(2)]
        x_regs = cute.make_rmem_tensor((VEC, unroll, max_m), BFloat16)
        smem = cutlass.utils.SmemAllocator()
        partials = smem.allocate_tensor(
            Float32, cute.make_layout((2, max_m * rows, num_warps), stride=(max_m * rows * num_warps, num_warps, 1)),
            16)

        # W and P do not depend on the kernel before us: the first tile's loads go now.
        self._load_tile(wv, pv, bufs[0], bidx, gate_tiles, tiles, columns)
        # Everything below may read x, which the previous kernel writes.
        cute.arch.griddepcontrol_wait()
        if const_expr(self.x_resident):
            self._load_x(xv, x_regs, columns)
        # The next kernel (the routing) may launch: it reads nothing of ours before its own
        # wait returns, after this grid has finished.
        cute.arch.griddepcontrol_launch_dependents()
        pairs = (tiles - bidx + 2 * grid - 1) // (2 * grid)
        for i in cutlass.range(pairs, unroll=1):
            tile = bidx + i * 2 * grid
            self._load_tile(wv, pv, bufs[1], tile + grid, gate_tiles, tiles, columns)
            self._finish_tile(xv, x_regs, bufs[0], partials, 0, tile, gate_tiles, tiles, columns, padding,
                              gate_bias, logits, projection, has_gate_bias)
            self._load_tile(wv, pv, bufs[0], tile + 2 * grid, gate_tiles, tiles, columns)
            self._finish_tile(xv, x_regs, bufs[1], partials, 1, tile + grid, gate_tiles, tiles, columns, padding,
                              gate_bias, logits, projection, has_gate_bias)
