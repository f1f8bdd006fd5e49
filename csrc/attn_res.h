#pragma once

#include "torch_stable.h"

namespace kimi {

// attn_res's arguments (its schema's text, written once; attn_res_router's start so).
#define KIMI_ATTN_RES_ARGS                                                                  \
  "Tensor(a!) prefix, Tensor? delta, Tensor(b!) blocks, Tensor norm_weight, "             \
  "Tensor qk_weight, Tensor? output_norm_weight, int num_blocks, int block_write_idx, "   \
  "float eps, float output_norm_eps"

// One call's arguments, in the schema's order.
struct AttnResCall {
  const Tensor& prefix;
  const OptionalTensor& delta;
  const Tensor& blocks;
  const Tensor& norm_weight;
  const Tensor& qk_weight;
  const OptionalTensor& output_norm_weight;
  int64_t num_blocks, block_write_idx;
  double eps, output_norm_eps;
  const char* op = "attn_res";  // the op whose contract applies, named in its errors
};

// attn_res's input contract (every implementation calls it first, before writing anything).
void check_attn_res_inputs(const AttnResCall& call);

// The exact formula (csrc/attn_res.cpp) as ATen ops, on any device; inputs already checked.
// Writes p into prefix (with a delta) and blocks[:, block_write_idx] (>= 0), as the kernel.
Tensor attn_res_reference(const AttnResCall& call);

// Why the AttnRes kernel does not serve H hidden and num_blocks blocks on a GPU of compute
// capability sm (the op then runs the reference), or "" where it does (the call's alignment
// and M <= 65535 aside). The engines' plugins ask it to choose between the op and their own.
std::string attn_res_kernel_misfit(int64_t hidden, int64_t num_blocks, int64_t sm);

#ifdef KIMI_WITH_CUDA
// A checked call on its GPU, on the current stream: the PDL kernel where it serves the
// inputs, the reference elsewhere (csrc/attn_res.cpp).
Tensor attn_res_on_gpu(const AttnResCall& call);
#endif

// The op's entry point (its schema's arguments) over one implementation of a checked call:
// the reference on the CPU, the kernel or the reference on CUDA.
template <Tensor (*Run)(const AttnResCall&)>
Tensor attn_res_op(const Tensor& prefix, const OptionalTensor& delta, const Tensor& blocks,
                   const Tensor& norm_weight, const Tensor& qk_weight,
                   const OptionalTensor& output_norm_weight, int64_t num_blocks,
                   int64_t block_write_idx, double eps, double output_norm_eps) {
  const AttnResCall call{prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight,
                         num_blocks, block_write_idx, eps, output_norm_eps};
  check_attn_res_inputs(call);
  return Run(call);
}

}  // namespace kimi
