#pragma once

#include "torch_stable.h"

namespace kimi {

// attn_res's input contract (every implementation calls it first, before writing anything).
void check_attn_res_inputs(const Tensor& prefix, const OptionalTensor& delta, const Tensor& blocks,
                           const Tensor& norm_weight, const Tensor& qk_weight,
                           const OptionalTensor& output_norm_weight, int64_t num_blocks,
                           int64_t block_write_idx, double eps, double output_norm_eps);

// The exact formula (csrc/attn_res.cpp) as ATen ops, on any device; inputs already checked.
// Writes p into prefix (with a delta) and blocks[:, block_write_idx] (>= 0), as the kernel.
Tensor attn_res_reference(const Tensor& prefix, const OptionalTensor& delta, const Tensor& blocks,
                          const Tensor& norm_weight, const Tensor& qk_weight,
                          const OptionalTensor& output_norm_weight, int64_t num_blocks,
                          int64_t block_write_idx, double eps, double output_norm_eps);

}  // namespace kimi
