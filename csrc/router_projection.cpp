// The router and a second projection of the same hidden states in one op: Kimi-K3's MoE front,
// where the gate (N 896) and the latent MoE's down-projection (7168 -> 3584) both read the
// AttnRes output.
//
//   (topk_weights, topk_ids, logits) = router(hidden_states, router_weight, ...)   exactly
//   projection = bf16(hidden_states · projection_weightᵀ)    fp32 products and sums, one rounding
//
// The CPU runs the router's reference and the GEMM's. CUDA (csrc/cuda/router_projection_cuda.cpp)
// runs one grid for both weight streams where a row of tables.projection.PROJECTION_KERNELS serves the
// problem, then the routing op's kernel; otherwise the router op's dispatch and the GEMM op's.

#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"
#include "router_projection.h"

namespace kimi {

void check_projection_inputs(const Tensor& x, const Tensor& w, const Tensor& p,
                             const OptionalTensor& bias, const OptionalTensor& gate_bias,
                             const RoutingParams& r) {
  constexpr const char* op = kRouterAndProjection;
  check_router_inputs(op, x, w, bias, gate_bias, r);
  KIMI_CHECK(x.scalar_type() == kBFloat16, op, ": hidden_states must be torch.bfloat16, got ",
             dtype_name(x.scalar_type()));
  KIMI_CHECK(p.scalar_type() == kBFloat16, op,
             ": projection_weight must be torch.bfloat16, got ", dtype_name(p.scalar_type()));
  KIMI_CHECK(p.dim() == 2 && p.size(1) == x.size(1), op,
             ": projection_weight must be 2-D [L, K] with hidden_states' K=", x.size(1), ", got ",
             p.sizes());
  KIMI_CHECK(p.size(0) >= 1, op, ": projection_weight must have L >= 1 rows, got ", p.sizes());
  KIMI_CHECK(p.device() == x.device(), op,
             ": hidden_states and projection_weight must be on the same device, got ", x.device(),
             " and ", p.device());
}

namespace {

RouterProjectionOutputs router_projection_reference(const Tensor& x, const Tensor& w,
                                                    const Tensor& p, const OptionalTensor& bias,
                                                    const OptionalTensor& gate_bias,
                                                    const RoutingParams& r) {
  check_projection_inputs(x, w, p, bias, gate_bias, r);
  const Tensor logits = gemm_reference(x, w, gate_bias, kFloat);
  auto [weights, ids] = routing_reference(logits, bias, r);
  return {weights, ids, logits, gemm_reference(x, p, std::nullopt, kBFloat16)};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def(
      "router_and_projection(Tensor hidden_states, Tensor router_weight, "
      "Tensor projection_weight, " KIMI_ROUTING_ARGS ", Tensor? gate_bias=None) "
      "-> (Tensor topk_weights, Tensor topk_ids, Tensor logits, Tensor projection)");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("router_and_projection",
         TORCH_BOX(&RouterProjectionOp<router_projection_reference>::call));
}

}  // namespace kimi
