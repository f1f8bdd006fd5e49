// RMSNorm ops, the producers of a router's hidden_states (the norm in front of every MoE
// layer of DeepSeek-V3 and Kimi models). Exact formula, in fp32 from bf16 inputs:
//
//   rms_norm(x, weight, eps)[m, k] = bf16( (x[m, k] * r[m]) * weight[k] ),
//       r[m] = rsqrt( mean_k x[m, k]^2 + eps )                      one rounding, at the end
//   fused_add_rms_norm(x, residual, weight, eps) = (rms_norm(s, weight, eps), s),
//       s = bf16( x + residual )                                    one rounding
//
// The CPU runs this as ATen ops (the reference); on Hopper and datacenter Blackwell the
// CUDA key runs the CuTe DSL kernel (csrc/cuda/rms_norm_cuda.cpp), launched with
// programmatic dependent launch so that a router kernel behind it can load its weights
// while it runs. Its sum of squares is added in another order than ATen's, so r may differ
// in the last fp32 bit and an output by one bf16 ulp; everything else is the same formula.

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

#include "ll_bf16_gemm.h"
#include "rms_norm.h"

namespace kimi {

void check_norm_inputs(const char* op, const at::Tensor& x, const at::Tensor* residual,
                       const at::Tensor& weight, double eps) {
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
  if (residual != nullptr) {
    TORCH_CHECK_TYPE(residual->scalar_type() == at::kBFloat16, op,
                     ": residual must be torch.bfloat16, got ",
                     dtype_name(residual->scalar_type()));
    TORCH_CHECK_VALUE(residual->sizes() == x.sizes(), op,
                      ": residual must have the shape of x ", x.sizes(), ", got ",
                      residual->sizes());
    TORCH_CHECK(residual->device() == x.device(), op,
                ": x and residual must be on the same device, got ", x.device(), " and ",
                residual->device());
  }
}

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor r = at::rsqrt(xf.square().mean(-1, /*keepdim=*/true) + eps);
  // Contiguous whatever x's layout, as the kernel's output and the fake kernel's are.
  return (xf * r * weight.to(at::kFloat)).to(at::kBFloat16).contiguous();
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_reference(const at::Tensor& x,
                                                                const at::Tensor& residual,
                                                                const at::Tensor& weight,
                                                                double eps) {
  at::Tensor sum = (x.to(at::kFloat) + residual.to(at::kFloat)).to(at::kBFloat16).contiguous();
  return {rms_norm_reference(sum, weight, eps), sum};
}

namespace {

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm_inputs("rms_norm", x, nullptr, weight, eps);
  return rms_norm_reference(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_cpu(const at::Tensor& x,
                                                          const at::Tensor& residual,
                                                          const at::Tensor& weight, double eps) {
  check_norm_inputs("fused_add_rms_norm", x, &residual, weight, eps);
  return fused_add_rms_norm_reference(x, residual, weight, eps);
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
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm_cpu);
}
// Inference ops: no derivative (backward raises).
TORCH_LIBRARY_IMPL(kimi, Autograd, m) {
  m.impl("rms_norm", torch::autograd::autogradNotImplementedFallback());
  m.impl("fused_add_rms_norm", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace kimi
