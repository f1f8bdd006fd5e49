// CUDA implementation of the routing op: the PDL-launched routing kernel where it fits
// (sm_90 / sm_100, N <= 1024, top_k <= 32, at most 32 groups when some are dropped), the
// ATen reference otherwise; hash-routed calls too.

#include <limits>

#include "kernel_support.h"
#include "../moe_routing.h"

namespace kimi {

std::tuple<Tensor, Tensor> moe_routing_on_gpu(const Tensor& logits_in, const OptionalTensor& bias_in,
                                              const RoutingParams& r) {
  const Tensor logits = unit_inner_stride(logits_in);
  const int64_t M = logits.size(0), N = logits.size(1);
  const int device = logits.get_device_index();
  const int sm = device_sm(device);
  // Without a bias the fp32 kernel runs with has_bias = 0 and never reads the stand-in.
  const ScalarType bias_dtype = bias_in.has_value() ? bias_in->scalar_type() : kFloat;
  const RoutingKernel* kernel =
      !routing_kernel_fits(N, r, sm)
          ? nullptr
          : find_kernel(kRoutingKernels, sm, [&](const RoutingKernel& k) {
              return k.n_min <= N && N <= k.n_max && k.logits_dtype == logits.scalar_type() &&
                     k.bias_dtype == bias_dtype;
            });
  if (kernel == nullptr || M > std::numeric_limits<int32_t>::max()) {
    return routing_reference(logits, bias_in, r);
  }
  Tensor weights = empty_on(logits, {M, r.top_k}, kFloat);
  Tensor ids = empty_on(logits, {M, r.top_k}, kInt);
  if (M == 0) {
    return {weights, ids};
  }
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : weights;  // a stand-in
  RoutingArgs args{};
  args.logits = matrix_arg(logits);
  args.bias = row_arg(bias, N);
  args.weights = matrix_arg(weights);
  args.ids = matrix_arg(ids);
  const HashArgs hash = hash_args(r.input_ids, r.hash_table, ids);
  args.input_ids = hash.input_ids;
  args.hash_table = hash.hash_table;
  args.routing = r.kernel_scalars(bias_in.has_value());
  launch_kernel(kRoutingKernels, *kernel, args, device, current_stream(device));
  return {weights, ids};
}

namespace {

std::tuple<Tensor, Tensor> moe_routing_cuda(const Tensor& logits, const OptionalTensor& bias,
                                            int64_t top_k, int64_t n_group, int64_t topk_group,
                                            bool renormalize, double routed_scaling_factor,
                                            const std::string& scoring,
                                            const OptionalTensor& input_ids,
                                            const OptionalTensor& hash_table) {
  const RoutingParams r = routing_params("moe_routing", top_k, n_group, topk_group, renormalize,
                                         routed_scaling_factor, scoring, input_ids, hash_table);
  check_moe_routing_inputs(logits, bias, r);
  const DeviceGuard guard(logits.get_device_index());
  return moe_routing_on_gpu(logits, bias, r);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) { m.impl("moe_routing", TORCH_BOX(&moe_routing_cuda)); }

}  // namespace kimi
