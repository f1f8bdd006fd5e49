// Kimi-K3's pre-MoE front in one op: its attention residual, then its router.
//
//   attn_res_router(prefix, delta, blocks, ..., output_norm_eps, router_weight, ...)
//       = (hidden, *router(hidden, router_weight, ...)),
//         hidden = attn_res(prefix, delta, blocks, ..., output_norm_eps)
//
// exactly the composition of the two ops on the same device, attn_res's writes into prefix
// and blocks included: the CPU runs the references, CUDA (below)
// the AttnRes kernel, then the router op's dispatch.

#include "attn_res_router.h"
#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#endif

namespace kimi {

void check_attn_res_router_inputs(const AttnResCall& call, const Tensor& w,
                                  const OptionalTensor& bias, const OptionalTensor& gate_bias,
                                  const RoutingParams& r) {
  const char* op = call.op;
  check_attn_res_inputs(call);
  const Tensor& prefix = call.prefix;
  // The router reads the hidden states attn_res returns: prefix's shape, dtype and device.
  KIMI_CHECK(w.dim() == 2 && w.size(1) == prefix.size(1), op,
             ": router_weight must be 2-D [N, H] with prefix's H=", prefix.size(1), ", got ",
             w.sizes());
  KIMI_CHECK(w.device() == prefix.device(), op,
             ": prefix and router_weight must be on the same device, got ", prefix.device(),
             " and ", w.device());
  check_router_inputs(op, prefix, w, bias, gate_bias, r);
}

namespace {

AttnResRouterOutputs attn_res_router_reference(const AttnResCall& call, const Tensor& w,
                                               const OptionalTensor& bias,
                                               const OptionalTensor& gate_bias,
                                               const RoutingParams& r) {
  const Tensor hidden = attn_res_reference(call);
  const Tensor logits = gemm_reference(hidden, w, gate_bias, kFloat);
  auto [weights, ids] = routing_reference(logits, bias, r);
  return {hidden, weights, ids, logits};
}

}  // namespace

// prefix is written when a delta is given, blocks when block_write_idx >= 0 (as attn_res).
STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def("attn_res_router(" KIMI_ATTN_RES_ARGS ", Tensor router_weight, " KIMI_ROUTING_ARGS
        ", Tensor? gate_bias=None) -> (Tensor hidden, Tensor topk_weights, Tensor topk_ids, "
        "Tensor logits)");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("attn_res_router", TORCH_BOX(&attn_res_router_op<attn_res_router_reference>));
}

#ifdef KIMI_WITH_CUDA

// CUDA implementation of attn_res_router: the AttnRes kernel (which releases the next launch
// at its entry), then the router op's dispatch, whose kernels stream their weights before
// their PDL wait. Not one kernel: every router CTA would recompute AttnRes's mix of the
// token's 9 sources (docs/kernel-notes.md, "The norm in the router's prologue").

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

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
