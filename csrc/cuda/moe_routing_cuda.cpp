// CUDA implementation of the routing op: the PDL-launched routing kernel where it fits
// (sm_90 / sm_100, N <= 1024, top_k <= 32, at most 32 groups when some are dropped), the
// ATen reference otherwise.

#include <limits>

#include "kernel_support.h"
#include "kimi_kernels.h"
#include "../moe_routing.h"

namespace kimi {

namespace {

const CompiledRoutingKernel* find_routing_kernel(int64_t N, ScalarType logits_dtype,
                                                 ScalarType bias_dtype, int sm) {
  for (const CompiledRoutingKernel& kernel : kCompiledRoutingKernels) {
    if (kernel.n_min <= N && N <= kernel.n_max && kernel.logits_dtype == logits_dtype &&
        kernel.bias_dtype == bias_dtype && kernel.sm == sm) {
      return &kernel;
    }
  }
  return nullptr;
}

}  // namespace

std::tuple<Tensor, Tensor> moe_routing_on_gpu(const Tensor& logits_in, const OptionalTensor& bias_in,
                                              int64_t top_k, int64_t n_group, int64_t topk_group,
                                              bool renormalize, double routed_scaling_factor,
                                              Scoring scoring) {
  const Tensor logits = unit_inner_stride(logits_in);
  const int64_t M = logits.size(0), N = logits.size(1);
  const int device = logits.get_device_index();
  const int sm = device_sm(device);
  // Without a bias the fp32 kernel runs with has_bias = 0 and never reads the stand-in.
  const ScalarType bias_dtype = bias_in.has_value() ? bias_in->scalar_type() : kFloat;
  const CompiledRoutingKernel* kernel =
      routing_kernel_fits(N, top_k, n_group, topk_group, sm)
          ? find_routing_kernel(N, logits.scalar_type(), bias_dtype, sm)
          : nullptr;
  if (kernel == nullptr || M > std::numeric_limits<int32_t>::max()) {
    return routing_reference(logits, bias_in, top_k, n_group, topk_group, renormalize,
                             routed_scaling_factor, scoring);
  }
  Tensor weights = empty_on(logits, {M, top_k}, kFloat);
  Tensor ids = empty_on(logits, {M, top_k}, kInt);
  if (M == 0) {
    return {weights, ids};
  }
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : weights;  // a stand-in
  ensure_loaded(kCompiledRoutingKernels, device);
  RoutingArgs args{matrix_arg(logits), TensorArg{bias.data_ptr(), {1, int32_t(N)}, {N}},
                   matrix_arg(weights), matrix_arg(ids),
                   int32_t(top_k), int32_t(n_group), int32_t(topk_group), renormalize ? 1 : 0,
                   bias_in.has_value() ? 1 : 0, scoring == Scoring::kSoftmax ? 1 : 0,
                   static_cast<float>(routed_scaling_factor)};
  const int32_t err = kernel->launch(&args, current_stream(device));
  check_cuda(static_cast<cudaError_t>(err), "launching", kernel->symbol);
  return {weights, ids};
}

namespace {

std::tuple<Tensor, Tensor> moe_routing_cuda(const Tensor& logits, const OptionalTensor& bias,
                                            int64_t top_k, int64_t n_group, int64_t topk_group,
                                            bool renormalize, double routed_scaling_factor,
                                            const std::string& scoring) {
  const Scoring how = parse_scoring("moe_routing", scoring);
  check_moe_routing_inputs(logits, bias, top_k, n_group, topk_group, how);
  const DeviceGuard guard(logits.get_device_index());
  return moe_routing_on_gpu(logits, bias, top_k, n_group, topk_group, renormalize,
                            routed_scaling_factor, how);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) { m.impl("moe_routing", TORCH_BOX(&moe_routing_cuda)); }

}  // namespace kimi
