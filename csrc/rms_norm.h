#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace kimi {

// The norm ops' input contract (every implementation calls it first); fused_add_rms_norm
// passes its residual, rms_norm nullptr.
void check_norm_inputs(const char* op, const at::Tensor& x, const at::Tensor* residual,
                       const at::Tensor& weight, double eps);

// The exact formula (csrc/rms_norm.cpp) as ATen ops, on any device; inputs already checked.
at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_reference(const at::Tensor& x,
                                                                const at::Tensor& residual,
                                                                const at::Tensor& weight,
                                                                double eps);

}  // namespace kimi
