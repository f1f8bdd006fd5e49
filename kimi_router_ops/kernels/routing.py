"""MoE routing of one token by one warp: the shared part of the fused router
(kernels/router_fused.py) and the standalone routing op (kernels/moe_routing.py).

    scores  = sigmoid(logits), or softmax(logits) over the token's N experts
    choice  = scores + bias (a bias that is not finite makes every weight NaN)
    groups  = n_group equal slices of the experts, scored by the sum of their two best
              choice values (with scoring: their best, as DeepSeek-V2's group-limited
              greedy); the topk_group best are kept (ties to the lower group)
    ids     = the top_k best choice values among kept experts, best first, ties to the
              lower expert id
    weights = scores[ids] / (sum + 1e-20) if renormalize, times routed_scaling_factor

Lane l holds the choice values of experts l, l + 32, ... (up to `n_max`, a compile-time
bound), as floats and as order-preserving unsigned keys. Groups of 32 experts take their
two best through shared memory. The top_k come from ranking a short list of candidates
(every expert at least as good as the top_k-th best lane maximum, or as the least of the
kept groups' two best): each candidate counts those ahead of it, in parallel, instead of
top_k reductions in a row.

One warp runs the whole chain, so its length is the latency: counts are trees of adds
(kept as trees, see _add) of compares of as few instructions as the values allow, and
nothing waits on a string of `redux.sync`s (docs/kernel-notes.md).

A subclass says which warp routes which tokens (_routing_unit) and where a token's scores
come from (_gather).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from . import handoff as handoff_buffer

WARP = 32
# A routing warp's shared memory, rows of 32 words. The ranking: lane maxima (row 0, then
# the picks' scores for the renormalizing sum), candidates as 64-bit words (rows 1-2), their
# scores (3), the picks' ids and scores (4, 5). Before it, group scores use rows 0-8 as
# GROUP_CHUNK rows of GROUP_ROW words, one group's 32 choice values a row (36 words keeps
# each row 16-byte aligned and spreads the rows over the banks), and row 9 for the groups'
# scores.
SCRATCH_ROWS = 10
GROUP_CHUNK = 8
GROUP_ROW = 36
GROUP_KEYS_ROW = 9


def _tree(values, combine):
    """Combine a list in a balanced tree: log2(n) dependent steps instead of n - 1."""
    values = list(values)
    while len(values) > 1:
        values = [combine(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)] + (
            [values[-1]] if len(values) % 2 else []
        )
    return values[0]


def _tree_sum(values):
    return _tree(values, lambda a, b: a + b)


@dsl_user_op
def _add(a, b, *, loc=None, ip=None) -> Int32:
    """a + b that LLVM cannot reassociate: its reassociation pass turns a tree of integer
    adds into one long chain (and ptxas then into a select after each add)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(a).ir_value(loc=loc, ip=ip), Int32(b).ir_value(loc=loc, ip=ip)],
        "add.s32 $0, $1, $2;", "=r,r,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def _count(conditions):
    """How many of the conditions hold, as a tree of adds: log2(n) steps deep."""
    return _tree([Int32(cutlass.select_(c, Int32(1), Int32(0))) for c in conditions], _add)


def _top2(values):
    """The largest and second largest of 2^n floats (equal values count twice): a tree of
    pairwise max/min, then merges of (first, second) pairs."""
    firsts = [cute.arch.fmax(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    seconds = [cute.arch.fmin(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    while len(firsts) > 1:
        pairs = range(0, len(firsts), 2)
        seconds = [cute.arch.fmax(cute.arch.fmin(firsts[i], firsts[i + 1]),
                                  cute.arch.fmax(seconds[i], seconds[i + 1])) for i in pairs]
        firsts = [cute.arch.fmax(firsts[i], firsts[i + 1]) for i in pairs]
    return firsts[0], seconds[0]


@dsl_user_op
def _prefetch_bulk_l2(address, size, *, loc=None, ip=None):
    """cp.async.bulk.prefetch.L2: the copy engine brings [address, address + size) into L2
    (both 16-byte aligned); the thread goes on at once."""
    llvm.inline_asm(None, [Int64(address).ir_value(loc=loc, ip=ip), Int32(size).ir_value(loc=loc, ip=ip)],
                    "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                    loc=loc, ip=ip)


def _umax(a, b):
    return Uint32(cutlass.select_(a > b, a, b))


@dsl_user_op
def _one_if_ge(a, b, *, loc=None, ip=None) -> Float32:
    """1.0 if a >= b, else 0.0 (false when either is NaN): one `set` instruction, where a
    compare, a select and an integer add took three."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
        "set.ge.f32.f32 $0, $1, $2;", "=f,f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def _minus_one_if_above(a, b, *, loc=None, ip=None) -> Int32:
    """-1 if a > b as unsigned 64-bit numbers, else 0: the borrow of b - a, three
    instructions (a 64-bit compare, a select and an add took five or six)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int64(a).ir_value(loc=loc, ip=ip), Int64(b).ir_value(loc=loc, ip=ip)],
        "{ .reg .u32 al, ah, bl, bh, d;\n"
        "mov.b64 {al, ah}, $1;\n"
        "mov.b64 {bl, bh}, $2;\n"
        "sub.cc.u32 d, bl, al;\n"
        "subc.cc.u32 d, bh, ah;\n"
        "subc.u32 $0, bh, bh; }",
        "=r,l,l",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


def _count_above(values, mine):
    """How many of the unsigned 64-bit values are above mine, as a tree of adds."""
    return Int32(0) - _tree([_minus_one_if_above(v, mine) for v in values], _add)


class WarpRouting:
    """The routing of `warps` warps a CTA, one token a warp at a time, up to `n_max` experts."""

    def __init__(self, n_max: int, warps: int):
        if n_max > 32 * WARP:
            raise ValueError(f"n_max must be at most {32 * WARP}, got {n_max}")
        self.n_max = n_max
        self.slots = (n_max + WARP - 1) // WARP  # choice values per lane
        self.warps = warps

    def scratch_bytes(self) -> int:
        return 4 * SCRATCH_ROWS * WARP * self.warps + 16

    @cute.jit
    def _scratch(self):
        smem = cutlass.utils.SmemAllocator()
        return smem.allocate_tensor(Uint32, cute.make_layout((WARP, SCRATCH_ROWS, self.warps)), 16)

    @cute.jit
    def _prefetch_bias(self, bias, m_count):
        """Each routing warp asks L2 for the bias, so that its loads after the poll hit L2:
        one copy-engine prefetch from lane 0 (one prefetch.global.L2 a lane instead, on each
        128-byte line, measured slower: docs/kernel-notes.md). The bias is a model
        parameter, read-only here like the weights, and a prefetch returns nothing: it is
        safe before the PDL wait, and it does not move the routing warp's own loads (issued
        earlier, those made its first poll leave too soon and miss: step 31)."""
        unit, _ = self._routing_unit()
        if unit < m_count:
            start = handoff_buffer.element_ptr(bias, 0, 0).toint()
            size = bias.shape[1] * (bias.element_type.width // 8)
            # The 16-byte units inside the bias (all of it, when it is 16-byte aligned and N
            # a multiple of 4 floats or 8 bf16, as in every real router).
            first = (start + 15) & Int64(-16)
            last = (start + size) & Int64(-16)
            if (cute.arch.lane_idx() == 0) & (last > first):
                _prefetch_bulk_l2(first, Int32(last - first))

    @cute.jit
    def _route(self, source, bias, weights, ids, input_ids, hash_table, counts, top_k, n_group, topk_group,
               renormalize, has_bias, scoring, scaling, ids_words, table_words,
               shared_experts, shared_weight, id_words, has_counts, scratch):
        """Route this warp's tokens: m = unit, unit + stride, ... (_routing_unit) of the
        [M, N] `source` that _gather reads the scores from; by their rows of hash_table
        where table_words != 0 (_hashed). Lane i < top_k stores the i-th pick; the next
        `shared_experts` lanes the shared experts' slots (ids N, N + 1, ..., weight
        `shared_weight`); each stored id counts once in `counts` where has_counts != 0."""
        slots: cutlass.Constexpr = self.slots
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        unit, stride = self._routing_unit()
        m_count = source.shape[0]
        n_count = source.shape[1]
        scores = cute.make_rmem_tensor((slots,), Float32)
        choice = cute.make_rmem_tensor((slots,), Float32)  # the bias, then score + bias
        keys = cute.make_rmem_tensor((slots,), Uint32)
        for m in cutlass.range(unit, m_count, stride, unroll=1):
            # A hash-routed token's experts: looked up first, so that the two dependent loads
            # (its id, then its row of the table) overlap the wait for its scores.
            hashed_expert, hashed_ok = Int32(0), Int32(0)
            if table_words != 0:  # the same on every lane: a uniform branch
                hashed_expert, hashed_ok = self._hash_lookup(m, lane, n_count, top_k, input_ids, hash_table,
                                                             ids_words, table_words)
            # All experts present (every real router's N): no clamped indices, so each load
            # and store is one instruction at an immediate offset from the lane's address.
            if n_count == slots * WARP:
                self._gather(source, bias, m, lane, n_count, has_bias, scoring, scores, choice, True)
            else:
                self._gather(source, bias, m, lane, n_count, has_bias, scoring, scores, choice, False)
            if scoring == handoff_buffer.SOFTMAX:  # the same on every lane: a uniform branch
                self._softmax(scores, lane, n_count)
            # choice holds the bias here: b - b is 0 for a finite b, NaN for a NaN or ±inf one.
            unfinite = _tree_sum([choice[j] - choice[j] for j in range(slots)])
            for j in cutlass.range_constexpr(slots):
                c = scores[j] + choice[j]
                choice[j] = c
                # Key 0 is "no expert": never picked (top_k <= the experts that remain).
                keys[j] = Uint32(cutlass.select_(j * WARP + lane < n_count, self._key(c), Uint32(0)))

            my_id, score = Int32(0), Float32(0.0)
            if table_words != 0:  # the same on every lane: a uniform branch
                my_id, score = self._hashed(scores, lane, top_k, hashed_expert, hashed_ok)
            else:
                bound = Uint32(0)  # a key that at least top_k experts reach, if known; 0: not
                if topk_group < n_group:
                    if n_count == n_group * WARP:
                        bound = self._mask_slot_groups(choice, keys, lane, top_k, n_group, topk_group,
                                                       scoring, scratch[None, None, warp])
                    else:
                        self._mask_groups(choice, keys, lane, n_count, n_group, topk_group, scoring)
                my_id, score = self._rank_select(keys, scores, lane, top_k, bound, scratch[None, None, warp])
            scale = scaling
            if renormalize != 0:
                # Lanes past top_k hold 0: the sum of all 32, as a tree, is the picks' sum.
                picked = scratch[None, 0, warp]
                cute.arch.sync_warp()  # the ranking's reads of this row are done
                picked[lane] = score.bitcast(Uint32)
                cute.arch.sync_warp()
                total = _tree_sum([picked[i].bitcast(Float32) for i in range(WARP)])
                scale = scaling * cute.arch.rcp_approx(total + Float32(1e-20))
            # A bias that is not finite would send every token to valid-looking experts (all
            # equal keys: the lowest ids): the weights say so instead, NaN. Hash routing
            # does not read the bias.
            bias_bad = cute.arch.vote_any_sync(  # (== is false for a NaN)
                Int32(cutlass.select_(unfinite == Float32(0.0), Int32(0), Int32(1))) != 0) & (table_words == 0)
            scale = Float32(cutlass.select_(bias_bad, Float32(float("nan")), scale))
            if lane < top_k + shared_experts:
                shared = lane >= top_k
                expert = Int32(cutlass.select_(shared, n_count + lane - top_k, my_id))
                weights[m, lane] = Float32(cutlass.select_(shared, shared_weight, score * scale))
                ids[m, lane * id_words] = expert
                if id_words == 2:  # int64 ids: the high word (ids are never negative)
                    ids[m, lane * 2 + 1] = Int32(0)
                if has_counts != 0:  # an MoE dispatch's histogram: one relaxed atomic add
                    cute.arch.atomic_add(handoff_buffer.element_ptr(counts, 0, expert), Int32(1),
                                         sem="relaxed", scope="gpu")

    @cute.jit
    def _hash_lookup(self, m, lane, n_count, top_k, input_ids, hash_table, ids_words, table_words):
        """Hash routing (DeepSeek-V4's first layers): lane i < top_k's expert is
        hash_table[input_ids[m], i]; returns it and 1 if it is valid (else expert 0 and 0). Both
        tensors are int32 words, an element `words` of them (an int64's high word must be 0).
        A token outside the table, or an expert outside [0, N), is not valid: nothing is read
        outside the table."""
        token = input_ids[0, m * ids_words]
        high = input_ids[0, m * ids_words + ids_words - 1]  # the token itself when int32
        token_ok = (token >= 0) & (token < hash_table.shape[0]) & ((ids_words == 1) | (high == 0))
        row = Int32(cutlass.select_(token_ok, token, Int32(0)))
        column = cutlass.min(lane, top_k - 1) * table_words  # lanes past top_k: a copy, unused
        expert = hash_table[row, column]
        expert_high = hash_table[row, column + table_words - 1]
        ok = token_ok & (expert >= 0) & (expert < n_count) & ((table_words == 1) | (expert_high == 0))
        return Int32(cutlass.select_(ok, expert, Int32(0))), Int32(cutlass.select_(ok, Int32(1), Int32(0)))

    @cute.jit
    def _hashed(self, scores, lane, top_k, expert, ok):
        """Lane i < top_k's pick, its looked-up expert (_hash_lookup), and that expert's score;
        an expert that is not valid has a NaN score, so the token's weights say it was routed
        wrong."""
        # Lane expert % 32 holds the expert's score in its slot expert // 32.
        score = Float32(0.0)
        for j in cutlass.range_constexpr(self.slots):
            held = cute.arch.shuffle_sync(scores[j], expert % WARP)
            score = Float32(cutlass.select_(expert // WARP == j, held, score))
        score = Float32(cutlass.select_(ok != 0, score, Float32(float("nan"))))
        # Lanes past top_k hold no pick (zero: renormalizing sums over all lanes).
        return (Int32(cutlass.select_(lane < top_k, expert, Int32(0))),
                Float32(cutlass.select_(lane < top_k, score, Float32(0.0))))

    @cute.jit
    def _softmax(self, values, lane, n_count):
        """values (this token's logits, lane l holding experts l, l + 32, ...) become their
        softmax over the N experts, in fp32: exp(v - max) / sum. The max is one `redux.sync`
        on the order-preserving keys; the sum a tree a lane, then a butterfly (every lane
        ends with the same bits, in a fixed order: deterministic). Lanes' slots past N
        (clamped copies of the last expert) count for nothing."""
        slots: cutlass.Constexpr = self.slots
        neg_inf = Float32(-float("inf"))
        present = [j * WARP + lane < n_count for j in range(slots)]
        lane_max = _tree([Float32(cutlass.select_(present[j], values[j], neg_inf)) for j in range(slots)],
                         cute.arch.fmax)
        top = self._value(Uint32(cute.arch.warp_redux_sync(self._key(lane_max), "umax")))
        for j in cutlass.range_constexpr(slots):
            e = cute.arch.exp2((values[j] - top) * Float32(1.4426950408889634))
            values[j] = Float32(cutlass.select_(present[j], e, Float32(0.0)))
        total = _tree_sum([values[j] for j in range(slots)])
        for step in cutlass.range_constexpr(5):
            total = total + cute.arch.shuffle_sync_bfly(total, 16 >> step)
        inverse = cute.arch.rcp_approx(total)
        for j in cutlass.range_constexpr(slots):
            values[j] = values[j] * inverse

    @cute.jit
    def _load_bias(self, bias, lane, n_count, has_bias, choice, exact: cutlass.Constexpr):
        """The token's choice values start as its experts' biases (0 without a bias, whose
        pointer is then a stand-in, never read: a uniform branch)."""
        choice.fill(0.0)
        if has_bias != 0:
            for j in cutlass.range_constexpr(self.slots):
                choice[j] = bias[0, self._expert(j, lane, n_count, exact)].to(Float32)

    @cute.jit
    def _expert(self, j, lane, n_count, exact: cutlass.Constexpr):
        """Expert j * 32 + lane, clamped to the last one unless all are known to exist."""
        e = j * WARP + lane
        if const_expr(not exact):
            e = cutlass.min(e, n_count - 1)
        return e

    @cute.jit
    def _key(self, v: Float32) -> Uint32:
        """An unsigned key that orders like the float (finite values and infinities): the
        sign bit set for positives, every bit flipped for negatives."""
        bits = v.bitcast(Int32)
        flip = (bits >> 31) | Int32(-(2**31))
        return (bits ^ flip).bitcast(Uint32)

    @cute.jit
    def _ranked(self, key: Uint32, index) -> cutlass.Int64:
        """(key, ~index) as one unsigned 64-bit word: ordered by key, ties to the lower index."""
        return (cutlass.Int64(key.bitcast(Int32)) << 32) | cutlass.Int64(~Uint32(index))

    @cute.jit
    def _value(self, key: Uint32) -> Float32:
        """The float a key came from (_key's inverse); key 0, "no expert", gives a NaN,
        which no compare counts."""
        flip = (~(key.bitcast(Int32) >> 31)) | Int32(-(2**31))
        return (key.bitcast(Int32) ^ flip).bitcast(Float32)

    @cute.jit
    def _rank_select(self, keys, scores, lane, top_k, bound, scratch):
        """The warp's top_k largest keys, largest first, ties to the lower expert id, by
        ranking a short list of candidates instead of picking one after another. Lane i
        returns the i-th expert id and its score.

        Let t be the top_k-th largest of the lanes' maxima: at least top_k experts have a
        key >= t, so every expert of the top_k does. Those candidates (usually a few more
        than top_k) go to shared memory; each lane takes one and counts the candidates
        ahead of it, which is its place. All of it is independent work on 32 lanes, not a
        chain of top_k warp reductions. More than 32 candidates (many equal keys) fall back
        to the picks. A nonzero `bound` (a key at least top_k experts reach: the group phase
        knows one) serves as t and saves the count of the lanes' maxima."""
        slots: cutlass.Constexpr = self.slots
        maxima = scratch[None, 0]
        # Candidates as one unsigned 64-bit word, (key, ~id): one compare orders them, ties
        # to the lower id. Word 0 is no candidate: every real one is above it (key >= 1).
        cand = cute.make_tensor(cute.recast_ptr(scratch[None, 1].iterator, dtype=cutlass.Int64),
                                cute.make_layout(WARP))  # rows 1 and 2
        cand_score = scratch[None, 3]
        pick_id = scratch[None, 4]
        pick_score = scratch[None, 5]
        cute.arch.sync_warp()  # the previous token's reads of the scratch are done
        lane_max = _tree([keys[j] for j in range(slots)], _umax)
        # The maxima compared as floats, where one `set` a lane gives 1.0 or 0.0 (keys and
        # floats order alike: choice values are never -0.0, and NaNs only undercount, which
        # lowers t, still a valid bound).
        t = bound
        cand[lane] = cutlass.Int64(0)  # the slots no candidate fills (before the syncs below)
        if bound == Uint32(0):  # the same on every lane: a uniform branch
            lane_max_value = self._value(lane_max)
            maxima[lane] = lane_max_value.bitcast(Uint32)
            cute.arch.sync_warp()
            at_least = _tree_sum([_one_if_ge(maxima[l].bitcast(Float32), lane_max_value)
                                  for l in range(WARP)])  # lanes with a max >= ours
            t = Uint32(cute.arch.warp_redux_sync(
                Uint32(cutlass.select_(at_least >= top_k.to(Float32), lane_max, Uint32(0))), "umax"))
        else:
            cute.arch.sync_warp()
        t = Uint32(cutlass.select_(t == Uint32(0), Uint32(1), t))  # never key 0 (no expert)
        # Each lane's candidates go after those of the lanes below it: an exclusive prefix
        # sum of the lanes' counts, one ballot per bit of the count.
        is_candidate = [keys[j] >= t for j in range(slots)]
        mine_count = _count(is_candidate)
        below = cute.arch.lanemask_lt()
        pos = Int32(0)
        count = Int32(0)
        for b in cutlass.range_constexpr(slots.bit_length()):
            bits = cute.arch.vote_ballot_sync(((mine_count >> b) & 1) != 0)
            pos = pos + (cute.arch.popc(bits & below) << b)
            count = count + (cute.arch.popc(bits) << b)
        for j in cutlass.range_constexpr(slots):
            if is_candidate[j] & (pos < WARP):
                cand[pos] = self._ranked(keys[j], j * WARP + lane)
                cand_score[pos] = scores[j].bitcast(Uint32)
            pos = pos + Int32(cutlass.select_(is_candidate[j], Int32(1), Int32(0)))
        my_id, my_score = Int32(0), Float32(0.0)
        if count <= WARP:
            cute.arch.sync_warp()
            mine = cand[lane]
            mine_score = cand_score[lane]  # loaded beside mine, off the path after the count
            # Each candidate's place: the candidates ahead of it. Usually there are a few
            # more than top_k, so up to 16 a shorter count will do (count is the same on
            # every lane: a uniform branch).
            ahead = Int32(0)
            if count <= WARP // 2:
                # Compare, select and add: for 16 the borrows below measured up to 0.13 us
                # slower (Kimi-K2; docs/kernel-notes.md).
                mine_u = mine.to(cutlass.Uint64)
                ahead = _count([(Int32(d) < count) & (cand[d].to(cutlass.Uint64) > mine_u)
                                for d in range(WARP // 2)])
            else:
                # The borrow of a subtraction, three instructions a candidate against five or
                # six: 0.03-0.06 us faster for Kimi-K3's top-16 (about 21 candidates). Slots
                # past count hold 0, never ahead.
                ahead = _count_above([cand[d] for d in range(WARP)], mine)
            if (lane < count) & (ahead < top_k):
                pick_id[ahead] = ~Uint32(mine & cutlass.Int64(0xFFFFFFFF))
                pick_score[ahead] = mine_score
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
    def _mask_slot_groups(self, choice, keys, lane, top_k, n_group, topk_group, scoring,
                          scratch) -> Uint32:
        """Groups of exactly 32 experts (DeepSeek-V3: 256 experts, 8 groups): group g is slot
        g of every lane. Shared memory turns slots into rows (8 groups at a time), so four
        lanes read a quarter of group g's choice values each, take their two best with a
        tree of max/min and merge them with two shuffles. Then each lane counts the groups
        that beat its own (ties to the lower group), and a ballot gives every lane the kept
        groups. (Two `redux.sync` per group took twice as long; eight shuffle butterflies
        about as long, with more shuffles in flight.)"""
        slots: cutlass.Constexpr = self.slots
        rows = cute.make_tensor(scratch.iterator, cute.make_layout((GROUP_ROW, GROUP_CHUNK)))
        group_keys = scratch[None, GROUP_KEYS_ROW]
        group = lane // 4
        quarter = lane % 4
        # Groups past n_group keep key 0, which beats no group (ordered before the group
        # keys by the first sync below).
        group_keys[lane] = Uint32(0)
        seconds = []  # per chunk: the key of the second best of group c * 8 + lane // 4
        for c in cutlass.range_constexpr((slots + GROUP_CHUNK - 1) // GROUP_CHUNK):
            chunk = min(slots, (c + 1) * GROUP_CHUNK) - c * GROUP_CHUNK
            cute.arch.sync_warp()  # earlier reads of the scratch are done
            for j in cutlass.range_constexpr(chunk):
                rows[lane, j] = choice[c * GROUP_CHUNK + j].bitcast(Uint32)
            cute.arch.sync_warp()
            first, second = _top2([rows[8 * quarter + i, group].bitcast(Float32) for i in range(8)])
            for offset in cutlass.range_constexpr(1, 3):
                other_first = cute.arch.shuffle_sync_bfly(first, offset)
                other_second = cute.arch.shuffle_sync_bfly(second, offset)
                second = cute.arch.fmax(cute.arch.fmin(first, other_first),
                                        cute.arch.fmax(second, other_second))
                first = cute.arch.fmax(first, other_first)
            # (Slots past n_group, with more slots than groups, are no group: their key stays 0.)
            if (quarter == 0) & (group < chunk) & (c * GROUP_CHUNK + group < n_group):
                group_keys[c * GROUP_CHUNK + group] = self._key(self._group_score(first, second, scoring))
            seconds.append(self._key(second))
        cute.arch.sync_warp()
        # (key, ~group) as one 64-bit word: a higher key beats, an equal one from a lower group.
        mine = self._ranked(group_keys[lane], lane)
        beaten_by = _count_above([self._ranked(group_keys[i], Int32(i)) for i in range(slots)], mine)
        kept = cute.arch.vote_ballot_sync((beaten_by < topk_group) & (lane < n_group))
        for j in cutlass.range_constexpr(slots):
            keys[j] = Uint32(cutlass.select_(((kept >> j) & 1) != 0, keys[j], Uint32(0)))
        # A bound for the ranking: the kept groups' two best are 2 * topk_group experts, so
        # when top_k is no more, at least top_k experts reach the least of them. (About 10.5
        # candidates for DeepSeek-V3's random tokens, against 8.8 for the lanes' maxima.)
        least = Uint32(0xFFFFFFFF)
        for c in cutlass.range_constexpr(len(seconds)):
            g = c * GROUP_CHUNK + group
            mine_kept = (quarter == 0) & (g < n_group) & (((kept >> g) & 1) != 0)
            least = Uint32(cutlass.select_(mine_kept & (seconds[c] < least), seconds[c], least))
        least = Uint32(cute.arch.warp_redux_sync(least, "umin"))
        return Uint32(cutlass.select_(top_k <= 2 * topk_group, least, Uint32(0)))

    @cute.jit
    def _group_score(self, first, second, scoring) -> Float32:
        """A group's score from its two best choice values: their sum (DeepSeek-V3), or with
        softmax the best alone (DeepSeek-V2)."""
        return Float32(cutlass.select_(scoring == handoff_buffer.SOFTMAX, first, first + second))

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
    def _mask_groups(self, choice, keys, lane, n_count, n_group, topk_group, scoring):
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
            group_key = Uint32(cutlass.select_(lane == g, self._key(self._group_score(first, second, scoring)),
                                               group_key))
        kept = self._best_groups(group_key, lane, topk_group)
        for j in cutlass.range_constexpr(self.slots):
            group = cutlass.min((j * WARP + lane) // group_size, 31)
            keys[j] = Uint32(cutlass.select_(((kept >> group) & 1) == 0, Uint32(0), keys[j]))
