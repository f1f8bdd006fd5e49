#pragma once

#include <string>
#include <tuple>

#include "moe_routing.h"
#include "torch_stable.h"

namespace kimi {

inline constexpr const char* kRouterAndProjection = "router_and_projection";

// router_and_projection's contract (every implementation calls it first): the router op's,
// bf16 hidden_states, and projection_weight bf16 [L, K] on hidden_states' device.
void check_projection_inputs(const Tensor& x, const Tensor& w, const Tensor& p,
                             const OptionalTensor& bias, const OptionalTensor& gate_bias,
                             const RoutingParams& r);

using RouterProjectionOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// The op over one implementation Run(x, w, p, bias, gate_bias, routing): the CPU's reference
// or the CUDA dispatch.
template <RouterProjectionOutputs (*Run)(const Tensor&, const Tensor&, const Tensor&,
                                         const OptionalTensor&, const OptionalTensor&,
                                         const RoutingParams&)>
struct RouterProjectionOp {
  static RouterProjectionOutputs call(const Tensor& x, const Tensor& w, const Tensor& p,
                                      const OptionalTensor& bias, int64_t top_k, int64_t n_group,
                                      int64_t topk_group, bool renormalize,
                                      double routed_scaling_factor, const std::string& scoring,
                                      const OptionalTensor& gate_bias) {
    return Run(x, w, p, bias, gate_bias,
               routing_params(kRouterAndProjection, top_k, n_group, topk_group, renormalize,
                              routed_scaling_factor, scoring));
  }
};

}  // namespace kimi
