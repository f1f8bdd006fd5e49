// CUDA implementation of the norm -> router fronts: the norm op's kernel, then the router
// op's dispatch, each waiting on the one before through PDL (docs/kernel-notes.md says why
// not one kernel: the norm in the fused router's prologue measured slower).

#include "kernel_support.h"
#include "../ll_bf16_router.h"
#include "../norm_router.h"
#include "../rms_norm.h"

namespace kimi {

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

}  // namespace kimi
