#pragma once

#include <string>
#include <tuple>

#include "attn_res.h"
#include "moe_routing.h"
#include "torch_stable.h"

namespace kimi {

inline constexpr const char* kAttnResRouter = "attn_res_router";

// attn_res_router's contract (every implementation calls it first, before writing
// anything): attn_res's on its arguments, then the router op's on a hidden [M, H] bf16 of
// prefix's shape and device, with router_weight [N, H].
void check_attn_res_router_inputs(const AttnResCall& call, const Tensor& w,
                                  const OptionalTensor& bias, const OptionalTensor& gate_bias,
                                  const RoutingParams& r);

// (hidden, topk_weights, topk_ids, logits)
using AttnResRouterOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using AttnResRouterFn = AttnResRouterOutputs (*)(const AttnResCall& call, const Tensor& w,
                                                 const OptionalTensor& bias,
                                                 const OptionalTensor& gate_bias,
                                                 const RoutingParams& r);

#ifdef KIMI_WITH_CUDA
// The front on CUDA inputs, on the current stream (csrc/attn_res_router.cpp).
AttnResRouterOutputs attn_res_router_on_gpu(const AttnResCall& call, const Tensor& w,
                                            const OptionalTensor& bias,
                                            const OptionalTensor& gate_bias,
                                            const RoutingParams& r);
#endif

// The op's entry point (its schema's arguments) over one implementation: the CPU's
// reference or the CUDA dispatch.
template <AttnResRouterFn Run>
AttnResRouterOutputs attn_res_router_op(
    const Tensor& prefix, const OptionalTensor& delta, const Tensor& blocks,
    const Tensor& norm_weight, const Tensor& qk_weight, const OptionalTensor& output_norm_weight,
    int64_t num_blocks, int64_t block_write_idx, double eps, double output_norm_eps,
    const Tensor& w, const OptionalTensor& bias, int64_t top_k, int64_t n_group,
    int64_t topk_group, bool renormalize, double routed_scaling_factor, const std::string& scoring,
    const OptionalTensor& gate_bias) {
  const AttnResCall call{prefix,     delta,           blocks,   norm_weight,     qk_weight,
                         output_norm_weight, num_blocks, block_write_idx, eps, output_norm_eps,
                         kAttnResRouter};
  const RoutingParams routing = routing_params(kAttnResRouter, top_k, n_group, topk_group,
                                               renormalize, routed_scaling_factor, scoring);
  check_attn_res_router_inputs(call, w, bias, gate_bias, routing);
  return Run(call, w, bias, gate_bias, routing);
}

}  // namespace kimi
