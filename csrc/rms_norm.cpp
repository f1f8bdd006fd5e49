// RMSNorm ops, the producers of a router's hidden_states (the norm in front of every MoE
// layer of DeepSeek-V3 and Kimi models). Exact formula, in fp32 from bf16 inputs:
//
//   rms_norm(x, weight, eps)[m, k] = bf16( (x[m, k] * r[m]) * weight[k] ),
//       r[m] = rsqrt( mean_k x[m, k]^2 + eps )                      one rounding, at the end
//   fused_add_rms_norm(x, residual, weight, eps) = (rms_norm(s, weight, eps), s),
//       s = bf16( x + residual )                                    one rounding
//
// The CPU runs this as ATen ops (the reference); on Hopper and datacenter Blackwell the
// CUDA key runs the CuTe DSL kernel (below), launched with
// programmatic dependent launch so that a router kernel behind it can load its weights
// while it runs. Its sum of squares is added in another order than ATen's, so r may differ
// in the last fp32 bit and an output by one bf16 ulp; everything else is the same formula.

#include <cmath>
#include <limits>
#include <tuple>

#include "rms_norm.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#endif

namespace kimi {

void check_norm_inputs(const char* op, const Tensor& x, const Tensor* residual,
                       const Tensor& weight, double eps, const char* x_name,
                       const char* weight_name) {
  KIMI_CHECK(x.scalar_type() == kBFloat16, op, ": ", x_name, " must be torch.bfloat16, got ",
             dtype_name(x.scalar_type()));
  KIMI_CHECK(weight.scalar_type() == kBFloat16, op, ": ", weight_name,
             " must be torch.bfloat16, got ", dtype_name(weight.scalar_type()));
  KIMI_CHECK(x.dim() == 2, op, ": ", x_name, " must be 2-D [M, K], got shape ", x.sizes());
  KIMI_CHECK(x.size(1) >= 1, op, ": K must be at least 1, got ", x_name, " ", x.sizes());
  KIMI_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), op, ": ", weight_name,
             " must have shape [K]=[", x.size(1), "], got ", weight.sizes());
  KIMI_CHECK(weight.device() == x.device(), op, ": ", x_name, " and ", weight_name,
             " must be on the same device, got ", x.device(), " and ", weight.device());
  KIMI_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ",
             eps);
  if (residual != nullptr) {
    KIMI_CHECK(residual->scalar_type() == kBFloat16, op,
               ": residual must be torch.bfloat16, got ",
               dtype_name(residual->scalar_type()));
    const Sizes rs = residual->sizes(), xs = x.sizes();
    KIMI_CHECK(rs.size() == xs.size() && std::equal(rs.begin(), rs.end(), xs.begin()), op,
               ": residual must have the shape of ", x_name, " ", xs, ", got ", rs);
    KIMI_CHECK(residual->device() == x.device(), op, ": ", x_name,
               " and residual must be on the same device, got ", x.device(), " and ",
               residual->device());
  }
}

Tensor rms_norm_reference(const Tensor& x, const Tensor& weight, double eps) {
  const NoGradGuard no_grad;
  const Tensor xf = torch::stable::to(x, kFloat);
  const Tensor r = aten::rsqrt(aten::add(aten::mean_last(aten::mul(xf, xf)), aten::scalar(eps)));
  const Tensor out = aten::mul(aten::mul(xf, r), torch::stable::to(weight, kFloat));
  // Contiguous whatever x's layout, as the kernel's output and the fake kernel's are.
  return torch::stable::contiguous(torch::stable::to(out, kBFloat16));
}

std::tuple<Tensor, Tensor> fused_add_rms_norm_reference(const Tensor& x, const Tensor& residual,
                                                        const Tensor& weight, double eps) {
  const NoGradGuard no_grad;
  const Tensor sum = torch::stable::contiguous(torch::stable::to(
      aten::add(torch::stable::to(x, kFloat), torch::stable::to(residual, kFloat)), kBFloat16));
  return {rms_norm_reference(sum, weight, eps), sum};
}

namespace {

Tensor rms_norm_cpu(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_inputs("rms_norm", x, nullptr, weight, eps);
  return rms_norm_reference(x, weight, eps);
}

std::tuple<Tensor, Tensor> fused_add_rms_norm_cpu(const Tensor& x, const Tensor& residual,
                                                  const Tensor& weight, double eps) {
  check_norm_inputs("fused_add_rms_norm", x, &residual, weight, eps);
  return fused_add_rms_norm_reference(x, residual, weight, eps);
}

}  // namespace

// Functional schemas: nothing is written in place.
STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def(
      "fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) "
      "-> (Tensor normed, Tensor residual_out)");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("rms_norm", TORCH_BOX(&rms_norm_cpu));
  m.impl("fused_add_rms_norm", TORCH_BOX(&fused_add_rms_norm_cpu));
}

#ifdef KIMI_WITH_CUDA

// CUDA implementation of the norm ops: the PDL-launched CuTe DSL kernel (one CTA per row)
// on the GPUs it was compiled for, the ATen reference on others.

namespace {

// Runs the kernel into out (and residual_out); false if this GPU has none.
bool launch_norm(const Tensor& x_in, const Tensor* residual_in, const Tensor& weight_in,
                 double eps, const Tensor& out, const Tensor& residual_out) {
  const int device = x_in.get_device_index();
  const int sm = device_sm(device);
  const Tensor x = unit_inner_stride(x_in);
  const Tensor residual = residual_in != nullptr ? unit_inner_stride(*residual_in) : x;
  const Tensor weight = unit_stride_vector(weight_in);
  const bool vec8 = vec8_aligned(x) && vec8_aligned(residual) && vec8_aligned(row_arg(weight)) &&
                    vec8_aligned(out) && vec8_aligned(residual_out);
  const NormKernel* kernel = find_kernel(kNormKernels, sm, [&](const NormKernel& k) {
    return k.add_residual == (residual_in != nullptr) && k.vec == (vec8 ? 8 : 1);
  });
  // One CTA per row, and int32 sizes: more rows than a grid holds go to the reference.
  if (kernel == nullptr || x.size(0) > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  if (x.size(0) == 0) {
    return true;
  }
  NormArgs args{};
  args.x = matrix_arg(x);
  args.residual = matrix_arg(residual);
  args.weight = row_arg(weight);
  args.out = matrix_arg(out);
  args.residual_out = matrix_arg(residual_out);
  args.eps = static_cast<float>(eps);
  launch_kernel(kNormKernels, *kernel, args, device, current_stream(device));
  return true;
}

Tensor rms_norm_cuda(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_inputs("rms_norm", x, nullptr, weight, eps);
  return std::get<0>(norm_on_gpu(x, nullptr, weight, eps));
}

std::tuple<Tensor, Tensor> fused_add_rms_norm_cuda(const Tensor& x, const Tensor& residual,
                                                   const Tensor& weight, double eps) {
  check_norm_inputs("fused_add_rms_norm", x, &residual, weight, eps);
  return norm_on_gpu(x, &residual, weight, eps);
}

}  // namespace

std::tuple<Tensor, Tensor> norm_on_gpu(const Tensor& x, const Tensor* residual, const Tensor& weight,
                                       double eps) {
  const DeviceGuard guard(x.get_device_index());
  Tensor out = empty_on(x, {x.size(0), x.size(1)}, kBFloat16);
  if (residual == nullptr) {
    // rms_norm's kernel neither reads residual nor writes residual_out: x and out stand in.
    const Tensor normed =
        launch_norm(x, nullptr, weight, eps, out, out) ? out : rms_norm_reference(x, weight, eps);
    return {normed, normed};
  }
  Tensor residual_out = empty_on(x, {x.size(0), x.size(1)}, kBFloat16);
  if (launch_norm(x, residual, weight, eps, out, residual_out)) {
    return {out, residual_out};
  }
  return fused_add_rms_norm_reference(x, *residual, weight, eps);
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("rms_norm", TORCH_BOX(&rms_norm_cuda));
  m.impl("fused_add_rms_norm", TORCH_BOX(&fused_add_rms_norm_cuda));
}

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
