// CUDA implementation of attn_res_router: the AttnRes kernel (which releases the next launch
// at its entry), then the router op's dispatch, whose kernels stream their weights before
// their PDL wait. Not one kernel: every router CTA would recompute AttnRes's mix of the
// token's 9 sources (docs/kernel-notes.md, "The norm in the router's prologue").

#include "kernel_support.h"
#include "../attn_res_router.h"
#include "../ll_bf16_router.h"

namespace kimi {

AttnResRouterOutputs attn_res_router_on_gpu(const AttnResCall& call, const Tensor& w,
                                            const OptionalTensor& bias,
                                            const OptionalTensor& gate_bias,
                                            const RoutingParams& routing) {
  const DeviceGuard guard(call.prefix.get_device_index());
  const Tensor hidden = attn_res_on_gpu(call);
  auto [weights, ids, logits] = route_on_gpu({call.op, nullptr, hidden, w, bias, gate_bias, routing});
  return {hidden, weights, ids, logits};
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("attn_res_router", TORCH_BOX(&attn_res_router_op<attn_res_router_on_gpu>));
}

}  // namespace kimi
