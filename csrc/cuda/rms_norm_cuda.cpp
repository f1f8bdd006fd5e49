// CUDA implementation of the norm ops: the PDL-launched CuTe DSL kernel (one CTA per row)
// on the GPUs it was compiled for, the ATen reference on others.

#include <limits>

#include "kernel_support.h"
#include "../rms_norm.h"

namespace kimi {

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

}  // namespace kimi
