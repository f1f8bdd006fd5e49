// CUDA implementation of the routing op: the PDL-launched routing kernel where it fits
// (sm_90 / sm_100, N <= 1024, top_k <= 32, at most 32 groups when some are dropped), the
// ATen reference otherwise.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "kernel_support.h"
#include "kimi_kernels.h"
#include "../moe_routing.h"

namespace kimi {

namespace {

const CompiledRoutingKernel* find_routing_kernel(int64_t N, c10::ScalarType logits_dtype,
                                                 c10::ScalarType bias_dtype, int sm) {
  for (const CompiledRoutingKernel& kernel : kCompiledRoutingKernels) {
    if (kernel.n_min <= N && N <= kernel.n_max && kernel.logits_dtype == logits_dtype &&
        kernel.bias_dtype == bias_dtype && kernel.sm == sm) {
      return &kernel;
    }
  }
  return nullptr;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_routing_on_gpu(const at::Tensor& logits_in,
                                                      const std::optional<at::Tensor>& bias_in,
                                                      int64_t top_k, int64_t n_group,
                                                      int64_t topk_group, bool renormalize,
                                                      double routed_scaling_factor) {
  const at::Tensor logits = unit_inner_stride(logits_in);
  const int64_t M = logits.size(0), N = logits.size(1);
  const int device = logits.get_device();
  const int sm = device_sm(device);
  // Without a bias the fp32 kernel runs with has_bias = 0 and never reads the stand-in.
  const c10::ScalarType bias_dtype = bias_in.has_value() ? bias_in->scalar_type() : at::kFloat;
  const CompiledRoutingKernel* kernel =
      routing_kernel_fits(N, top_k, n_group, topk_group, sm)
          ? find_routing_kernel(N, logits.scalar_type(), bias_dtype, sm)
          : nullptr;
  if (kernel == nullptr || M > std::numeric_limits<int32_t>::max()) {
    return routing_reference(logits, bias_in, top_k, n_group, topk_group, renormalize,
                             routed_scaling_factor);
  }
  const auto options = logits.options();
  at::Tensor weights = at::empty({M, top_k}, options.dtype(at::kFloat));
  at::Tensor ids = at::empty({M, top_k}, options.dtype(at::kInt));
  if (M == 0) {
    return {weights, ids};
  }
  const at::Tensor bias_row = bias_in.has_value() ? bias_in->contiguous().view({1, N}) : weights;
  const TensorArg bias = bias_in.has_value()
                             ? matrix_arg(bias_row)
                             : TensorArg{weights.data_ptr(), {1, int32_t(N)}, {N}};  // a stand-in
  ensure_loaded(kCompiledRoutingKernels, device);
  RoutingArgs args{matrix_arg(logits), bias, matrix_arg(weights), matrix_arg(ids),
                   int32_t(top_k), int32_t(n_group), int32_t(topk_group), renormalize ? 1 : 0,
                   bias_in.has_value() ? 1 : 0, static_cast<float>(routed_scaling_factor)};
  const int32_t err = kernel->launch(&args, at::cuda::getCurrentCUDAStream(device));
  check_cuda(static_cast<cudaError_t>(err), "launching", kernel->symbol);
  return {weights, ids};
}

namespace {

std::tuple<at::Tensor, at::Tensor> moe_routing_cuda(const at::Tensor& logits,
                                                    const std::optional<at::Tensor>& bias,
                                                    int64_t top_k, int64_t n_group,
                                                    int64_t topk_group, bool renormalize,
                                                    double routed_scaling_factor) {
  check_moe_routing_inputs(logits, bias, top_k, n_group, topk_group);
  const c10::cuda::CUDAGuard guard(logits.device());
  return moe_routing_on_gpu(logits, bias, top_k, n_group, topk_group, renormalize,
                            routed_scaling_factor);
}

}  // namespace

TORCH_LIBRARY_IMPL(kimi, CUDA, m) { m.impl("moe_routing", &moe_routing_cuda); }

}  // namespace kimi
