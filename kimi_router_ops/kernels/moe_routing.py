"""The routing op's kernel: fp32 or bf16 logits [M, N] -> (topk_weights, topk_ids).

The routing of kernels/routing.py, one warp a token (token m: warp m % warps of CTA
m // warps), on scores computed as the fused router computes them (handoff.score_bits), so
that given the fused router's logits it returns its ids and weights bit for bit. Launched
with PDL: at entry each routing warp asks L2 for the bias (a model parameter, safe to read
early) and lets the next kernel launch; the logits are read after the grid-dependency wait.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from . import handoff as handoff_buffer
from .routing import WARP, WarpRouting


class MoeRouting(WarpRouting):
    """Routing for up to `n_max` experts, `warps` tokens a CTA."""

    @cute.jit
    def __call__(
        self,
        logits: cute.Tensor,  # [M, N] float32 or bfloat16
        bias: cute.Tensor,  # [1, N] float32 or bfloat16; read only if has_bias
        weights: cute.Tensor,  # [M, top_k + shared_experts] float32, out
        ids: cute.Tensor,  # [M, (top_k + shared_experts) x id_words] int32 words, out
        input_ids: cute.Tensor,  # [1, M x ids_words] int32 words; read only if table_words
        hash_table: cute.Tensor,  # [V, top_k x table_words] int32 words; read only if table_words
        counts: cute.Tensor,  # [1, N + shared_experts] int32, added to; read only if has_counts
        top_k: Int32, n_group: Int32, topk_group: Int32, renormalize: Int32,  # tables.ROUTING_SCALARS
        has_bias: Int32, scoring: Int32, scaling: Float32,  # scoring: a tables.Scoring value
        ids_words: Int32, table_words: Int32,
        shared_experts: Int32, shared_weight: Float32, id_words: Int32, has_counts: Int32,
        stream: cuda.CUstream,
    ):
        ctas = (logits.shape[0] + self.warps - 1) // self.warps
        self.kernel(logits, bias, weights, ids, input_ids, hash_table, counts, top_k, n_group, topk_group,
                    renormalize, has_bias, scoring, scaling, ids_words, table_words,
                    shared_experts, shared_weight, id_words, has_counts).launch(
            grid=[ctas, 1, 1], block=[self.warps * WARP, 1, 1], smem=self.scratch_bytes(), stream=stream,
            use_pdl=True,
        )

    @cute.kernel
    def kernel(
        self, logits: cute.Tensor, bias: cute.Tensor, weights: cute.Tensor, ids: cute.Tensor,
        input_ids: cute.Tensor, hash_table: cute.Tensor, counts: cute.Tensor,
        top_k: Int32, n_group: Int32, topk_group: Int32, renormalize: Int32,  # tables.ROUTING_SCALARS
        has_bias: Int32, scoring: Int32, scaling: Float32,  # scoring: a tables.Scoring value
        ids_words: Int32, table_words: Int32,
        shared_experts: Int32, shared_weight: Float32, id_words: Int32, has_counts: Int32,
    ):
        if has_bias != 0:
            self._prefetch_bias(bias, logits.shape[0])
        # Safe at once: a dependent reads our outputs only after its own wait, which returns
        # when this grid has finished.
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()  # the logits come from the kernel before us
        self._route(logits, bias, weights, ids, input_ids, hash_table, counts, top_k, n_group, topk_group,
                    renormalize, has_bias, scoring, scaling, ids_words, table_words,
                    shared_experts, shared_weight, id_words, has_counts, self._scratch())

    @cute.jit
    def _routing_unit(self):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bx, _, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        return bx * self.warps + warp, gx * self.warps

    @cute.jit
    def _gather(self, logits, bias, m, lane, n_count, has_bias, scoring, scores, choice,
                exact: cutlass.Constexpr):
        """This token's scores and biases, every load issued before the first use."""
        slots: cutlass.Constexpr = self.slots
        self._load_bias(bias, lane, n_count, has_bias, choice, exact)
        for j in cutlass.range_constexpr(slots):
            scores[j] = logits[m, self._expert(j, lane, n_count, exact)].to(Float32)
        handoff_buffer.score_all(scores, slots, scoring)
