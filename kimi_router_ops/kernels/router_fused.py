"""The whole MoE router in one launch: a router GEMM kernel, then routing in the same grid.

    logits  = x · wᵀ (+ gate_bias)                    (the GEMM kernel's body, unchanged)
    then the routing of kernels/routing.py on sigmoid(logits) or softmax(logits)

Every CTA runs the GEMM body of an GemmDotprod or GemmMma kernel, which stores the
logits and also publishes each expert's sigmoid score in a handoff buffer
(kernels/handoff.py), where a word is its own ready flag. Token m is then routed by one
warp, of the m-th CTA from the end (or, with more tokens than CTAs, the next warps; on
some tensor-core rows, of the last cluster's CTA that publishes token m): it
polls its token's words until all are published, routes, and empties them again for the
next call. No fence, no counter: the routing starts one L2 round trip after the last score
is stored. The host gives each stream, and each call captured into a graph, its own handoff
buffer (csrc/cuda/router_handoff.cpp).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from . import handoff as handoff_buffer
from .routing import WARP, WarpRouting

EXCLUSIVE_SMEM = 120 * 1024  # more than half of an H200's or B200's 228 KiB per SM


class FusedRouter(WarpRouting):
    """One fused router kernel: `gemm` (a GEMM kernel object) plus the routing epilogue."""

    def __init__(self, gemm, n_max: int, exclusive: bool = False, bias_prefetch: bool = False,
                 at_publisher: bool = False):
        super().__init__(n_max, gemm.threads // WARP)
        self.gemm = gemm
        self.ctas_per_sm = gemm.ctas_per_sm
        self.exclusive = exclusive
        self.bias_prefetch = bias_prefetch
        # Token m routed in the CTA of the last cluster that publishes it, by its warp
        # m % tokens_per_rank (tensor-core GEMMs only: _routing_unit).
        self.at_publisher = at_publisher
        if at_publisher:
            share = gemm.finishing_share() if hasattr(gemm, "finishing_share") else 0
            if share == 0 or share % gemm.experts or share // gemm.experts > self.warps:
                raise ValueError("at_publisher needs a tensor-core GEMM whose ranks finish whole tokens")
            self.tokens_per_rank = share // gemm.experts

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # [M, K] bf16
        w: cute.Tensor,  # [N, K] bf16 or float32 (the GEMM kernel's weight dtype)
        gate_bias: cute.Tensor,  # [1, N] w's dtype, added to the logits; read only if has_gate_bias
        bias: cute.Tensor,  # [1, N] float32 or bfloat16; read only if has_bias
        logits: cute.Tensor,  # [M, N] float32, out
        weights: cute.Tensor,  # [M, top_k + shared_experts] float32, out
        ids: cute.Tensor,  # [M, (top_k + shared_experts) x id_words] int32 words, out
        handoff: cute.Tensor,  # [M, N] int32, EMPTY before the call and after it
        input_ids: cute.Tensor,  # [1, M x ids_words] int32 words; read only if table_words
        hash_table: cute.Tensor,  # [V, top_k x table_words] int32 words; read only if table_words
        counts: cute.Tensor,  # [1, N + shared_experts] int32, added to; read only if has_counts
        top_k: Int32, n_group: Int32, topk_group: Int32, renormalize: Int32,  # tables.ROUTING_SCALARS
        has_bias: Int32, scoring: Int32, scaling: Float32,  # scoring: a tables.Scoring value
        ids_words: Int32, table_words: Int32,
        shared_experts: Int32, shared_weight: Float32, id_words: Int32, has_counts: Int32,
        has_gate_bias: Int32,
        stream: cuda.CUstream,
    ):
        xv, wv = self.gemm.vector_views(x, w)
        shape = self.gemm.launch_shape(w.shape[0], x.shape[0])
        # The routing's scratch, after the GEMM's own shared memory.
        shape["smem"] += self.scratch_bytes()
        # As many CTAs per SM as the GEMM kernel alone gets: the routing's registers must not
        # lower the GEMM's occupancy (with 32 experts a lane they would halve the dot
        # product's, and Kimi-K3's 224 CTAs would run in two waves). Unless exclusive: then
        # more than half an SM's shared memory keeps every other CTA, of this kernel or of
        # the next one (launched early by PDL, streaming its weights), off a routing CTA's
        # SM. The carveout is the driver default; naming it keeps the build from querying a
        # GPU.
        ctas_per_sm = self.ctas_per_sm
        if const_expr(self.exclusive):
            shape["smem"] = max(shape["smem"], EXCLUSIVE_SMEM)
            ctas_per_sm = 1
        self.kernel(
            xv, wv, gate_bias, bias, logits, weights, ids, handoff, input_ids, hash_table, counts,
            top_k, n_group, topk_group, renormalize, has_bias, scoring, scaling, ids_words, table_words,
            shared_experts, shared_weight, id_words, has_counts,
            has_gate_bias,
        ).launch(**shape, stream=stream, use_pdl=self.gemm.pdl,
                 min_blocks_per_mp=ctas_per_sm, preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(
        self, xv: cute.Tensor, wv: cute.Tensor, gate_bias: cute.Tensor, bias: cute.Tensor,
        logits: cute.Tensor, weights: cute.Tensor, ids: cute.Tensor, handoff: cute.Tensor,
        input_ids: cute.Tensor, hash_table: cute.Tensor, counts: cute.Tensor,
        top_k: Int32, n_group: Int32, topk_group: Int32, renormalize: Int32,  # tables.ROUTING_SCALARS
        has_bias: Int32, scoring: Int32, scaling: Float32,  # scoring: a tables.Scoring value
        ids_words: Int32, table_words: Int32,
        shared_experts: Int32, shared_weight: Float32, id_words: Int32, has_counts: Int32,
        has_gate_bias: Int32,
    ):
        if const_expr(self.bias_prefetch):
            if has_bias != 0:
                self._prefetch_bias(bias, handoff.shape[0])
        self.gemm.body(xv, wv, gate_bias, logits, has_gate_bias, handoff, scoring)
        if const_expr(self.at_publisher and self.gemm.experts < WARP):
            # A warp finishes more than one token: the others' routing warps poll only once
            # it has published them.
            cute.arch.sync_threads()
        self._route(handoff, bias, weights, ids, input_ids, hash_table, counts, top_k, n_group, topk_group,
                    renormalize, has_bias, scoring, scaling, ids_words, table_words,
                    shared_experts, shared_weight, id_words, has_counts, self._scratch())

    @cute.jit
    def _routing_unit(self):
        """This warp's first token and the stride to its next. Token m goes to warp m // ctas
        of the m % ctas-th CTA from the end: one warp per token and SM while M <= CTAs (each
        has a scheduler to itself); at_publisher rows give it to the last cluster's CTA that
        publishes it. From the end, because a routing warp waits for the other CTAs: CTAs
        start in index order, so the last ones start after all the others have (the premise
        of every single-pass scan), and no CTA waits for one that cannot start."""
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bx, by, bz = cute.arch.block_idx()
        gx, gy, gz = cute.arch.grid_dim()
        ctas = gx * gy * gz
        unit = warp * ctas + (ctas - 1 - (bx + gx * (by + gy * bz)))
        stride = ctas * self.warps
        if const_expr(self.at_publisher):
            # Rank bx of the last cluster (by) publishes tokens bx * tokens_per_rank onwards
            # (tokens_per_rank of them), so its polls leave in step with its own stores (a
            # rank with nothing to publish polled too soon: docs/kernel-notes.md).
            mine = (by == gy - 1) & (warp < self.tokens_per_rank)
            unit = Int32(cutlass.select_(mine, bx * self.tokens_per_rank + warp, Int32(2**31 - 1)))
            stride = gx * self.tokens_per_rank  # the bucket's tokens: one each
        return unit, stride

    @cute.jit
    def _gather(self, handoff, bias, m, lane, n_count, has_bias, scoring, scores, choice,
                exact: cutlass.Constexpr):
        """This token's scores (polled until all are published, then emptied again) and
        biases. With `exact` every lane's experts all exist; otherwise indices are clamped
        (loads) or the stores skipped."""
        slots: cutlass.Constexpr = self.slots
        # Every load first, with no branch between them, so that they are all in flight at
        # once: one L2 round trip, not one per expert.
        self._load_bias(bias, lane, n_count, has_bias, choice, exact)
        for j in cutlass.range_constexpr(slots):
            scores[j] = handoff_buffer.poll(handoff, m, self._expert(j, lane, n_count, exact)).bitcast(Float32)
        # Until every score of this token has been published: reload what is not.
        while cute.arch.vote_any_sync(self._pending(scores)):
            for j in cutlass.range_constexpr(slots):
                if scores[j].bitcast(Int32) == Int32(handoff_buffer.EMPTY):
                    scores[j] = handoff_buffer.poll(handoff, m, self._expert(j, lane, n_count, exact)).bitcast(Float32)
        # Empty again for the next call (which polls only after its PDL wait, when this
        # grid has finished and its stores are visible).
        for j in cutlass.range_constexpr(slots):
            if const_expr(exact):
                handoff[m, j * WARP + lane] = Int32(handoff_buffer.EMPTY)
            else:
                if j * WARP + lane < n_count:
                    handoff[m, j * WARP + lane] = Int32(handoff_buffer.EMPTY)

    @cute.jit
    def _pending(self, values) -> cutlass.Boolean:
        pending = values[0].bitcast(Int32) == Int32(handoff_buffer.EMPTY)
        for j in cutlass.range_constexpr(1, self.slots):
            pending = pending | (values[j].bitcast(Int32) == Int32(handoff_buffer.EMPTY))
        return pending

