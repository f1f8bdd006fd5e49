// CUDA implementation of the router op: one fused kernel (GEMM + routing) where a row of the
// router table applies, the GEMM op and then the routing op's kernel otherwise.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "kernel_support.h"
#include "kimi_kernels.h"
#include "kimi_variant_table.h"
#include "router_handoff.h"
#include "../ll_bf16_router.h"
#include "../moe_routing.h"

namespace kimi {

namespace {

const CompiledRouterKernel& find_router_kernel(const RouterRow& row, c10::ScalarType bias_dtype,
                                               int sm) {
  const int router = static_cast<int>(&row - kRouterRows);
  for (const CompiledRouterKernel& kernel : kCompiledRouterKernels) {
    if (kernel.router == router && kernel.bias_dtype == bias_dtype && kernel.sm == sm) {
      return kernel;
    }
  }
  TORCH_CHECK(false, "ll_bf16_router: no compiled kernel ", row.name, " for sm_", sm);
}

// `forced`: the row named by ll_bf16_router_with_variant, or nullptr for the automatic choice.
std::tuple<at::Tensor, at::Tensor, at::Tensor> route_on_gpu(
    const RouterRow* forced, const at::Tensor& x_in, const at::Tensor& w_in,
    const std::optional<at::Tensor>& bias_in, int64_t top_k, int64_t n_group,
    int64_t topk_group, bool renormalize, double routed_scaling_factor) {
  check_router_inputs(x_in, w_in, bias_in, top_k, n_group, topk_group);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = unit_inner_stride(x_in);
  const at::Tensor w = unit_inner_stride(w_in);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  const int device = x.get_device();
  const int sm = device_sm(device);
  const bool vec8 = vec8_aligned(x) && vec8_aligned(w);
  const RouterRow* row = M == 0 ? nullptr : forced;  // no rows: the two launches, empty
  if (row != nullptr) {
    const std::string misfit =
        router_row_misfit(*forced, M, N, K, top_k, n_group, topk_group, sm, vec8);
    TORCH_CHECK_VALUE(misfit.empty(), "ll_bf16_router_with_variant: variant ", forced->name,
                      " ", misfit);
  } else if (M > 0) {
    row = choose_router(M, N, K, top_k, n_group, topk_group, sm, vec8);
  }
  if (row == nullptr) {
    // Two launches: the GEMM op's kernel, then the routing kernel (the ATen reference where
    // none fits), which waits on it through PDL.
    const at::Tensor logits = ll_bf16_gemm_logits(x, w);
    auto [weights, ids] = moe_routing_on_gpu(logits, bias_in, top_k, n_group, topk_group,
                                             renormalize, routed_scaling_factor);
    return {weights, ids, logits};
  }
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor logits = at::empty({M, N}, f32);
  at::Tensor weights = at::empty({M, top_k}, f32);
  at::Tensor ids = at::empty({M, top_k}, x.options().dtype(at::kInt));
  // The bias as a [1, N] row with unit stride; without one, the fp32 kernel runs with
  // has_bias = 0 and never reads the (stand-in) pointer.
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous().view({1, N}) : logits;
  const CompiledRouterKernel& kernel = find_router_kernel(*row, bias.scalar_type(), sm);
  ensure_loaded(kCompiledRouterKernels, device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device);
  RouterArgs args{
      matrix_arg(x), matrix_arg(w), matrix_arg(bias.narrow(0, 0, 1)), matrix_arg(logits),
      matrix_arg(weights), matrix_arg(ids),
      TensorArg{router_handoff(device, stream, M * N), {int32_t(M), int32_t(N)}, {N}},
      int32_t(top_k), int32_t(n_group), int32_t(topk_group), renormalize ? 1 : 0,
      bias_in.has_value() ? 1 : 0, static_cast<float>(routed_scaling_factor)};
  const int32_t err = kernel.launch(&args, stream);
  check_cuda(static_cast<cudaError_t>(err), "launching", kernel.symbol);
  return {weights, ids, logits};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ll_bf16_router_cuda(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
    int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize,
    double routed_scaling_factor) {
  return route_on_gpu(nullptr, x, w, bias, top_k, n_group, topk_group, renormalize,
                      routed_scaling_factor);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ll_bf16_router_with_variant_cuda(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
    int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize,
    double routed_scaling_factor, const std::string& variant) {
  return route_on_gpu(&router_row_by_name(variant), x, w, bias, top_k, n_group, topk_group,
                      renormalize, routed_scaling_factor);
}

}  // namespace

TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("ll_bf16_router", &ll_bf16_router_cuda);
  m.impl("ll_bf16_router_with_variant", &ll_bf16_router_with_variant_cuda);
}

}  // namespace kimi
