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
    routing_reference_into(logits, bias, r, out);
  } else if (logits.size(0) > 0) {
    launch_routing(*kernel, logits, bias, r, out);
  }
}

namespace {

// The entry points' implementations: on the logits' device.
std::tuple<Tensor, Tensor> routing_on_device(const Tensor& logits, const OptionalTensor& bias,
                                             const RoutingParams& r) {
  const DeviceGuard guard(logits.get_device_index());
  return moe_routing_on_gpu(logits, bias, r);
}

void routing_on_device_into(const Tensor& logits, const OptionalTensor& bias,
                            const RoutingParams& r, const RoutingOutputs& out) {
  const DeviceGuard guard(logits.get_device_index());
  moe_routing_on_gpu_into(logits, bias, r, out);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("moe_routing", TORCH_BOX(&moe_routing_op<routing_on_device>));
  m.impl("moe_routing_out", TORCH_BOX(&moe_routing_out_op<routing_on_device_into>));
}

}  // namespace kimi
