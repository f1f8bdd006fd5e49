// RMSNorm ops, the producers of a router's hidden_states (the norm in front of every MoE
// layer of DeepSeek-V3 and Kimi models). Exact formula, in fp32 from bf16 inputs:
//
//   rms_norm(x, weight, eps)[m, k] = bf16( (x[m, k] * r[m]) * weight[k] ),
//       r[m] = rsqrt( mean_k x[m, k]^2 + eps )                      one rounding, at the end
//   fused_add_rms_norm(x, residual, weight, eps) = (rms_norm(s, weight, eps), s),
//       s = bf16( x + residual )                                    one rounding
//
// Every device runs this as ATen ops (the reference); a CUDA kernel launched with
// programmatic dependent launch, so that a router kernel behind it can prefetch its
// weights, is to take the CUDA key.

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

#include "ll_bf16_gemm.h"

namespace kimi {

namespace {

void check_norm_inputs(const char* op, const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kBFloat16, op, ": x must be torch.bfloat16, got ",
                   dtype_name(x.scalar_type()));
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kBFloat16, op,
                   ": weight must be torch.bfloat16, got ", dtype_name(weight.scalar_type()));
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": x must be 2-D [M, K], got shape ", x.sizes());
  TORCH_CHECK_VALUE(x.size(1) >= 1, op, ": K must be at least 1, got x ", x.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(1), op,
                    ": weight must have shape [K]=[", x.size(1), "], got ", weight.sizes());
  TORCH_CHECK(weight.device() == x.device(), op,
              ": x and weight must be on the same device, got ", x.device(), " and ",
              weight.device());
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, op,
                    ": eps must be finite and >= 0, got ", eps);
}

at::Tensor normalize(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor r = at::rsqrt(xf.square().mean(-1, /*keepdim=*/true) + eps);
  return (xf * r * weight.to(at::kFloat)).to(at::kBFloat16);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm_inputs("rms_norm", x, weight, eps);
  return normalize(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps) {
  constexpr const char* op = "fused_add_rms_norm";
  check_norm_inputs(op, x, weight, eps);
  TORCH_CHECK_TYPE(residual.scalar_type() == at::kBFloat16, op,
                   ": residual must be torch.bfloat16, got ", dtype_name(residual.scalar_type()));
  TORCH_CHECK_VALUE(residual.sizes() == x.sizes(), op, ": residual must have the shape of x ",
                    x.sizes(), ", got ", residual.sizes());
  TORCH_CHECK(residual.device() == x.device(), op,
              ": x and residual must be on the same device, got ", x.device(), " and ",
              residual.device());
  at::Tensor sum = (x.to(at::kFloat) + residual.to(at::kFloat)).to(at::kBFloat16);
  return {normalize(sum, weight, eps), sum};
}

}  // namespace

// Functional schemas: nothing is written in place.
TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def(
      "fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) "
      "-> (Tensor normed, Tensor residual_out)");
}

TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
}
TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
}
// Inference ops: no derivative (backward raises).
TORCH_LIBRARY_IMPL(kimi, Autograd, m) {
  m.impl("rms_norm", torch::autograd::autogradNotImplementedFallback());
  m.impl("fused_add_rms_norm", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace kimi
