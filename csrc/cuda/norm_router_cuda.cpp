// CUDA implementation of the norm -> router fronts: one NormRouter kernel (the fused router
// row the router op would choose, with the norm in its prologue) where one is compiled for
// the problem; otherwise the norm op's kernel, then the router op's dispatch, each waiting on
// the one before through PDL.

#include "kernel_support.h"
#include "router_handoff.h"
#include "../ll_bf16_gemm.h"
#include "../ll_bf16_router.h"
#include "../norm_router.h"
#include "../rms_norm.h"

namespace kimi {

namespace {

// The NormRouter kernel for a problem, or nullptr: the router row the router op chooses,
// compiled with this norm, fp32 (or no) score-correction bias, 16-byte aligned rows.
const NormRouterKernel* norm_router_kernel(const Tensor& x, const Tensor* residual,
                                           const Tensor& norm_weight, const Tensor& w,
                                           const OptionalTensor& bias,
                                           const RoutingParams& routing, int sm) {
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  const bool aligned = vec8_aligned(x) && (residual == nullptr || vec8_aligned(*residual)) &&
                       vec8_aligned(row_arg(norm_weight)) && vec16_ok(x, w);
  if (M == 0 || !aligned || (bias.has_value() && bias->scalar_type() != kFloat)) {
    return nullptr;
  }
  const RouterRow* row =
      choose_router({M, N, K, x.scalar_type(), w.scalar_type(), sm, true}, routing);
  if (row == nullptr) {
    return nullptr;
  }
  const int router = static_cast<int>(row - kRouterRows);
  return find_kernel(kNormRouterKernels, sm, [&](const NormRouterKernel& k) {
    return k.router == router && k.add_residual == (residual != nullptr);
  });
}

}  // namespace

NormRouterOutputs norm_router_on_gpu(const char* op, const Tensor& x_in, const Tensor* residual_in,
                                     const Tensor& norm_weight_in, double eps, const Tensor& w_in,
                                     const OptionalTensor& bias_in,
                                     const OptionalTensor& gate_bias,
                                     const RoutingParams& routing) {
  check_norm_router_inputs(op, x_in, residual_in, norm_weight_in, eps, w_in, bias_in, gate_bias,
                           routing);
  const DeviceGuard guard(x_in.get_device_index());
  const Tensor x = unit_inner_stride(x_in);
  const Tensor w = unit_inner_stride(w_in);
  const Tensor norm_weight = unit_stride_vector(norm_weight_in);
  const OptionalTensor residual_kept =
      residual_in != nullptr ? OptionalTensor(unit_inner_stride(*residual_in)) : std::nullopt;
  const Tensor* residual = residual_kept.has_value() ? &*residual_kept : nullptr;
  const int device = x.get_device_index();
  const int sm = device_sm(device);
  const NormRouterKernel* kernel =
      norm_router_kernel(x, residual, norm_weight, w, bias_in, routing, sm);
  if (kernel == nullptr) {
    auto [normed, residual_out] = norm_on_gpu(x, residual, norm_weight, eps);
    auto [weights, ids, logits] =
        route_on_gpu(op, nullptr, normed, w, bias_in, gate_bias, routing);
    return {normed, residual_out, weights, ids, logits};
  }
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  const Tensor normed = empty_on(x, {M, K}, kBFloat16);
  const Tensor residual_out = residual != nullptr ? empty_on(x, {M, K}, kBFloat16) : normed;
  const Tensor logits = empty_on(x, {M, N}, kFloat);
  const RoutingOutputs out{empty_on(x, {M, routing.width()}, kFloat),
                           empty_on(x, {M, routing.width()}, kInt), std::nullopt};
  // Stand-ins the kernel never reads (has_bias, has_gate_bias = 0; rms_norm reads no residual
  // and writes no residual_out): the logits for the bias, the weights for the gate bias, x
  // for the residual.
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : logits;
  const Tensor gate = gate_bias.has_value() ? unit_stride_vector(*gate_bias) : w;
  const cudaStream_t stream = current_stream(device);
  NormRouterArgs args{};
  args.x = matrix_arg(x);
  args.residual = matrix_arg(residual != nullptr ? *residual : x);
  args.norm_weight = row_arg(norm_weight);
  args.normed = matrix_arg(normed);
  args.residual_out = matrix_arg(residual_out);
  args.w = matrix_arg(w);
  args.gate_bias = row_arg(gate, N);
  args.bias = row_arg(bias, N);
  args.logits = matrix_arg(logits);
  args.handoff = {router_handoff(device, stream, M * N), {int32_t(M), int32_t(N)}, {N}};
  const HashArgs hash = hash_args(routing.input_ids, routing.hash_table, out.weights);
  args.input_ids = hash.input_ids;
  args.hash_table = hash.hash_table;
  args.eps = static_cast<float>(eps);
  args.routing = routing.kernel_scalars(bias_in.has_value());
  put_routing_outputs(args, out, N, routing);
  args.has_gate_bias = gate_bias.has_value();
  launch_kernel(kNormRouterKernels, *kernel, args, device, stream);
  return {normed, residual_out, out.weights, out.ids, logits};
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) { NormRouterOps<norm_router_on_gpu>::impl(m); }

}  // namespace kimi
