"""The router's gate and a second projection of the same tokens in one grid.

    logits[m, n]     = sum_k x[m, k] * w[n, k] (+ gate_bias[n])   fp32 out   (the gate)
    projection[m, l] = sum_k x[m, k] * p[l, k]                    bf16 out   (e.g. Kimi-K3's
                                                                  latent down-projection)

At decode both are weight streams over the same x. Launched apart they are two grids that
each ramp up and drain; one grid of both keeps every SM streaming W's and P's rows back to
back and loads the first step of each CTA before the PDL wait, so the producer of x (a norm,
AttnRes) overlaps the stream of both. The first `gate_blocks` blocks along the GEMM kernel's
expert axis run its body on the gate, the rest on the projection, each with its block index
within its own matrix: the products and sums of each output are those of the GEMM kernel
alone, bit for bit.
"""

import cuda.bindings.driver as cuda

import cutlass.cute as cute
from cutlass import Int32, const_expr


class GateProjection:
    """One kernel: `gemm` (an LLBf16Dotprod or LLBf16Mma object) over two weight matrices."""

    def __init__(self, gemm):
        self.gemm = gemm

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # [M, K] bf16, unit stride along K
        w: cute.Tensor,  # [N, K] bf16: the gate
        gate_bias: cute.Tensor,  # [1, N] bf16; read only if has_gate_bias
        logits: cute.Tensor,  # [M, N] float32, out
        p: cute.Tensor,  # [L, K] bf16: the projection
        projection: cute.Tensor,  # [M, L] bf16, out
        has_gate_bias: Int32,
        stream: cuda.CUstream,
    ):
        gemm = self.gemm
        xv, wv = gemm.vector_views(x, w)
        _, pv = gemm.vector_views(x, p)
        shape = gemm.launch_shape(w.shape[0], x.shape[0])
        per_block = gemm.experts_per_cta()
        gate_blocks = (w.shape[0] + per_block - 1) // per_block
        shape["grid"][gemm.expert_axis] = gate_blocks + (p.shape[0] + per_block - 1) // per_block
        self.kernel(xv, wv, gate_bias, logits, pv, projection, has_gate_bias, gate_blocks).launch(
            **shape, stream=stream, use_pdl=gemm.pdl)

    @cute.kernel
    def kernel(self, xv: cute.Tensor, wv: cute.Tensor, gate_bias: cute.Tensor, logits: cute.Tensor,
               pv: cute.Tensor, projection: cute.Tensor, has_gate_bias: Int32, gate_blocks: Int32):
        block = cute.arch.block_idx()[self.gemm.expert_axis]
        if block < gate_blocks:
            self.gemm.body(xv, wv, gate_bias, logits, has_gate_bias, expert_block=block)
        else:
            # The projection has no bias: the gate's stand-in is never read.
            self.gemm.body(xv, pv, gate_bias, projection, Int32(0), expert_block=block - gate_blocks)
