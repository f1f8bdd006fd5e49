#pragma once

#include <tuple>

#include "torch_stable.h"

namespace kimi {

// The norm ops' input contract (every implementation calls it first); fused_add_rms_norm
// passes its residual, rms_norm nullptr.
void check_norm_inputs(const char* op, const Tensor& x, const Tensor* residual,
                       const Tensor& weight, double eps);

// The exact formula (csrc/rms_norm.cpp) as ATen ops, on any device; inputs already checked.
Tensor rms_norm_reference(const Tensor& x, const Tensor& weight, double eps);
std::tuple<Tensor, Tensor> fused_add_rms_norm_reference(const Tensor& x, const Tensor& residual,
                                                        const Tensor& weight, double eps);

}  // namespace kimi
