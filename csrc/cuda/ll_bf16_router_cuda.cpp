// CUDA implementation of the router op: one fused kernel (GEMM + routing) where a row of the
// router table applies, the GEMM op's kernel and then the routing op's otherwise.

#include "kernel_support.h"
#include "kimi_kernels.h"
#include "kimi_variant_table.h"
#include "router_handoff.h"
#include "../ll_bf16_gemm.h"
#include "../ll_bf16_router.h"
#include "../moe_routing.h"

namespace kimi {

namespace {

const CompiledRouterKernel& find_router_kernel(const RouterRow& row, ScalarType bias_dtype,
                                               int sm) {
  const int router = static_cast<int>(&row - kRouterRows);
  for (const CompiledRouterKernel& kernel : kCompiledRouterKernels) {
    if (kernel.router == router && kernel.bias_dtype == bias_dtype && kernel.sm == sm) {
      return kernel;
    }
  }
  throw std::runtime_error(
      message("ll_bf16_router: no compiled kernel ", row.name, " for sm_", sm));
}

// `forced`: the row named by ll_bf16_router_with_variant, or nullptr for the automatic choice.
std::tuple<Tensor, Tensor, Tensor> route_on_gpu(const RouterRow* forced, const Tensor& x_in,
                                                const Tensor& w_in, const OptionalTensor& bias_in,
                                                int64_t top_k, int64_t n_group,
                                                int64_t topk_group, bool renormalize,
                                                double routed_scaling_factor,
                                                const std::string& scoring_name) {
  const Scoring scoring = parse_scoring("ll_bf16_router", scoring_name);
  check_router_inputs(x_in, w_in, bias_in, top_k, n_group, topk_group, scoring);
  const DeviceGuard guard(x_in.get_device_index());
  const Tensor x = unit_inner_stride(x_in);
  const Tensor w = unit_inner_stride(w_in);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  const int device = x.get_device_index();
  const int sm = device_sm(device);
  const bool vec8 = M > 0 && vec8_aligned(x) && vec8_aligned(w);
  const RouterRow* row = M == 0 ? nullptr : forced;  // no rows: the two launches, empty
  if (row != nullptr) {
    const std::string misfit =
        router_row_misfit(*forced, M, N, K, top_k, n_group, topk_group, sm, vec8);
    KIMI_CHECK(misfit.empty(), "ll_bf16_router_with_variant: variant ", forced->name, " ",
                     misfit);
  } else if (M > 0) {
    row = choose_router(M, N, K, top_k, n_group, topk_group, sm, vec8);
  }
  if (row == nullptr) {
    // Two launches: the GEMM op's kernel, then the routing kernel (the ATen reference where
    // none fits), which waits on it through PDL.
    const Tensor logits = gemm_on_gpu(x, w, kFloat);
    auto [weights, ids] = moe_routing_on_gpu(logits, bias_in, top_k, n_group, topk_group,
                                             renormalize, routed_scaling_factor, scoring);
    return {weights, ids, logits};
  }
  Tensor logits = empty_on(x, {M, N}, kFloat);
  Tensor weights = empty_on(x, {M, top_k}, kFloat);
  Tensor ids = empty_on(x, {M, top_k}, kInt);
  // The bias as a [1, N] row with unit stride; without one, the fp32 kernel runs with
  // has_bias = 0 and never reads the (stand-in) pointer.
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : logits;
  const CompiledRouterKernel& kernel = find_router_kernel(*row, bias.scalar_type(), sm);
  ensure_loaded(kCompiledRouterKernels, device);
  const cudaStream_t stream = current_stream(device);
  RouterArgs args{
      matrix_arg(x), matrix_arg(w),
      TensorArg{bias.data_ptr(), {1, int32_t(N)}, {N}}, matrix_arg(logits),
      matrix_arg(weights), matrix_arg(ids),
      TensorArg{router_handoff(device, stream, M * N), {int32_t(M), int32_t(N)}, {N}},
      int32_t(top_k), int32_t(n_group), int32_t(topk_group), renormalize ? 1 : 0,
      bias_in.has_value() ? 1 : 0, scoring == Scoring::kSoftmax ? 1 : 0,
      static_cast<float>(routed_scaling_factor)};
  const int32_t err = kernel.launch(&args, stream);
  check_cuda(static_cast<cudaError_t>(err), "launching", kernel.symbol);
  return {weights, ids, logits};
}

std::tuple<Tensor, Tensor, Tensor> ll_bf16_router_cuda(const Tensor& x, const Tensor& w,
                                                       const OptionalTensor& bias, int64_t top_k,
                                                       int64_t n_group, int64_t topk_group,
                                                       bool renormalize,
                                                       double routed_scaling_factor,
                                                       const std::string& scoring) {
  return route_on_gpu(nullptr, x, w, bias, top_k, n_group, topk_group, renormalize,
                      routed_scaling_factor, scoring);
}

std::tuple<Tensor, Tensor, Tensor> ll_bf16_router_with_variant_cuda(
    const Tensor& x, const Tensor& w, const OptionalTensor& bias, int64_t top_k, int64_t n_group,
    int64_t topk_group, bool renormalize, double routed_scaling_factor,
    const std::string& variant, const std::string& scoring) {
  return route_on_gpu(&router_row_by_name(variant), x, w, bias, top_k, n_group, topk_group,
                      renormalize, routed_scaling_factor, scoring);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("ll_bf16_router", TORCH_BOX(&ll_bf16_router_cuda));
  m.impl("ll_bf16_router_with_variant", TORCH_BOX(&ll_bf16_router_with_variant_cuda));
}

}  // namespace kimi
