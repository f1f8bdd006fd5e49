// The norm -> router fronts of the DeepSeek family (the RMSNorm in front of every MoE layer,
// then its gate), one op each:
//
//   rms_norm_router(hidden_states, norm_weight, eps, router_weight, ...)
//       = (normed, *router(normed, router_weight, ...)),  normed = rms_norm(hidden_states, ...)
//   fused_add_rms_norm_router(hidden_states, residual, norm_weight, eps, router_weight, ...)
//       = (normed, residual_out, *router(normed, ...)),
//         (normed, residual_out) = fused_add_rms_norm(hidden_states, residual, ...)
//
// exactly the composition of the ops on the same device: the CPU runs the references, CUDA
// (below) the norm op's kernel, then the router op's dispatch.

#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"
#include "norm_router.h"
#include "rms_norm.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#endif

namespace kimi {

void check_norm_router_inputs(const char* op, const Tensor& x, const Tensor* residual,
                              const Tensor& norm_weight, double eps, const Tensor& w,
                              const OptionalTensor& bias, const OptionalTensor& gate_bias,
                              const RoutingParams& r) {
  check_norm_inputs(op, x, residual, norm_weight, eps, "hidden_states", "norm_weight");
  check_router_inputs(op, x, w, bias, gate_bias, r);
}

namespace {

NormRouterOutputs norm_router_reference(const char* op, const Tensor& x, const Tensor* residual,
                                        const Tensor& norm_weight, double eps, const Tensor& w,
                                        const OptionalTensor& bias,
                                        const OptionalTensor& gate_bias,
                                        const RoutingParams& r) {
  check_norm_router_inputs(op, x, residual, norm_weight, eps, w, bias, gate_bias, r);
  Tensor normed, residual_out;
  if (residual != nullptr) {
    std::tie(normed, residual_out) = fused_add_rms_norm_reference(x, *residual, norm_weight, eps);
  } else {
    normed = residual_out = rms_norm_reference(x, norm_weight, eps);
  }
  const Tensor logits = gemm_reference(normed, w, gate_bias, kFloat);
  auto [weights, ids] = routing_reference(logits, bias, r);
  return {normed, residual_out, weights, ids, logits};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def(
      "rms_norm_router(Tensor hidden_states, Tensor norm_weight, float eps, "
      "Tensor router_weight, " KIMI_ROUTING_ARGS
      ", Tensor? gate_bias=None, Tensor? input_ids=None, Tensor? hash_table=None) "
      "-> (Tensor normed, Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  m.def(
      "fused_add_rms_norm_router(Tensor hidden_states, Tensor residual, Tensor norm_weight, "
      "float eps, Tensor router_weight, " KIMI_ROUTING_ARGS
      ", Tensor? gate_bias=None, Tensor? input_ids=None, Tensor? hash_table=None) "
      "-> (Tensor normed, Tensor residual_out, Tensor topk_weights, Tensor topk_ids, "
      "Tensor logits)");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) { NormRouterOps<norm_router_reference>::impl(m); }

#ifdef KIMI_WITH_CUDA

// CUDA implementation of the norm -> router fronts: the norm op's kernel, then the router
// op's dispatch, each waiting on the one before through PDL (docs/kernel-notes.md says why
// not one kernel: the norm in the fused router's prologue measured slower).

NormRouterOutputs norm_router_on_gpu(const char* op, const Tensor& x, const Tensor* residual,
                                     const Tensor& norm_weight, double eps, const Tensor& w,
                                     const OptionalTensor& bias, const OptionalTensor& gate_bias,
                                     const RoutingParams& routing) {
  check_norm_router_inputs(op, x, residual, norm_weight, eps, w, bias, gate_bias, routing);
  const DeviceGuard guard(x.get_device_index());
  auto [normed, residual_out] = norm_on_gpu(x, residual, norm_weight, eps);
  auto [weights, ids, logits] = route_on_gpu({op, nullptr, normed, w, bias, gate_bias, routing});
  return {normed, residual_out, weights, ids, logits};
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) { NormRouterOps<norm_router_on_gpu>::impl(m); }

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
