#pragma once

#include <string>
#include <tuple>

#include "moe_routing.h"
#include "torch_stable.h"

namespace kimi {

// The norm -> router fronts' contract (every implementation calls it first): the norm op's on
// hidden_states, residual (nullptr: rms_norm_router), norm_weight and eps, then the router
// op's on hidden_states and router_weight.
void check_norm_router_inputs(const char* op, const Tensor& x, const Tensor* residual,
                              const Tensor& norm_weight, double eps, const Tensor& w,
                              const OptionalTensor& bias, const OptionalTensor& gate_bias,
                              const RoutingParams& r);

// (normed, residual_out, topk_weights, topk_ids, logits); without a residual, residual_out
// is `normed` again (rms_norm_router returns the other four).
using NormRouterOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
using NormRouterFn = NormRouterOutputs (*)(const char* op, const Tensor& x, const Tensor* residual,
                                           const Tensor& norm_weight, double eps, const Tensor& w,
                                           const OptionalTensor& bias,
                                           const OptionalTensor& gate_bias,
                                           const RoutingParams& r);

#ifdef KIMI_WITH_CUDA
// The fronts on CUDA inputs, on the current stream (csrc/norm_router.cpp).
NormRouterOutputs norm_router_on_gpu(const char* op, const Tensor& x, const Tensor* residual,
                                     const Tensor& norm_weight, double eps, const Tensor& w,
                                     const OptionalTensor& bias, const OptionalTensor& gate_bias,
                                     const RoutingParams& r);
#endif

// The two ops over one implementation: the CPU's reference or the CUDA dispatch.
template <NormRouterFn Run>
struct NormRouterOps {
  static std::tuple<Tensor, Tensor, Tensor, Tensor> rms_norm_router(
      const Tensor& x, const Tensor& norm_weight, double eps, const Tensor& w,
      const OptionalTensor& bias, int64_t top_k, int64_t n_group, int64_t topk_group,
      bool renormalize, double routed_scaling_factor, const std::string& scoring,
      const OptionalTensor& gate_bias, const OptionalTensor& input_ids,
      const OptionalTensor& hash_table) {
    const char* op = "rms_norm_router";
    auto [normed, unused, weights, ids, logits] =
        Run(op, x, nullptr, norm_weight, eps, w, bias, gate_bias,
            routing_params(op, top_k, n_group, topk_group, renormalize, routed_scaling_factor,
                           scoring, input_ids, hash_table));
    return {normed, weights, ids, logits};
  }

  static NormRouterOutputs fused_add_rms_norm_router(
      const Tensor& x, const Tensor& residual, const Tensor& norm_weight, double eps,
      const Tensor& w, const OptionalTensor& bias, int64_t top_k, int64_t n_group,
      int64_t topk_group, bool renormalize, double routed_scaling_factor,
      const std::string& scoring, const OptionalTensor& gate_bias,
      const OptionalTensor& input_ids, const OptionalTensor& hash_table) {
    const char* op = "fused_add_rms_norm_router";
    return Run(op, x, &residual, norm_weight, eps, w, bias, gate_bias,
               routing_params(op, top_k, n_group, topk_group, renormalize,
                              routed_scaling_factor, scoring, input_ids, hash_table));
  }

  // Registers both for one dispatch key (STABLE_TORCH_LIBRARY_IMPL's library).
  template <typename Library>
  static void impl(Library& m) {
    m.impl("rms_norm_router", TORCH_BOX(&rms_norm_router));
    m.impl("fused_add_rms_norm_router", TORCH_BOX(&fused_add_rms_norm_router));
  }
};

}  // namespace kimi
