"""Tensor-core router GEMM for decode in CuTe DSL: warp mma.sync, split-K over a cluster.

    out[m, n] = sum_k x[m, k] * w[n, k] (+ gate_bias[n])      bf16 inputs, fp32 accumulation

One `mma.sync.m16n8k16` multiplies a tile of 16 experts (rows of W, the MMA's M) by 8
tokens (rows of x, the MMA's N). The MMA's K order inside a 32-wide chunk is free, since
the sum does not depend on it, so it is chosen to make every load 16 bytes: lane (g, t) of a
warp (g = lane / 4, t = lane % 4) loads the 8 contiguous elements [8t, 8t + 8) of a chunk
from experts g and g + 8 and from token g (and g + 8), and feeds elements 0-3 to the first
k16 MMA and 4-7 to the second. A and B see the same permutation, so the product is exact.

Work split: a CTA owns `tiles` 16-expert tiles, `tokens` tokens and one K slice; its warps
split that slice again, and the `cluster_k` CTAs of a thread-block cluster hold the slices of
one expert tile, so small N still fills the GPU. More than `tokens` tokens take more CTAs
along the grid's z (each reads its experts' weights again, mostly from L2). Each warp walks its run of chunks `unroll` chunks per step,
issuing every load of a step before the first MMA. Partial sums meet in shared memory,
through distributed shared memory: each warp stores its partials into the CTA that finishes
those outputs, which adds them in (rank, warp) order after one cluster barrier: a fixed
order, no atomics, bitwise repeatable, one launch.

x costs (tokens / (16 * tiles)) of W's bytes, read through L2 once per CTA. A CTA may load
its tokens in passes of `pass_tokens`, one after another, each multiplied by the weights
already in its registers: the same products in the same order, fewer registers. Tokens past M
and experts past N are clamped to the last valid row (loaded, never stored); chunks past a
warp's run or past K are clamped and zeroed, so every address is in bounds and the loop has
no branches around loads.
"""

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from . import handoff as handoff_buffer
from .common import GemmKernel, load_vector

TILE_E = 16  # experts per MMA (its M)
TILE_T = 8  # tokens per MMA (its N)
CHUNK_VECS = 4  # 16-byte vectors per lane group and chunk: a chunk is 32 elements of K


@dsl_user_op
def _keep_loads_above(*, loc=None, ip=None):
    """An empty asm that clobbers memory: the compiler keeps step 0's loads above it, all
    in flight at once, as launch_dependents does where it stands here."""
    llvm.inline_asm(None, [], "", "~{memory}", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


class GemmMma(GemmKernel):
    """One kernel variant; its compile-time parameters come from kimi_router_ops/tables/gemm.py."""

    def __init__(
        self,
        tokens: int,
        tiles: int,
        cluster_k: int,
        warps: int,
        unroll: int,
        prefetch: bool,
        pdl: bool,
        trigger: str = "after_x",  # tables.TRIGGERS: where the next kernel may launch
        pass_tokens: int = 0,  # tokens loaded at once (0: all `tokens`); see body
    ):
        pass_tokens = pass_tokens or tokens
        if pass_tokens % TILE_T != 0 or tokens % pass_tokens != 0:
            raise ValueError(f"tokens ({tokens}) must be a multiple of pass_tokens ({pass_tokens}), "
                             f"a multiple of {TILE_T}")
        self._meet_the_kernel_before(prefetch, pdl, trigger)
        if trigger == "at_exit":
            raise ValueError("trigger 'at_exit' is built for the dot product only")
        self.tokens = tokens
        self.tiles = tiles
        self.cluster_k = cluster_k
        self.warps = warps
        self.unroll = unroll
        self.threads = warps * cute.arch.WARP_SIZE
        self.ctas_per_sm = 1  # about 200 registers a thread (ptxas), 8 warps
        self.experts = TILE_E * tiles  # experts per CTA
        self.token_blocks = tokens // TILE_T
        self.pass_blocks = pass_tokens // TILE_T
        self.passes = tokens // pass_tokens
        self.outputs = self.experts * tokens  # partial sums per CTA

    def finishing_share(self) -> int:
        """Outputs each CTA of a cluster finishes: rank r sums and stores outputs
        [r * share, (r + 1) * share), token-major (body)."""
        return (self.outputs + self.cluster_k - 1) // self.cluster_k

    def smem_bytes(self) -> int:
        return self.cluster_k * self.warps * self.finishing_share() * 4

    def vector_views(self, x, w):
        return cute.logical_divide(x, (None, 8)), cute.logical_divide(w, (None, 8))

    # The grid axis along which clusters take expert tiles, and how many experts a tile has.
    expert_axis = 1

    def experts_per_cta(self) -> int:
        return self.experts

    def launch_shape(self, n, m):
        """Grid, block, cluster and shared memory for N experts and M tokens (the fused router
        reuses it)."""
        return dict(
            grid=[self.cluster_k, (n + self.experts - 1) // self.experts, (m + self.tokens - 1) // self.tokens],
            block=[self.threads, 1, 1],
            cluster=[self.cluster_k, 1, 1],
            smem=self.smem_bytes(),
        )

    @cute.jit
    def _load_weights(self, wv, w_regs, w_rows, columns):
        for u in cutlass.range_constexpr(self.unroll):
            for i in cutlass.range_constexpr(self.tiles * 2):
                load_vector(wv[w_rows[i], (None, columns[u])], w_regs[None, u, i])

    @cute.jit
    def _load_tokens(self, xv, x_regs, x_rows, columns, p):
        """Pass p's token blocks."""
        for u in cutlass.range_constexpr(self.unroll):
            for b in cutlass.range_constexpr(self.pass_blocks):
                load_vector(xv[x_rows[p * self.pass_blocks + b], (None, columns[u])], x_regs[None, u, b])

    @cute.jit
    def _multiply(self, mma, w_regs, x_regs, a_frag, acc, padding, p):
        for u in cutlass.range_constexpr(self.unroll):
            if padding[u]:
                # Zero both operands of a clamped chunk (either may hold inf or NaN).
                w_regs[None, u, None].fill(0.0)
                x_regs[None, u, None].fill(0.0)
            for half in cutlass.range_constexpr(2):
                e = 4 * half  # this k16 MMA takes elements e..e+3 of each loaded vector
                for i in cutlass.range_constexpr(self.tiles):
                    # A registers in PTX order: (row g, k 0-1), (row g+8, k 0-1),
                    # (row g, k 2-3), (row g+8, k 2-3) of this lane's four k values.
                    for j in cutlass.range_constexpr(2):
                        for r in cutlass.range_constexpr(2):
                            a_frag[4 * j + 2 * r, 0, 0] = w_regs[e + 2 * j, u, 2 * i + r]
                            a_frag[4 * j + 2 * r + 1, 0, 0] = w_regs[e + 2 * j + 1, u, 2 * i + r]
                    for b in cutlass.range_constexpr(self.pass_blocks):
                        b_frag = cute.make_tensor(
                            x_regs[None, u, b].iterator + e, cute.make_layout((4, 1, 1))
                        )
                        c = cute.make_tensor(acc[None, i, p * self.pass_blocks + b].iterator,
                                             cute.make_layout((4, 1, 1)))
                        cute.gemm(mma, c, a_frag, b_frag, c)

    def _step_columns(self, s, chunk_first, chunk_end, t, kv_count):
        """Per chunk of step s: this lane's vector column (clamped in bounds) and whether it
        is padding (past this warp's run of chunks or past K)."""
        columns, padding = [], []
        for u in range(self.unroll):
            chunk = chunk_first + s * self.unroll + u
            kv = chunk * CHUNK_VECS + t
            columns.append(cutlass.min(kv, kv_count - 1))
            padding.append((chunk >= chunk_end) | (kv >= kv_count))
        return columns, padding

    @cute.jit
    def body(self, xv: cute.Tensor, wv: cute.Tensor, gate_bias: cute.Tensor, out: cute.Tensor,
             has_gate_bias: Int32, handoff=None, scoring=None, expert_block=None):
        # Compile-time values.
        unroll, tiles, token_blocks, warps = self.unroll, self.tiles, self.token_blocks, self.warps
        threads, experts, outputs, cluster_k = self.threads, self.experts, self.outputs, self.cluster_k

        tidx, _, _ = cute.arch.thread_idx()
        rank, tile, token_tile = cute.arch.block_idx()  # grid x = the cluster: rank in it
        if const_expr(expert_block is not None):
            tile = expert_block  # another grid's block index (kernels/gate_projection.py)
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        g = lane // 4
        t = lane - g * 4

        m_count = xv.shape[0]
        n_count = wv.shape[0]
        kv_count = cute.size(xv.shape[1][1])
        chunks = (kv_count + CHUNK_VECS - 1) // CHUNK_VECS
        # Contiguous runs of chunks: CTA `rank` of the cluster, warp `warp` of the CTA.
        slices = cluster_k * warps
        run = (chunks + slices - 1) // slices
        chunk_first = (rank * warps + warp) * run
        chunk_end = cutlass.min(chunk_first + run, chunks)
        n_steps = (run + unroll - 1) // unroll
        expert_first = tile * experts
        token_first = token_tile * self.tokens

        # Register i = 2 * tile + half holds expert expert_first + 16 * tile + 8 * half + g.
        w_rows = [
            cutlass.min(expert_first + TILE_E * (i // 2) + 8 * (i % 2) + g, n_count - 1)
            for i in range(tiles * 2)
        ]
        x_rows = [cutlass.min(token_first + TILE_T * b + g, m_count - 1) for b in range(token_blocks)]

        w_regs = cute.make_rmem_tensor((8, unroll, tiles * 2), BFloat16)
        x_regs = cute.make_rmem_tensor((8, unroll, self.pass_blocks), BFloat16)
        # Fragments as (values, 1, 1): one MMA atom's worth for cute.gemm.
        a_frag = cute.make_rmem_tensor((8, 1, 1), BFloat16)
        acc = cute.make_rmem_tensor((4, tiles, token_blocks), Float32)
        acc.fill(0.0)
        mma = cute.make_mma_atom(cute.nvgpu.warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)))

        if const_expr(cluster_k > 1):
            # A CTA may write a peer's shared memory only once the peer is running: arrive
            # now, wait just before the first remote store (long satisfied by then).
            cute.arch.cluster_arrive_relaxed()

        # As safe as later (below); the next kernel's CTAs start before our weight loads,
        # which measured faster for Kimi-K2-sized N on the one-tile kernel at M = 2..8
        # (docs/kernel-notes.md).
        self._signal_dependents_at("at_entry")
        # Step 0 is peeled: its loads are all issued before launch_dependents, which the
        # compiler does not move loads across, so the whole step is in flight at once
        # (otherwise it sinks each x load next to its MMA, one L2 round trip after another).
        columns, padding = self._step_columns(Int32(0), chunk_first, chunk_end, t, kv_count)
        if const_expr(self.prefetch):
            # W never depends on the kernel before us: request the first step's weights now,
            # so they travel from HBM while that kernel finishes writing hidden_states.
            self._load_weights(wv, w_regs, w_rows, columns)
        # As safe as after the x loads (below), and the next kernel's CTAs get going
        # sooner: in some fused router rows that keeps their weight stream out of the
        # way of our handoff (docs/kernel-notes.md).
        self._signal_dependents_at("before_wait")
        if const_expr(self.pdl):
            # Everything below may read hidden_states, which the previous kernel writes.
            cute.arch.griddepcontrol_wait()
        gates = self._load_gate_bias(gate_bias, has_gate_bias, rank, tidx, expert_first, n_count)
        if const_expr(not self.prefetch):
            self._load_weights(wv, w_regs, w_rows, columns)
        self._load_tokens(xv, x_regs, x_rows, columns, 0)
        if const_expr(self.pdl and self.trigger == "after_x"):
            # Safe this early; meanwhile a dependent can stream its weights.
            cute.arch.griddepcontrol_launch_dependents()
        elif const_expr(self.pdl):
            _keep_loads_above()
        self._multiply(mma, w_regs, x_regs, a_frag, acc, padding, 0)
        # More passes: the step's weights stay in registers while the next tokens load (an
        # L2 round trip each, where more tokens at once would not fit in the registers).
        for p in cutlass.range_constexpr(1, self.passes):
            self._load_tokens(xv, x_regs, x_rows, columns, p)
            self._multiply(mma, w_regs, x_regs, a_frag, acc, padding, p)
        for s in cutlass.range(1, n_steps, unroll=1):
            columns, padding = self._step_columns(s, chunk_first, chunk_end, t, kv_count)
            self._load_weights(wv, w_regs, w_rows, columns)
            for p in cutlass.range_constexpr(self.passes):
                self._load_tokens(xv, x_regs, x_rows, columns, p)
                self._multiply(mma, w_regs, x_regs, a_frag, acc, padding, p)

        # Reduction: CTA `rank` of the cluster finishes outputs [rank * share, (rank + 1) *
        # share). Every warp of every CTA stores its partial sums straight into the slot
        # (rank, warp) of the finishing CTA's mailbox; after one barrier each CTA adds its
        # slots in slot order (a fixed order) and writes out. No one reads remote memory, so
        # no second barrier is needed before exit.
        share = self.finishing_share()
        slots = cluster_k * warps
        smem = cutlass.utils.SmemAllocator()
        mailbox = smem.allocate_tensor(
            Float32, cute.make_layout((share, slots), stride=(1, share)), 16
        )
        my_slot = rank * warps + warp
        if const_expr(cluster_k > 1):
            cute.arch.cluster_wait()
        # Accumulator value v of (tile i, token block b) is expert 16i + g + 8 * (v // 2),
        # token 8b + 2t + v % 2; output index = token * experts + expert.
        for i in cutlass.range_constexpr(tiles):
            for b in cutlass.range_constexpr(token_blocks):
                for v in cutlass.range_constexpr(4):
                    idx = (TILE_T * b + 2 * t + v % 2) * experts + TILE_E * i + g + 8 * (v // 2)
                    owner = idx // share
                    slot = mailbox.iterator + (my_slot * share + idx - owner * share)
                    if const_expr(cluster_k == 1):
                        slot[0] = acc[v, i, b]
                    else:
                        cute.arch.map_dsmem_ptr(slot, owner)[0] = acc[v, i, b]
        if const_expr(cluster_k == 1):
            cute.arch.sync_threads()
        else:
            # Release our stores into the peers' mailboxes, acquire theirs into ours.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        for p in cutlass.range_constexpr((share + threads - 1) // threads):
            pos = p * threads + tidx
            idx = rank * share + pos
            if pos < share and idx < outputs:
                total = Float32(0.0)
                for s_ in cutlass.range_constexpr(slots):
                    total = total + mailbox[pos, s_]
                if has_gate_bias != 0:
                    total = total + gates[p]
                self._store(out, handoff, scoring, idx, total, token_first, expert_first, m_count, n_count)

    @cute.jit
    def _load_gate_bias(self, gate_bias, has_gate_bias, rank, tidx, expert_first, n_count):
        """The gate bias of each output this thread finishes (one a pass of the final sum),
        asked for long before the sums: a model's bias is cold."""
        share = self.finishing_share()
        gates = []
        for p in cutlass.range_constexpr((share + self.threads - 1) // self.threads):
            idx = rank * share + p * self.threads + tidx
            gate = Float32(0.0)
            if has_gate_bias != 0:
                expert = cutlass.min(expert_first + idx % self.experts, n_count - 1)
                gate = gate_bias[0, expert].to(Float32)
            gates.append(gate)
        return gates

    @cute.jit
    def _store(self, out, handoff, scoring, idx, total, token_first, expert_first, m_count, n_count):
        token = token_first + idx // self.experts
        expert = expert_first + idx - (token - token_first) * self.experts
        if token < m_count and expert < n_count:
            out[token, expert] = total.to(out.element_type)
            if const_expr(handoff is not None):
                handoff_buffer.publish(handoff, token, expert, total, scoring)
