"""Kimi-K3's attention residual (AttnRes), the producer in front of its router, in CuTe DSL.

    p        = bf16(prefix + delta)            (delta given; else p = prefix), written to
               prefix (delta given) and to blocks[:, block_write_idx] (>= 0)
    sources  = blocks[:, 0 .. num_blocks-1], then p  (blocks[:, block_write_idx] reads as p)
    logit_s  = (v_s . (norm_weight * qk_weight)) * rsqrt(mean(v_s^2) + eps)      fp32
    mixed    = sum_s softmax(logit)_s * v_s
    out      = bf16(mixed * rsqrt(mean(mixed^2) + output_norm_eps) * output_norm_weight)
               (with an output norm weight; else bf16(mixed))

One token is spread over the `cluster` CTAs of a thread-block cluster, each CTA a slice of
the hidden size and each thread one 16-byte vector of it, so every source of a token is read
in one memory round trip by many SMs at once (one CTA a token, as vLLM's Triton kernel runs
it, streams 9 sources through one SM). The per-source sums of squares and dot products, and
later the output's sum of squares, are added across the cluster through distributed shared
memory: each warp stores its partials into every CTA's mailbox, and after one cluster
barrier every CTA adds the slots of a value in slot order, so all CTAs see the same bits.

Launched with programmatic dependent launch: it lets its dependents launch at entry (their
grid-dependency wait returns only after this grid has finished, so the signal is safe, and
the router behind it streams its weights meanwhile), loads its three weight vectors, then
waits before reading prefix, delta and blocks.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr

VEC = 8  # bf16 elements a thread loads at once: 16 bytes
CHUNK = 4  # block sources behind one branch
LOG2_E = 1.4426950408889634


class AttnRes:
    """The compiled kernel; tables.attn_res.ATTN_RES_KERNEL gives its parameters."""

    def __init__(self, cluster: int, threads: int, max_blocks: int):
        self.cluster = cluster
        self.threads = threads
        self.warps = threads // cute.arch.WARP_SIZE
        self.max_sources = max_blocks + 1
        # A lane holds one value of the exchange (the sum of squares and the dot product of
        # each source, 32 in all) and one slot of the output norm's (a CTA's warp).
        if 2 * self.max_sources != cute.arch.WARP_SIZE or cluster * self.warps != cute.arch.WARP_SIZE:
            raise ValueError("attn_res: needs max_blocks == 15 and cluster * threads == 1024")

    @cute.jit
    def __call__(
        self,
        prefix: cute.Tensor,  # [M, H] bf16, p written here when has_delta
        delta: cute.Tensor,  # [M, H] bf16, read only if has_delta
        blocks: cute.Tensor,  # [M, R, H] bf16
        norm_weight: cute.Tensor,  # [1, H] bf16
        qk_weight: cute.Tensor,  # [1, H] bf16
        output_norm_weight: cute.Tensor,  # [1, H] bf16, read only if has_output_norm
        out: cute.Tensor,  # [M, H] bf16
        num_blocks: Int32,
        block_write_idx: Int32,  # -1: none
        has_delta: Int32,
        has_output_norm: Int32,
        eps: Float32,
        output_norm_eps: Float32,
        stream: cuda.CUstream,
    ):
        rows = [cute.logical_divide(t, (None, VEC))
                for t in (prefix, delta, norm_weight, qk_weight, output_norm_weight, out)]
        bv = cute.logical_divide(blocks, (None, None, VEC))
        self.kernel(*rows, bv, num_blocks, block_write_idx, has_delta, has_output_norm, eps,
                    output_norm_eps).launch(
            grid=[self.cluster, prefix.shape[0], 1], block=[self.threads, 1, 1],
            cluster=[self.cluster, 1, 1], smem=self.smem_bytes(), stream=stream, use_pdl=True,
        )

    def smem_bytes(self):
        slots = self.cluster * self.warps
        return (slots * 2 * self.max_sources + slots) * 4

    @cute.jit
    def _load(self, src: cute.Tensor, dst: cute.Tensor):
        cute.autovec_copy(cute.make_tensor(src.iterator.align(2 * VEC), src.layout), dst)

    @cute.jit
    def _store(self, src: cute.Tensor, dst: cute.Tensor):
        cute.autovec_copy(src, cute.make_tensor(dst.iterator.align(2 * VEC), dst.layout))

    @cute.jit
    def _lane_totals(self, values, lane):
        """32 per-thread values (one list) summed over the warp: lane j returns value j's
        total. Each step halves the values a lane holds: it keeps the half its lane bit
        selects and adds the partner's copy of it (31 shuffles for 32 sums)."""
        for step in cutlass.range_constexpr(5):
            offset = 16 >> step
            half = len(values) // 2
            upper = (lane & offset) != 0
            kept = []
            for i in cutlass.range_constexpr(half):
                send = cutlass.select_(upper, values[i], values[i + half])
                keep = cutlass.select_(upper, values[i + half], values[i])
                kept.append(keep + cute.arch.shuffle_sync_bfly(send, offset))
            values = kept
        return values[0]

    @cute.jit
    def _source_sums(self, src, first, count, wq):
        """Sums of squares, then dot products with wq, of register sources first ..
        first + count - 1 (padded with zeros to CHUNK each), two chains of adds a sum."""
        squares, dots = [], []
        for i in cutlass.range_constexpr(CHUNK):
            sq = [Float32(0.0), Float32(0.0)]
            dot = [Float32(0.0), Float32(0.0)]
            if const_expr(i < count):
                v = src[None, first + i].load().to(Float32)
                for e in cutlass.range_constexpr(VEC):
                    sq[e % 2] = sq[e % 2] + v[e] * v[e]
                    dot[e % 2] = dot[e % 2] + v[e] * wq[e]
            squares.append(sq[0] + sq[1])
            dots.append(dot[0] + dot[1])
        return (*squares, *dots)

    @cute.jit
    def _send(self, mailbox, value, width, rank, warp, index):
        """value into entry `index` of slot (rank, warp) of every CTA's mailbox [slots,
        width] (a CTA's own included)."""
        slot = (rank * self.warps + warp) * width + index
        for peer in cutlass.range_constexpr(self.cluster):
            cute.arch.map_dsmem_ptr(mailbox.iterator + slot, peer)[0] = value

    @cute.jit
    def _slot_sum(self, mailbox, index, width):
        """Entry `index` summed over the 32 slots in slot order: the same bits in every
        warp of every CTA."""
        chains = [Float32(0.0)] * 4  # four chains of adds in flight, joined in a fixed order
        for s in cutlass.range_constexpr(self.cluster * self.warps):
            chains[s % 4] = chains[s % 4] + mailbox[s * width + index]
        return (chains[0] + chains[1]) + (chains[2] + chains[3])

    @cute.kernel
    def kernel(self, prefix, delta, norm_weight, qk_weight, output_norm_weight, out, blocks,
               num_blocks: Int32, block_write_idx: Int32, has_delta: Int32, has_output_norm: Int32,
               eps: Float32, output_norm_eps: Float32):
        S: cutlass.Constexpr = self.max_sources
        tidx, _, _ = cute.arch.thread_idx()
        rank, token, _ = cute.arch.block_idx()  # grid x = the cluster: rank in it
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        kv_count = cute.size(prefix.shape[1][1])  # 16-byte vectors: H = 8 * kv_count
        share = (kv_count + self.cluster - 1) // self.cluster
        kv = rank * share + tidx
        mine = (tidx < share) & (kv < kv_count)
        col = cutlass.min(kv, kv_count - 1)  # clamped: loaded in bounds, never used or stored

        smem = cutlass.utils.SmemAllocator()
        slots = self.cluster * self.warps
        sums_box = smem.allocate_tensor(Float32, cute.make_layout(slots * 2 * S), 16)
        norm_box = smem.allocate_tensor(Float32, cute.make_layout(slots), 16)

        # A CTA may write a peer's shared memory only once the peer runs: arrive now, wait
        # just before the first remote store (long satisfied by then).
        cute.arch.cluster_arrive_relaxed()
        cute.arch.griddepcontrol_launch_dependents()

        # The weights are parameters, not the previous kernel's output: load before the wait.
        nw = cute.make_rmem_tensor((VEC,), BFloat16)
        qw = cute.make_rmem_tensor((VEC,), BFloat16)
        ow = cute.make_rmem_tensor((VEC,), BFloat16)
        self._load(norm_weight[0, (None, col)], nw)
        self._load(qk_weight[0, (None, col)], qw)
        if has_output_norm != 0:
            self._load(output_norm_weight[0, (None, col)], ow)
        cute.arch.griddepcontrol_wait()

        # Every source's vector in flight at once: one memory round trip. Register slot
        # S - 1 holds p, the last source; slots num_blocks .. S - 2 stay zero.
        src = cute.make_rmem_tensor((VEC, S), BFloat16)
        src.fill(0.0)
        dv = cute.make_rmem_tensor((VEC,), BFloat16)
        self._load(prefix[token, (None, col)], src[None, S - 1])
        if has_delta != 0:
            self._load(delta[token, (None, col)], dv)
        for s in cutlass.range_constexpr(S - 1):
            if (s < num_blocks) & (s != block_write_idx):
                self._load(blocks[token, s, (None, col)], src[None, s])

        if has_delta != 0:
            src[None, S - 1].store((src[None, S - 1].load().to(Float32) + dv.load().to(Float32)).to(BFloat16))
            if mine:
                self._store(src[None, S - 1], prefix[token, (None, kv)])
        if (block_write_idx >= 0) & mine:
            self._store(src[None, S - 1], blocks[token, block_write_idx, (None, kv)])
        for s in cutlass.range_constexpr(S - 1):
            if s == block_write_idx:  # blocks[:, block_write_idx] reads as p from now on
                src[None, s].store(src[None, S - 1].load())

        # Value s < S: source s's sum of squares; S + s: its dot product with
        # norm_weight * qk_weight (zeros past num_blocks and in threads past H). Block
        # sources go in chunks of CHUNK behind one warp-uniform branch each: the work grows
        # with num_blocks, and a chunk's chains of adds interleave.
        wq_vec = nw.load().to(Float32) * qw.load().to(Float32)
        wq = [wq_vec[e] for e in range(VEC)]  # scalars, made outside the branches below
        squares, dots = [], []
        for first in cutlass.range_constexpr(0, S - 1, CHUNK):
            count = min(CHUNK, S - 1 - first)
            q0, q1, q2, q3 = Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)
            d0, d1, d2, d3 = Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)
            if mine & (first < num_blocks):
                q0, q1, q2, q3, d0, d1, d2, d3 = self._source_sums(src, first, count, wq)
            squares += [q0, q1, q2, q3][:count]
            dots += [d0, d1, d2, d3][:count]
        p_sums = self._source_sums(src, S - 1, 1, wq)
        squares.append(cutlass.select_(mine, p_sums[0], Float32(0.0)))
        dots.append(cutlass.select_(mine, p_sums[CHUNK], Float32(0.0)))
        warp_total = self._lane_totals(squares + dots, lane)

        cute.arch.cluster_wait()
        self._send(sums_box, warp_total, 2 * S, rank, warp, lane)
        # Release our stores into the peers' mailboxes, acquire theirs into ours.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        token_total = self._slot_sum(sums_box, lane, 2 * S)  # lane j: value j, whole token

        # The softmax over sources, one source a lane (lane s < S: source s; p is S - 1), the
        # same bits in every lane, warp and CTA. Approximate rsqrt, exp2 and reciprocal (a
        # few fp32 ulps, as vLLM's Triton kernel): this is the latency between the two
        # cluster exchanges.
        inv_h = Float32(1.0) / Float32(kv_count * VEC)
        dot = cute.arch.shuffle_sync(token_total, lane + S)
        logit = dot * cute.math.rsqrt(token_total * inv_h + eps, fastmath=True)
        valid = (lane < num_blocks) | (lane == S - 1)
        top = cute.arch.warp_reduction_max(cutlass.select_(valid, logit, Float32(float("-inf"))),
                                           threads_in_group=S)
        e = cute.arch.exp2((logit - top) * Float32(LOG2_E))
        e = cutlass.select_(valid, e, Float32(0.0))
        # One source: its weight is 1 whatever its logit (vLLM's kernel skips the softmax too).
        e = cutlass.select_(num_blocks == 0, cutlass.select_(lane == S - 1, Float32(1.0), Float32(0.0)), e)
        weight = e * cute.arch.rcp_approx(cute.arch.warp_reduction_sum(e, threads_in_group=S))

        mixed = cute.make_rmem_tensor((VEC,), Float32)
        mixed.fill(0.0)
        for first in cutlass.range_constexpr(0, S - 1, CHUNK):
            weights = [cute.arch.shuffle_sync(weight, first + i) for i in range(min(CHUNK, S - 1 - first))]
            if first < num_blocks:
                for i in cutlass.range_constexpr(len(weights)):
                    mixed.store(mixed.load() + weights[i] * src[None, first + i].load().to(Float32))
        mixed.store(mixed.load() + cute.arch.shuffle_sync(weight, S - 1) * src[None, S - 1].load().to(Float32))

        result = cute.make_rmem_tensor((VEC,), BFloat16)
        if has_output_norm != 0:
            sq = Float32(0.0)
            for i in cutlass.range_constexpr(VEC):
                sq = sq + mixed[i] * mixed[i]
            sq = cute.arch.warp_reduction_sum(cutlass.select_(mine, sq, Float32(0.0)))
            if lane == 0:
                self._send(norm_box, sq, 1, rank, warp, 0)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            # Lane l: slot l (cluster * warps == 32), then the butterfly sum.
            total = cute.arch.warp_reduction_sum(norm_box[lane])
            r = cute.math.rsqrt(total * inv_h + output_norm_eps, fastmath=True)
            result.store(((mixed.load() * r) * ow.load().to(Float32)).to(BFloat16))
        else:
            result.store(mixed.load().to(BFloat16))
        if mine:
            self._store(result, out[token, (None, kv)])
