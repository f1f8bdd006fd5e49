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


class AttnRes:
    """The compiled kernel; variants.ATTN_RES_KERNEL gives its parameters."""

    def __init__(self, cluster: int, threads: int, max_blocks: int):
        self.cluster = cluster
        self.threads = threads
        self.warps = threads // cute.arch.WARP_SIZE
        self.max_sources = max_blocks + 1
        # A lane holds one value of the exchange: the sum of squares and the dot product of
        # each source, 32 in all.
        if 2 * self.max_sources != cute.arch.WARP_SIZE:
            raise ValueError(f"attn_res: max_blocks must be 15, got {max_blocks}")

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
        total = Float32(0.0)
        for s in cutlass.range_constexpr(self.cluster * self.warps):
            total = total + mailbox[s * width + index]
        return total

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
        # norm_weight * qk_weight (zeros past num_blocks and in threads past H).
        wq = nw.load().to(Float32) * qw.load().to(Float32)
        squares, dots = [], []
        for s in cutlass.range_constexpr(S):
            v = src[None, s].load().to(Float32)
            sq = Float32(0.0)
            dot = Float32(0.0)
            for e in cutlass.range_constexpr(VEC):
                sq = sq + v[e] * v[e]
                dot = dot + v[e] * wq[e]
            squares.append(cutlass.select_(mine, sq, Float32(0.0)))
            dots.append(cutlass.select_(mine, dot, Float32(0.0)))
        warp_total = self._lane_totals(squares + dots, lane)

        cute.arch.cluster_wait()
        self._send(sums_box, warp_total, 2 * S, rank, warp, lane)
        # Release our stores into the peers' mailboxes, acquire theirs into ours.
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        token_total = self._slot_sum(sums_box, lane, 2 * S)  # lane j: value j, whole token

        inv_h = Float32(1.0) / Float32(kv_count * VEC)
        logits = []
        top = Float32(float("-inf"))
        for s in cutlass.range_constexpr(S):
            sq = cute.arch.shuffle_sync(token_total, s)
            dot = cute.arch.shuffle_sync(token_total, S + s)
            logit = dot * (Float32(1.0) / cute.math.sqrt(sq * inv_h + eps, fastmath=False))
            valid = (s < num_blocks) | (s == S - 1)
            top = cutlass.select_(valid, cutlass.max(top, logit), top)
            logits.append(logit)
        denominator = Float32(0.0)
        mixed = cute.make_rmem_tensor((VEC,), Float32)
        mixed.fill(0.0)
        for s in cutlass.range_constexpr(S):
            # One source: its weight is 1 whatever its logit (vLLM's kernel skips the softmax
            # there too).
            weight = cutlass.select_(num_blocks > 0, cute.math.exp(logits[s] - top, fastmath=False), Float32(1.0))
            weight = cutlass.select_((s < num_blocks) | (s == S - 1), weight, Float32(0.0))
            denominator = denominator + weight
            mixed.store(mixed.load() + weight * src[None, s].load().to(Float32))
        mixed.store(mixed.load() / denominator)

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
            total = self._slot_sum(norm_box, 0, 1)
            r = Float32(1.0) / cute.math.sqrt(total * inv_h + output_norm_eps, fastmath=False)
            result.store(((mixed.load() * r) * ow.load().to(Float32)).to(BFloat16))
        else:
            result.store(mixed.load().to(BFloat16))
        if mine:
            self._store(result, out[token, (None, kv)])
