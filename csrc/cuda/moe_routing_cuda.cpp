// CUDA implementation of the routing ops: the PDL-launched routing kernel where it fits
// (sm_90 / sm_100, N <= 1024, top_k + shared slots <= 32, at most 32 groups when some are
// dropped), the ATen reference otherwise; hash-routed calls too.

#include <limits>

#include "kernel_support.h"
#include "../moe_routing.h"

namespace kimi {

namespace {

// The routing kernel for checked CUDA logits, or nullptr (the reference serves them).
const RoutingKernel* routing_kernel(const Tensor& logits, const OptionalTensor& bias,
                                    const RoutingParams& r) {
  const int sm = device_sm(logits.get_device_index());
  // Without a bias the fp32 kernel runs with has_bias = 0 and never reads the stand-in.
  const ScalarType bias_dtype = bias.has_value() ? bias->scalar_type() : kFloat;
  if (!routing_kernel_fits(logits.size(1), r, sm) ||
      logits.size(0) > std::numeric_limits<int32_t>::max()) {
    return nullptr;
  }
  const int64_t N = logits.size(1);
  return find_kernel(kRoutingKernels, sm, [&](const RoutingKernel& k) {
    return k.n_min <= N && N <= k.n_max && k.logits_dtype == logits.scalar_type() &&
           k.bias_dtype == bias_dtype;
  });
}

void launch_routing(const RoutingKernel& kernel, const Tensor& logits, const OptionalTensor& bias_in,
                    const RoutingParams& r, const RoutingOutputs& out) {
  const int64_t N = logits.size(1);
  const int device = logits.get_device_index();
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : out.weights;  // a stand-in
  RoutingArgs args{};
  args.logits = matrix_arg(logits);
  args.bias = row_arg(bias, N);
  const HashArgs hash = hash_args(r.input_ids, r.hash_table, out.weights);
  args.input_ids = hash.input_ids;
  args.hash_table = hash.hash_table;
  args.routing = r.kernel_scalars(bias_in.has_value());
  put_routing_outputs(args, out, N, r);
  launch_kernel(kRoutingKernels, kernel, args, device, current_stream(device));
}

}  // namespace

std::tuple<Tensor, Tensor> moe_routing_on_gpu(const Tensor& logits_in, const OptionalTensor& bias,
                                              const RoutingParams& r) {
  const Tensor logits = unit_inner_stride(logits_in);
  const RoutingKernel* kernel = routing_kernel(logits, bias, r);
  if (kernel == nullptr) {
    return routing_reference(logits, bias, r);
  }
  const int64_t M = logits.size(0);
  const RoutingOutputs out{empty_on(logits, {M, r.width()}, kFloat),
                           empty_on(logits, {M, r.width()}, kInt), std::nullopt};
  if (M > 0) {
    launch_routing(*kernel, logits, bias, r, out);
  }
  return {out.weights, out.ids};
}

void moe_routing_on_gpu_into(const Tensor& logits_in, const OptionalTensor& bias,
                             const RoutingParams& r, const RoutingOutputs& out) {
  const Tensor logits = unit_inner_stride(logits_in);
  const RoutingKernel* kernel = routing_kernel(logits, bias, r);
  if (kernel == nullptr) {
    auto [weights, ids] = routing_reference(logits, bias, r);
    write_routing(weights, ids, logits.size(1), r, out);
  } else if (logits.size(0) > 0) {
    launch_routing(*kernel, logits, bias, r, out);
  }
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

void moe_routing_out_cuda(const Tensor& logits, const OptionalTensor& bias, int64_t top_k,
                          int64_t n_group, int64_t topk_group, bool renormalize,
                          double routed_scaling_factor, const std::string& scoring,
                          const OptionalTensor& input_ids, const OptionalTensor& hash_table,
                          const Tensor& topk_weights, const Tensor& topk_ids,
                          const OptionalTensor& expert_counts, int64_t num_fused_shared_experts,
                          double shared_expert_weight) {
  const RoutingOutputs out{topk_weights, topk_ids, expert_counts};
  const RoutingParams r = moe_routing_out_params(
      logits, bias, top_k, n_group, topk_group, renormalize, routed_scaling_factor, scoring,
      input_ids, hash_table, num_fused_shared_experts, shared_expert_weight, out);
  const DeviceGuard guard(logits.get_device_index());
  moe_routing_on_gpu_into(logits, bias, r, out);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("moe_routing", TORCH_BOX(&moe_routing_cuda));
  m.impl("moe_routing_out", TORCH_BOX(&moe_routing_out_cuda));
}

}  // namespace kimi
