// Kimi-K3's pre-MoE front in one op: its attention residual, then its router.
//
//   attn_res_router(prefix, delta, blocks, ..., output_norm_eps, router_weight, ...)
//       = (hidden, *router(hidden, router_weight, ...)),
//         hidden = attn_res(prefix, delta, blocks, ..., output_norm_eps)
//
// exactly the composition of the two ops on the same device, attn_res's writes into prefix
// and blocks included: the CPU runs the references, CUDA (csrc/cuda/attn_res_router_cuda.cpp)
// the AttnRes kernel, then the router op's dispatch.

#include "attn_res_router.h"
#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"

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

}  // namespace kimi
