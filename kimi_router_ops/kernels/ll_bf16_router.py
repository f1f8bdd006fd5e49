"""The whole MoE router in one launch: a router GEMM kernel, then routing by its last CTA.

    logits  = x · wᵀ                                  (the GEMM kernel's body, unchanged)
    scores  = sigmoid(logits);  choice = scores + bias
    groups  = n_group equal slices of the experts, scored by the sum of their two best
              choice values; the topk_group best are kept (ties to the lower group)
    ids     = the top_k best choice values among kept experts, best first, ties to the
              lower expert id
    weights = scores[ids] / (sum + 1e-20) if renormalize, times routed_scaling_factor

Every CTA runs the GEMM body of an LLBf16Dotprod or LLBf16Mma kernel and stores its logits.
Then it counts itself done on a counter in global memory (a release-acquire atomic after a
CTA barrier, as a cooperative grid barrier does); the CTA that arrives last, which sees
every logit, routes all M tokens from L2 and sets the counter back to zero, so the next
call on the same counter (the next call on the stream, or the next replay of a captured
graph) starts from zero. The host gives each stream, and each call captured into a graph,
its own counter (csrc/cuda/router_counters.cpp).

Routing: one warp per token. Lane l holds the choice values of experts l, l + 32, ... (up to
`n_max`, a compile-time bound), as floats and as order-preserving unsigned keys, so that a
warp's maximum is one `redux.sync`. Each pick takes the largest key, then the lowest expert
id holding it (a second `redux.sync`), and the winning lane rescans its own values: top_k
picks, no shared memory, no sorting. Group scores merge per-lane best pairs with shuffles.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

WARP = 32


class LLBf16Router:
    """One fused router kernel: `gemm` (a GEMM kernel object) plus the routing epilogue."""

    def __init__(self, gemm, n_max: int):
        if n_max > 32 * WARP:
            raise ValueError(f"n_max must be at most {32 * WARP}, got {n_max}")
        self.gemm = gemm
        self.n_max = n_max
        self.slots = (n_max + WARP - 1) // WARP  # choice values per lane
        self.warps = gemm.threads // WARP

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # [M, K] bf16
        w: cute.Tensor,  # [N, K] bf16
        bias: cute.Tensor,  # [1, N] float32 or bfloat16; read only if has_bias
        logits: cute.Tensor,  # [M, N] float32, out
        weights: cute.Tensor,  # [M, top_k] float32, out
        ids: cute.Tensor,  # [M, top_k] int32, out
        counter: cute.Tensor,  # [1, 1] int32, zero before the call, zero after it
        top_k: Int32,
        n_group: Int32,
        topk_group: Int32,
        renormalize: Int32,
        has_bias: Int32,
        scaling: Float32,
        stream: cuda.CUstream,
    ):
        xv, wv = self.gemm.vector_views(x, w)
        shape = self.gemm.launch_shape(w.shape[0])
        shape["smem"] += 16  # the last-CTA flag, after the GEMM's own shared memory
        self.kernel(
            xv, wv, bias, logits, weights, ids, counter,
            top_k, n_group, topk_group, renormalize, has_bias, scaling,
        ).launch(**shape, stream=stream, use_pdl=self.gemm.pdl)

    @cute.kernel
    def kernel(
        self,
        xv: cute.Tensor,
        wv: cute.Tensor,
        bias: cute.Tensor,
        logits: cute.Tensor,
        weights: cute.Tensor,
        ids: cute.Tensor,
        counter: cute.Tensor,
        top_k: Int32,
        n_group: Int32,
        topk_group: Int32,
        renormalize: Int32,
        has_bias: Int32,
        scaling: Float32,
    ):
        self.gemm.body(xv, wv, logits)

        tidx, _, _ = cute.arch.thread_idx()
        # This barrier orders all of this CTA's logit stores before thread 0's release below.
        smem = cutlass.utils.SmemAllocator()
        last_flag = smem.allocate_tensor(Int32, cute.make_layout(1), 4)
        cute.arch.sync_threads()
        if tidx == 0:
            gx, gy, gz = cute.arch.grid_dim()
            cute.arch.fence_acq_rel_gpu()
            done = cute.arch.atomic_add(counter.iterator, Int32(1), sem="acq_rel", scope="gpu")
            last = Int32(0)
            if done == gx * gy * gz - 1:
                last = Int32(1)
                counter[0, 0] = Int32(0)  # every CTA has counted: ready for the next call
                cute.arch.fence_acq_rel_gpu()
            last_flag[0] = last
        cute.arch.sync_threads()
        if last_flag[0] != 0:
            self._route(logits, bias, weights, ids, top_k, n_group, topk_group, renormalize,
                        has_bias, scaling)

    @cute.jit
    def _sigmoid(self, v: Float32) -> Float32:
        return Float32(1.0) / (Float32(1.0) + cute.math.exp(-v))

    @cute.jit
    def _key(self, v: Float32) -> Uint32:
        """An unsigned key that orders like the float (for finite values and infinities)."""
        bits = v.bitcast(Uint32)
        key = bits | Uint32(0x80000000)
        if (bits & Uint32(0x80000000)) != Uint32(0):
            key = ~bits
        return key

    @cute.jit
    def _best_slot(self, keys):
        """This lane's largest key and its slot; ties to the lower slot (lower expert id)."""
        best = keys[0]
        slot = Int32(0)
        for j in cutlass.range_constexpr(1, self.slots):
            if keys[j] > best:
                best = keys[j]
                slot = Int32(j)
        return best, slot

    @cute.jit
    def _route(self, logits, bias, weights, ids, top_k, n_group, topk_group, renormalize,
               has_bias, scaling):
        slots: cutlass.Constexpr = self.slots
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        m_count = logits.shape[0]
        n_count = logits.shape[1]
        choice = cute.make_rmem_tensor((slots,), Float32)
        keys = cute.make_rmem_tensor((slots,), Uint32)
        logit_regs = cute.make_rmem_tensor((slots,), Float32)
        bias_regs = cute.make_rmem_tensor((slots,), Float32)
        for m in cutlass.range(warp, m_count, self.warps, unroll=1):
            # Every load first, with no branch between them, so that they are all in flight
            # at once: one L2 round trip, not one per expert. (Without a bias the pointer is
            # a stand-in that is valid to read; the values go unused.)
            for j in cutlass.range_constexpr(slots):
                ec = cutlass.min(j * WARP + lane, n_count - 1)
                logit_regs[j] = logits[m, ec]
                bias_regs[j] = bias[0, ec].to(Float32)
            for j in cutlass.range_constexpr(slots):
                e = j * WARP + lane
                c = self._sigmoid(logit_regs[j])
                if has_bias != 0:
                    c = c + bias_regs[j]
                choice[j] = c
                keys[j] = Uint32(0)  # never picked: top_k <= the experts that remain
                if e < n_count:
                    keys[j] = self._key(c)

            if topk_group < n_group:
                self._mask_groups(choice, keys, lane, n_count, n_group, topk_group)

            my_id = self._pick(keys, lane, top_k)

            score = Float32(0.0)
            if lane < top_k:
                score = self._sigmoid(logits[m, my_id])
            weight = score
            if renormalize != 0:
                total = cute.arch.warp_reduction_sum(score)
                weight = score / (total + Float32(1e-20))
            if lane < top_k:
                weights[m, lane] = weight * scaling
                ids[m, lane] = my_id

    @cute.jit
    def _pick(self, keys, lane, top_k) -> Int32:
        """The top_k largest keys of the warp, largest first, ties to the lower expert id;
        lane i returns the i-th pick's expert id."""
        best, slot = self._best_slot(keys)
        my_id = Int32(0)
        for i in cutlass.range(top_k, unroll=1):
            top = cute.arch.warp_redux_sync(best, "umax")
            candidate = Uint32(0xFFFFFFFF)
            if best == top:
                candidate = (slot * WARP + lane).to(Uint32)
            pick = cute.arch.warp_redux_sync(candidate, "umin").to(Int32)
            if lane == i:
                my_id = pick
            if (pick & (WARP - 1)) == lane:
                for j in cutlass.range_constexpr(self.slots):
                    if slot == j:
                        keys[j] = Uint32(0)
                best, slot = self._best_slot(keys)
        return my_id

    @cute.jit
    def _warp_top2(self, first, second):
        """The warp's two best of the lanes' (best, second best): a butterfly of merges."""
        for step in cutlass.range_constexpr(5):
            offset = 16 >> step
            other_first = cute.arch.shuffle_sync_bfly(first, offset)
            other_second = cute.arch.shuffle_sync_bfly(second, offset)
            low = cute.arch.fmin(first, other_first)
            first = cute.arch.fmax(first, other_first)
            second = cute.arch.fmax(low, cute.arch.fmax(second, other_second))
        return first, second

    @cute.jit
    def _best_groups(self, group_key, lane, topk_group) -> Int32:
        """A bit mask of the topk_group groups with the largest keys (lane g holds group g's)."""
        kept = Int32(0)
        for _ in cutlass.range(topk_group, unroll=1):
            top = cute.arch.warp_redux_sync(group_key, "umax")
            holders = cute.arch.vote_ballot_sync(group_key == top)
            g = cute.arch.popc((holders & -holders) - 1)  # the lowest group holding it
            kept = kept | (Int32(1) << g)
            if lane == g:
                group_key = Uint32(0)
        return kept

    @cute.jit
    def _mask_groups(self, choice, keys, lane, n_count, n_group, topk_group):
        """Zero the keys of experts outside the topk_group best groups (n_group <= 32)."""
        group_size = n_count // n_group
        neg_inf = Float32(-float("inf"))
        group_key = Uint32(0)  # lane g holds group g's score as a key
        for g in cutlass.range(n_group, unroll=1):
            lo = g * group_size
            first = neg_inf
            second = neg_inf
            for j in cutlass.range_constexpr(self.slots):
                e = j * WARP + lane
                if e >= lo and e < lo + group_size:
                    c = choice[j]
                    if c > first:
                        second = first
                        first = c
                    elif c > second:
                        second = c
            first, second = self._warp_top2(first, second)
            if lane == g:
                group_key = self._key(first + second)
        kept = self._best_groups(group_key, lane, topk_group)
        for j in cutlass.range_constexpr(self.slots):
            e = j * WARP + lane
            g = cutlass.min(e // group_size, 31)
            if ((kept >> g) & 1) == 0:
                keys[j] = Uint32(0)


class LLBf16RouterBranchless(LLBf16Router):
    """The same routing with selects instead of branches, and a sigmoid from `ex2.approx`
    and `rcp.approx` (about 3e-7 relative error instead of IEEE exp and divide).

    In the first version each warp's lanes diverge at every expert slot (the compiler keeps
    the per-slot `if`s as branches: each pick's winner clears its slot through a binary
    search of branches, and rescans with one branch per slot), and a divergent branch
    costs far more than a select. Here every lane runs the same straight-line code: keys
    from a sign-mask flip, the per-lane maximum by a tree of selects (ties to the lower
    slot), the picked slot cleared by a select in every slot, group maxima with fmax/fmin.
    """

    @cute.jit
    def _sigmoid(self, v: Float32) -> Float32:
        e = cute.arch.exp2(v * Float32(-1.4426950408889634))  # 2^(-v log2 e) = e^-v
        return cute.arch.rcp_approx(Float32(1.0) + e)

    @cute.jit
    def _key(self, v: Float32) -> Uint32:
        bits = v.bitcast(Int32)
        flip = (bits >> 31) | Int32(-(2**31))  # all ones for negatives, the sign bit otherwise
        return (bits ^ flip).bitcast(Uint32)

    def _best_slot(self, keys):
        # Plain Python (not staged), building a tree of selects over (key, slot) pairs; the
        # left one of a pair holds the lower slots, so it wins ties.
        level = [(keys[j], Int32(j)) for j in range(self.slots)]
        while len(level) > 1:
            merged = []
            for a in range(0, len(level) - 1, 2):
                (ka, sa), (kb, sb) = level[a], level[a + 1]
                right = kb > ka
                merged.append((Uint32(cutlass.select_(right, kb, ka)), Int32(cutlass.select_(right, sb, sa))))
            if len(level) % 2:
                merged.append(level[-1])
            level = merged
        return level[0]

    @cute.jit
    def _pick(self, keys, lane, top_k) -> Int32:
        best, slot = self._best_slot(keys)
        my_id = Int32(0)
        for i in cutlass.range(top_k, unroll=1):
            top = cute.arch.warp_redux_sync(best, "umax")
            mine = (slot * WARP + lane).to(Uint32)
            candidate = Uint32(cutlass.select_(best == top, mine, Uint32(0xFFFFFFFF)))
            pick = cute.arch.warp_redux_sync(candidate, "umin").to(Int32)
            my_id = Int32(cutlass.select_(lane == i, pick, my_id))
            won = (pick & (WARP - 1)) == lane
            for j in cutlass.range_constexpr(self.slots):
                keys[j] = Uint32(cutlass.select_(won & (slot == j), Uint32(0), keys[j]))
            best, slot = self._best_slot(keys)
        return my_id

    @cute.jit
    def _mask_groups(self, choice, keys, lane, n_count, n_group, topk_group):
        group_size = n_count // n_group
        neg_inf = Float32(-float("inf"))
        group_of = [cutlass.min((j * WARP + lane) // group_size, 31) for j in range(self.slots)]
        group_key = Uint32(0)
        for g in cutlass.range(n_group, unroll=1):
            first = neg_inf
            second = neg_inf
            for j in cutlass.range_constexpr(self.slots):
                inside = (group_of[j] == g) & (j * WARP + lane < n_count)
                c = Float32(cutlass.select_(inside, choice[j], neg_inf))
                second = cute.arch.fmax(second, cute.arch.fmin(first, c))
                first = cute.arch.fmax(first, c)
            first, second = self._warp_top2(first, second)
            group_key = Uint32(cutlass.select_(lane == g, self._key(first + second), group_key))
        kept = self._best_groups(group_key, lane, topk_group)
        for j in cutlass.range_constexpr(self.slots):
            dropped = ((kept >> group_of[j]) & 1) == 0
            keys[j] = Uint32(cutlass.select_(dropped, Uint32(0), keys[j]))

