// The router and a second projection of the same hidden states in one op: Kimi-K3's MoE front,
// where the gate (N 896) and the latent MoE's down-projection (7168 -> 3584) both read the
// AttnRes output.
//
//   (topk_weights, topk_ids, logits) = router(hidden_states, router_weight, ...)   exactly
//   projection = bf16(hidden_states · projection_weightᵀ)    fp32 products and sums, one rounding
//
// The CPU runs the router's reference and the GEMM's. CUDA (below)
// runs one grid for both weight streams where a row of tables.projection.PROJECTION_KERNELS serves the
// problem, then the routing op's kernel; otherwise the router op's dispatch and the GEMM op's.

#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"
#include "router_projection.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#endif

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

#ifdef KIMI_WITH_CUDA

// CUDA implementation of router_and_projection: the gate and the projection in one grid (a
// Projection kernel), then the routing op's kernel, which waits on it through PDL; where no
// Projection kernel serves the problem, the router op's dispatch and the GEMM op's.

namespace {

// The Projection kernel for M tokens and K on compute capability sm, or nullptr.
const ProjectionKernel* projection_kernel(int64_t M, int64_t K, int sm) {
  return find_kernel(kProjectionKernels, sm, [&](const ProjectionKernel& k) {
    return k.m_lo <= M && M <= k.m_hi && K <= k.max_k;
  });
}

RouterProjectionOutputs router_projection_cuda(const Tensor& x_in, const Tensor& w_in,
                                               const Tensor& p_in, const OptionalTensor& bias,
                                               const OptionalTensor& gate_bias,
                                               const RoutingParams& routing) {
  check_projection_inputs(x_in, w_in, p_in, bias, gate_bias, routing);
  const DeviceGuard guard(x_in.get_device_index());
  const Tensor x = unit_inner_stride(x_in);
  const Tensor w = unit_inner_stride(w_in);
  const Tensor p = unit_inner_stride(p_in);
  const int64_t M = x.size(0), N = w.size(0), L = p.size(0), K = x.size(1);
  const int device = x.get_device_index();
  const int sm = device_sm(device);
  const ProjectionKernel* kernel =
      M == 0 || batch_invariant() || w.scalar_type() != kBFloat16 ||
              !kernels_support(sm, std::max(N, L), K) || !vec16_ok(x, w) || !vec16_ok(x, p)
          ? nullptr
          : projection_kernel(M, K, sm);
  if (kernel == nullptr) {
    auto [weights, ids, logits] = route_on_gpu({kRouterAndProjection, nullptr, x, w, bias,
                                                gate_bias, routing});
    return {weights, ids, logits, gemm_on_gpu(x, p, std::nullopt, kBFloat16)};
  }
  Tensor logits = empty_on(x, {M, N}, kFloat);
  Tensor projection = empty_on(x, {M, L}, kBFloat16);
  ProjectionArgs args{};
  const Tensor gate = put_gemm_operands(args, x, w, gate_bias);
  args.logits = matrix_arg(logits);
  args.p = matrix_arg(p);
  args.projection = matrix_arg(projection);
  args.ctas = kernel->ctas_per_sm * device_sm_count(device);
  launch_kernel(kProjectionKernels, *kernel, args, device, current_stream(device));
  auto [weights, ids] = moe_routing_on_gpu(logits, bias, routing);
  return {weights, ids, logits, projection};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("router_and_projection", TORCH_BOX(&RouterProjectionOp<router_projection_cuda>::call));
}

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
