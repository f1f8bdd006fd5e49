// CUDA implementation of the router op: one fused kernel (GEMM + routing) where a row of the
// router table applies, the GEMM op's kernel and then the routing op's otherwise.

#include "kernel_support.h"
#include "router_handoff.h"
#include "../ll_bf16_gemm.h"
#include "../ll_bf16_router.h"
#include "../moe_routing.h"

namespace kimi {

namespace {

const RouterKernel& router_kernel(const RouterRow& row, ScalarType bias_dtype, int sm) {
  const int router = static_cast<int>(&row - kRouterRows);
  const RouterKernel* kernel = find_kernel(kRouterKernels, sm, [&](const RouterKernel& k) {
    return k.router == router && k.bias_dtype == bias_dtype;
  });
  KIMI_CHECK(kernel != nullptr, "ll_bf16_router: no compiled kernel ", row.name, " for sm_", sm);
  return *kernel;
}

}  // namespace

RouterOutputs route_on_gpu(const RouterCall& call) {
  const auto& [op, forced, x_in, w_in, bias_in, gate_bias, routing, into] = call;
  check_router_inputs(op, x_in, w_in, bias_in, gate_bias, routing);
  const DeviceGuard guard(x_in.get_device_index());
  const Tensor x = unit_inner_stride(x_in);
  const Tensor w = unit_inner_stride(w_in);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  const int device = x.get_device_index();
  const int sm = device_sm(device);
  const RouterProblem problem{M, N, K, x.scalar_type(), w.scalar_type(), sm,
                              M > 0 && vec16_ok(x, w)};
  const RouterRow* row = M == 0 ? nullptr : forced;  // no rows: the two launches, empty
  if (row != nullptr) {
    const std::string misfit = router_row_misfit(*forced, problem, routing);
    KIMI_CHECK(misfit.empty(), "router_with_variant: variant ", forced->name, " ",
               misfit);
  } else if (M > 0) {
    row = choose_router(problem, routing);
  }
  if (row == nullptr) {
    // Two launches: the GEMM op's kernel, then the routing kernel (the ATen reference where
    // none fits), which waits on it through PDL.
    if (into == nullptr) {
      const Tensor logits = gemm_on_gpu(x, w, gate_bias, kFloat);
      auto [weights, ids] = moe_routing_on_gpu(logits, bias_in, routing);
      return {weights, ids, logits};
    }
    gemm_on_gpu(x, w, gate_bias, kFloat, &into->logits);
    moe_routing_on_gpu_into(into->logits, bias_in, routing, into->routing);
    return {into->routing.weights, into->routing.ids, into->logits};
  }
  const RouterDestination out =
      into != nullptr ? *into
                      : RouterDestination{empty_on(x, {M, N}, kFloat),
                                          {empty_on(x, {M, routing.width()}, kFloat),
                                           empty_on(x, {M, routing.width()}, kInt), std::nullopt}};
  // The routing bias as a [1, N] row with unit stride; a missing one is a stand-in the kernel
  // never reads (has_bias = 0): the logits, for the fp32 kernels' bias.
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : out.logits;
  const RouterKernel& kernel = router_kernel(*row, bias.scalar_type(), sm);
  const cudaStream_t stream = current_stream(device);
  RouterArgs args{};
  const Tensor gate = put_gemm_operands(args, x, w, gate_bias);
  args.bias = row_arg(bias, N);
  args.logits = matrix_arg(out.logits);
  args.handoff = {router_handoff(device, stream, M * N), {int32_t(M), int32_t(N)}, {N}};
  const HashArgs hash = hash_args(routing.input_ids, routing.hash_table, out.routing.weights);
  args.input_ids = hash.input_ids;
  args.hash_table = hash.hash_table;
  args.routing = routing.kernel_scalars(bias_in.has_value());
  put_routing_outputs(args, out.routing, N, routing);
  launch_kernel(kRouterKernels, kernel, args, device, stream);
  return {out.routing.weights, out.routing.ids, out.logits};
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) { RouterOps<route_on_gpu>::impl(m); }

}  // namespace kimi
