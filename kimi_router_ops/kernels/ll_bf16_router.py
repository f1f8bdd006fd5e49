"""The whole MoE router in one launch: a router GEMM kernel, then routing in the same grid.

    logits  = x · wᵀ                                  (the GEMM kernel's body, unchanged)
    scores  = sigmoid(logits);  choice = scores + bias
    groups  = n_group equal slices of the experts, scored by the sum of their two best
              choice values; the topk_group best are kept (ties to the lower group)
    ids     = the top_k best choice values among kept experts, best first, ties to the
              lower expert id
    weights = scores[ids] / (sum + 1e-20) if renormalize, times routed_scaling_factor

Every CTA runs the GEMM body of an LLBf16Dotprod or LLBf16Mma kernel, which stores the
logits and also publishes each one in a handoff buffer (kernels/handoff.py), where a word
is its own ready flag. Token m is then routed by one warp, of the m-th CTA from the end (or,
with more tokens than CTAs, the next warps): it polls its token's words until all are published, routes,
and empties them again for the next call. No fence, no counter: the routing starts one L2
round trip after the last logit is stored. The host gives each stream, and each call
captured into a graph, its own handoff buffer (csrc/cuda/router_handoff.cpp).

Routing, in one warp: lane l holds the choice values of experts l, l + 32, ... (up to
`n_max`, a compile-time bound), as floats and as order-preserving unsigned keys. Group
scores merge per-lane best pairs with shuffles. The top_k come from ranking a short list of
candidates (every expert at least as good as the top_k-th best lane maximum): each
candidate counts those ahead of it, in parallel, instead of top_k reductions in a row.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32, const_expr

from . import handoff as handoff_buffer

WARP = 32
# Per warp, 32 words each: lane maxima; candidates' keys, ids and scores; picks' ids, scores.
SCRATCH_ROWS = 6


class LLBf16Router:
    """One fused router kernel: `gemm` (a GEMM kernel object) plus the routing epilogue."""

    def __init__(self, gemm, n_max: int):
        if n_max > 32 * WARP:
            raise ValueError(f"n_max must be at most {32 * WARP}, got {n_max}")
        self.gemm = gemm
        self.n_max = n_max
        self.slots = (n_max + WARP - 1) // WARP  # choice values per lane
        self.warps = gemm.threads // WARP
        self.ctas_per_sm = gemm.ctas_per_sm

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # [M, K] bf16
        w: cute.Tensor,  # [N, K] bf16
        bias: cute.Tensor,  # [1, N] float32 or bfloat16; read only if has_bias
        logits: cute.Tensor,  # [M, N] float32, out
        weights: cute.Tensor,  # [M, top_k] float32, out
        ids: cute.Tensor,  # [M, top_k] int32, out
        handoff: cute.Tensor,  # [M, N] int32, EMPTY before the call and after it
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
        # The routing's scratch, after the GEMM's own shared memory.
        shape["smem"] += 4 * SCRATCH_ROWS * WARP * self.warps + 16
        # As many CTAs per SM as the GEMM kernel alone gets: the routing's registers must not
        # lower the GEMM's occupancy (with 32 experts a lane they would halve the dot
        # product's, and Kimi-K3's 224 CTAs would run in two waves). The carveout is the
        # driver default; naming it keeps the build from querying a GPU.
        self.kernel(
            xv, wv, bias, logits, weights, ids, handoff,
            top_k, n_group, topk_group, renormalize, has_bias, scaling,
        ).launch(**shape, stream=stream, use_pdl=self.gemm.pdl,
                 min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(
        self,
        xv: cute.Tensor,
        wv: cute.Tensor,
        bias: cute.Tensor,
        logits: cute.Tensor,
        weights: cute.Tensor,
        ids: cute.Tensor,
        handoff: cute.Tensor,
        top_k: Int32,
        n_group: Int32,
        topk_group: Int32,
        renormalize: Int32,
        has_bias: Int32,
        scaling: Float32,
    ):
        self.gemm.body(xv, wv, logits, handoff)
        smem = cutlass.utils.SmemAllocator()
        scratch = smem.allocate_tensor(Uint32, cute.make_layout((WARP, SCRATCH_ROWS, self.warps)), 16)
        self._route(handoff, bias, weights, ids, top_k, n_group, topk_group, renormalize,
                    has_bias, scaling, scratch)

    @cute.jit
    def _route(self, handoff, bias, weights, ids, top_k, n_group, topk_group, renormalize,
               has_bias, scaling, scratch):
        """Route this warp's tokens. Token m goes to warp m // ctas of the m % ctas-th CTA
        from the end: one warp per token and SM while M <= CTAs (each has a scheduler to
        itself). From the end, because a routing warp waits for the other CTAs: CTAs start
        in index order, so the last ones start after all the others have (the premise of
        every single-pass scan), and no CTA waits for one that cannot start."""
        slots: cutlass.Constexpr = self.slots
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bx, by, bz = cute.arch.block_idx()
        gx, gy, gz = cute.arch.grid_dim()
        ctas = gx * gy * gz
        unit = warp * ctas + (ctas - 1 - (bx + gx * (by + gy * bz)))
        m_count = handoff.shape[0]
        n_count = handoff.shape[1]
        scores = cute.make_rmem_tensor((slots,), Float32)
        choice = cute.make_rmem_tensor((slots,), Float32)  # the bias, then score + bias
        keys = cute.make_rmem_tensor((slots,), Uint32)
        for m in cutlass.range(unit, m_count, ctas * self.warps, unroll=1):
            # Every load first, with no branch between them, so that they are all in flight
            # at once: one L2 round trip, not one per expert. (Without a bias the pointer is
            # a stand-in, never read: a uniform branch.)
            choice.fill(0.0)
            if has_bias != 0:
                for j in cutlass.range_constexpr(slots):
                    choice[j] = bias[0, cutlass.min(j * WARP + lane, n_count - 1)].to(Float32)
            for j in cutlass.range_constexpr(slots):
                ec = cutlass.min(j * WARP + lane, n_count - 1)
                scores[j] = handoff_buffer.poll(handoff, m, ec).bitcast(Float32)
            # Until every logit of this token has been published: reload what is not.
            while cute.arch.vote_any_sync(self._pending(scores)):
                for j in cutlass.range_constexpr(slots):
                    if scores[j].bitcast(Int32) == Int32(handoff_buffer.EMPTY):
                        ec = cutlass.min(j * WARP + lane, n_count - 1)
                        scores[j] = handoff_buffer.poll(handoff, m, ec).bitcast(Float32)
            # Empty again for the next call (which polls only after its PDL wait, when this
            # grid has finished and its stores are visible).
            for j in cutlass.range_constexpr(slots):
                if j * WARP + lane < n_count:
                    handoff[m, j * WARP + lane] = Int32(handoff_buffer.EMPTY)
            for j in cutlass.range_constexpr(slots):
                s = self._sigmoid(scores[j])
                scores[j] = s
                c = s + choice[j]
                choice[j] = c
                # Key 0 is "no expert": never picked (top_k <= the experts that remain).
                keys[j] = Uint32(cutlass.select_(j * WARP + lane < n_count, self._key(c), Uint32(0)))

            if topk_group < n_group:
                if n_count == n_group * WARP:
                    self._mask_slot_groups(choice, keys, lane, n_group, topk_group)
                else:
                    self._mask_groups(choice, keys, lane, n_count, n_group, topk_group)

            my_id, score = self._rank_select(keys, scores, lane, top_k, scratch[None, None, warp])
            weight = score
            if renormalize != 0:
                total = cute.arch.warp_reduction_sum(score)
                weight = score / (total + Float32(1e-20))
            if lane < top_k:
                weights[m, lane] = weight * scaling
                ids[m, lane] = my_id

    @cute.jit
    def _sigmoid(self, v: Float32) -> Float32:
        # ex2.approx and rcp.approx: about 3e-7 relative error, a handful of instructions
        # instead of IEEE exp and divide (each token's routing runs on one warp, so its
        # latency is the length of its instruction chain).
        e = cute.arch.exp2(v * Float32(-1.4426950408889634))  # 2^(-v log2 e) = e^-v
        return cute.arch.rcp_approx(Float32(1.0) + e)

    @cute.jit
    def _key(self, v: Float32) -> Uint32:
        """An unsigned key that orders like the float (finite values and infinities): the
        sign bit set for positives, every bit flipped for negatives."""
        bits = v.bitcast(Int32)
        flip = (bits >> 31) | Int32(-(2**31))
        return (bits ^ flip).bitcast(Uint32)

    @cute.jit
    def _pending(self, values) -> cutlass.Boolean:
        pending = values[0].bitcast(Int32) == Int32(handoff_buffer.EMPTY)
        for j in cutlass.range_constexpr(1, self.slots):
            pending = pending | (values[j].bitcast(Int32) == Int32(handoff_buffer.EMPTY))
        return pending

    @cute.jit
    def _rank_select(self, keys, scores, lane, top_k, scratch):
        """The warp's top_k largest keys, largest first, ties to the lower expert id, by
        ranking a short list of candidates instead of picking one after another. Lane i
        returns the i-th expert id and its score.

        Let t be the top_k-th largest of the lanes' maxima: at least top_k experts have a
        key >= t, so every expert of the top_k does. Those candidates (usually a few more
        than top_k) go to shared memory in expert-id order; each lane takes one and counts
        the candidates ahead of it, which is its place. All of it is independent work on
        32 lanes, not a chain of top_k warp reductions. More than 32 candidates (many equal
        keys) fall back to the picks."""
        slots: cutlass.Constexpr = self.slots
        maxima = scratch[None, 0]
        cand_key = scratch[None, 1]
        cand_id = scratch[None, 2]
        cand_score = scratch[None, 3]
        pick_id = scratch[None, 4]
        pick_score = scratch[None, 5]
        cute.arch.sync_warp()  # the previous token's reads of the scratch are done
        lane_max = keys[0]
        for j in cutlass.range_constexpr(1, slots):
            lane_max = Uint32(cutlass.select_(keys[j] > lane_max, keys[j], lane_max))
        maxima[lane] = lane_max
        cute.arch.sync_warp()
        at_least = Int32(0)  # lanes whose maximum is >= this lane's
        for l in cutlass.range_constexpr(WARP):
            at_least = at_least + Int32(cutlass.select_(maxima[l] >= lane_max, Int32(1), Int32(0)))
        t = cute.arch.warp_redux_sync(
            Uint32(cutlass.select_(at_least >= top_k, lane_max, Uint32(0))), "umax")
        t = Uint32(cutlass.select_(t == Uint32(0), Uint32(1), t))  # never key 0 (no expert)
        below = cute.arch.lanemask_lt()
        count = Int32(0)
        for j in cutlass.range_constexpr(slots):
            is_candidate = keys[j] >= t
            ballot = cute.arch.vote_ballot_sync(is_candidate)
            pos = count + cute.arch.popc(ballot & below)
            if is_candidate & (pos < WARP):
                cand_key[pos] = keys[j]
                cand_id[pos] = Uint32(j * WARP + lane)
                cand_score[pos] = scores[j].bitcast(Uint32)
            count = count + cute.arch.popc(ballot)
        my_id, my_score = Int32(0), Float32(0.0)
        if count <= WARP:
            cute.arch.sync_warp()
            mine = cand_key[lane]
            ahead = Int32(0)
            for d in cutlass.range_constexpr(WARP):
                other = cand_key[d]
                beats = (Int32(d) < count) & ((other > mine) | ((other == mine) & (d < lane)))
                ahead = ahead + Int32(cutlass.select_(beats, Int32(1), Int32(0)))
            if (lane < count) & (ahead < top_k):
                pick_id[ahead] = cand_id[lane]
                pick_score[ahead] = cand_score[lane]
            cute.arch.sync_warp()
            # Lanes past top_k hold no pick (zero, as the picks give them: renormalizing
            # sums over all lanes).
            my_id = Int32(cutlass.select_(lane < top_k, pick_id[lane].bitcast(Int32), Int32(0)))
            my_score = Float32(cutlass.select_(lane < top_k, pick_score[lane].bitcast(Float32), Float32(0.0)))
        else:
            my_id, my_score = self._pick(keys, scores, lane, top_k)
        return my_id, my_score

    @cute.jit
    def _lane_top2(self, keys, scores, after_key, after_slot):
        """This lane's two best experts that come after (after_key, after_slot) in the order
        (key descending, slot ascending), as (key, slot, score) each; key 0: none."""
        first_key, first_slot, first_score = Uint32(0), Int32(0), Float32(0.0)
        second_key, second_slot, second_score = Uint32(0), Int32(0), Float32(0.0)
        for j in cutlass.range_constexpr(self.slots):
            later = (keys[j] < after_key) | ((keys[j] == after_key) & (Int32(j) > after_slot))
            k = Uint32(cutlass.select_(later, keys[j], Uint32(0)))
            # Strictly greater: of equal keys the lower slot (lower expert id) stays ahead.
            beats_first = k > first_key
            beats_second = k > second_key
            second_key = Uint32(cutlass.select_(beats_first, first_key, cutlass.select_(beats_second, k, second_key)))
            second_slot = Int32(cutlass.select_(beats_first, first_slot, cutlass.select_(beats_second, Int32(j), second_slot)))
            second_score = Float32(cutlass.select_(beats_first, first_score, cutlass.select_(beats_second, scores[j], second_score)))
            first_key = Uint32(cutlass.select_(beats_first, k, first_key))
            first_slot = Int32(cutlass.select_(beats_first, Int32(j), first_slot))
            first_score = Float32(cutlass.select_(beats_first, scores[j], first_score))
        return first_key, first_slot, first_score, second_key, second_slot, second_score

    @cute.jit
    def _pick(self, keys, scores, lane, top_k):
        """The warp's top_k largest keys, largest first, ties to the lower expert id. Lane i
        returns the i-th pick's expert id and its score.

        Each lane offers its best remaining expert and keeps the next one ready, so a pick
        is two `redux.sync`s and a few selects: the winner moves its second to the front.
        Only when a lane has given up both and has more does the warp rescan (one uniform
        branch; rare, since a lane holds 1/32 of the experts)."""
        first_key, first_slot, first_score, second_key, second_slot, second_score = self._lane_top2(
            keys, scores, Uint32(0xFFFFFFFF), Int32(-1))
        left = Int32(0)  # experts of this lane not yet picked
        for j in cutlass.range_constexpr(self.slots):
            left = left + Int32(cutlass.select_(keys[j] != Uint32(0), Int32(1), Int32(0)))
        last_key, last_slot = Uint32(0xFFFFFFFF), Int32(-1)
        my_id, my_score = Int32(0), Float32(0.0)
        for i in cutlass.range(top_k, unroll=1):
            top = cute.arch.warp_redux_sync(first_key, "umax")
            mine = (first_slot * WARP + lane).to(Uint32)
            candidate = Uint32(cutlass.select_(first_key == top, mine, Uint32(0xFFFFFFFF)))
            pick = cute.arch.warp_redux_sync(candidate, "umin").to(Int32)
            winner = pick & (WARP - 1)
            score = cute.arch.shuffle_sync(first_score, winner)
            my_id = Int32(cutlass.select_(lane == i, pick, my_id))
            my_score = Float32(cutlass.select_(lane == i, score, my_score))
            won = winner == lane
            last_key = Uint32(cutlass.select_(won, first_key, last_key))
            last_slot = Int32(cutlass.select_(won, first_slot, last_slot))
            first_key = Uint32(cutlass.select_(won, second_key, first_key))
            first_slot = Int32(cutlass.select_(won, second_slot, first_slot))
            first_score = Float32(cutlass.select_(won, second_score, first_score))
            second_key = Uint32(cutlass.select_(won, Uint32(0), second_key))
            left = left - Int32(cutlass.select_(won, Int32(1), Int32(0)))
            if cute.arch.vote_any_sync((first_key == Uint32(0)) & (left > 0)):
                first_key, first_slot, first_score, second_key, second_slot, second_score = self._lane_top2(
                    keys, scores, last_key, last_slot)
        return my_id, my_score

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
    def _mask_slot_groups(self, choice, keys, lane, n_group, topk_group):
        """Groups of exactly 32 experts (DeepSeek-V3: 256 experts, 8 groups): group g is slot
        g of every lane, so all group scores come from independent butterflies at once, and
        a group is kept when fewer than topk_group groups beat it (ties to the lower group)."""
        neg_inf = Float32(-float("inf"))
        group_key = Uint32(0)  # lane g: group g's score as a key
        for j in cutlass.range_constexpr(self.slots):
            first, second = self._warp_top2(choice[j], neg_inf)
            group_key = Uint32(cutlass.select_(lane == j, self._key(first + second), group_key))
        group_key = Uint32(cutlass.select_(lane < n_group, group_key, Uint32(0)))
        for j in cutlass.range_constexpr(self.slots):
            mine = cute.arch.shuffle_sync(group_key, j)
            beaten_by = cute.arch.vote_ballot_sync(
                (lane < n_group) & ((group_key > mine) | ((group_key == mine) & (lane < j))))
            kept = (cute.arch.popc(beaten_by) < topk_group) & (j < n_group)
            keys[j] = Uint32(cutlass.select_(kept, keys[j], Uint32(0)))

    @cute.jit
    def _best_groups(self, group_key, lane, topk_group) -> Int32:
        """A bit mask of the topk_group groups with the largest keys (lane g holds group g's)."""
        kept = Int32(0)
        for _ in cutlass.range(topk_group, unroll=1):
            top = cute.arch.warp_redux_sync(group_key, "umax")
            holders = cute.arch.vote_ballot_sync(group_key == top)
            g = cute.arch.popc((holders & -holders) - 1)  # the lowest group holding it
            kept = kept | (Int32(1) << g)
            group_key = Uint32(cutlass.select_(lane == g, Uint32(0), group_key))
        return kept

    @cute.jit
    def _mask_groups(self, choice, keys, lane, n_count, n_group, topk_group):
        """Any equal groups (n_group <= 32): zero the keys of experts outside the topk_group
        best groups, one group score after the other."""
        group_size = n_count // n_group
        neg_inf = Float32(-float("inf"))
        group_key = Uint32(0)
        for g in cutlass.range(n_group, unroll=1):
            lo = g * group_size
            first = neg_inf
            second = neg_inf
            for j in cutlass.range_constexpr(self.slots):
                e = j * WARP + lane
                c = Float32(cutlass.select_((e >= lo) & (e < lo + group_size), choice[j], neg_inf))
                second = cute.arch.fmax(second, cute.arch.fmin(first, c))
                first = cute.arch.fmax(first, c)
            first, second = self._warp_top2(first, second)
            group_key = Uint32(cutlass.select_(lane == g, self._key(first + second), group_key))
        kept = self._best_groups(group_key, lane, topk_group)
        for j in cutlass.range_constexpr(self.slots):
            group = cutlass.min((j * WARP + lane) // group_size, 31)
            keys[j] = Uint32(cutlass.select_(((kept >> group) & 1) == 0, Uint32(0), keys[j]))
