#pragma once

#include <tuple>

#include "torch_stable.h"

namespace kimi {

// The norm ops' input contract (every implementation calls it first); fused_add_rms_norm
// passes its residual, rms_norm nullptr. The messages name x and weight as the op does.
void check_norm_inputs(const char* op, const Tensor& x, const Tensor* residual,
                       const Tensor& weight, double eps, const char* x_name = "x",
                       const char* weight_name = "weight");

// The exact formula (csrc/rms_norm.cpp) as ATen ops, on any device; inputs already checked.
Tensor rms_norm_reference(const Tensor& x, const Tensor& weight, double eps);
std::tuple<Tensor, Tensor> fused_add_rms_norm_reference(const Tensor& x, const Tensor& residual,
                                                        const Tensor& weight, double eps);

#ifdef KIMI_WITH_CUDA
// The norm of checked CUDA inputs on the current stream (residual nullptr: rms_norm): the
// kernel where one serves them, the reference otherwise. Returns (normed, residual_out);
// without a residual, residual_out is `normed` again.
std::tuple<Tensor, Tensor> norm_on_gpu(const Tensor& x, const Tensor* residual, const Tensor& weight,
                                       double eps);
#endif

}  // namespace kimi
