#pragma once

#include <string>
#include <tuple>

#include "kimi_tables.h"
#include "moe_routing.h"
#include "torch_stable.h"

namespace kimi {

// The router ops' input contract (every implementation calls it first): ll_bf16_router's
// (bf16 only, no gate bias) where op is "ll_bf16_router", router's otherwise.
void check_router_inputs(const char* op, const Tensor& x, const Tensor& w,
                         const OptionalTensor& bias, const OptionalTensor& gate_bias,
                         const RoutingParams& r);

// What the choice of a fused router row depends on besides the routing arguments.
struct RouterProblem {
  int64_t M, N, K;
  ScalarType x_dtype, weight_dtype;
  int64_t sm;
  bool vec16_ok;  // the inputs allow 16-byte loads of the weights
};

// The fused router row for a problem, or nullptr (the GEMM op's kernel, then the routing
// op's).
const RouterRow* choose_router(const RouterProblem& p, const RoutingParams& r);

// Why `row` cannot run a problem ("" if it can).
std::string router_row_misfit(const RouterRow& row, const RouterProblem& p,
                              const RoutingParams& r);

// The router table row called `name`; an error listing the valid names if there is none.
const RouterRow& router_row_by_name(const std::string& name);

// Where a router writes (router_out): logits fp32 [M, N] and the routing's outputs.
struct RouterDestination {
  Tensor logits;
  RoutingOutputs routing;
};

// router_out's contract on its outputs (besides the inputs' check_router_inputs).
void check_router_outputs(const char* op, const Tensor& x, const Tensor& w,
                          const RoutingParams& r, const RouterDestination& out);

// One router call as its implementations take it: `op` names the op whose contract applies
// (check_router_inputs, which every implementation calls first); `forced` is the named row,
// or nullptr for the automatic choice; `into` the caller's outputs (checked by the caller),
// which the call returns, or nullptr for new tensors.
struct RouterCall {
  const char* op;
  const RouterRow* forced;
  const Tensor& x;
  const Tensor& w;
  const OptionalTensor& bias;
  const OptionalTensor& gate_bias;
  const RoutingParams& routing;
  const RouterDestination* into = nullptr;
};
using RouterOutputs = std::tuple<Tensor, Tensor, Tensor>;

#ifdef KIMI_WITH_CUDA
// The router of CUDA inputs on the current stream (csrc/ll_bf16_router.cpp).
RouterOutputs route_on_gpu(const RouterCall& call);
#endif

// The four router ops over one implementation: the CPU's reference or the CUDA dispatch.
template <RouterOutputs (*Route)(const RouterCall&)>
struct RouterOps {
  static RouterOutputs ll_bf16_router(const Tensor& x, const Tensor& w, const OptionalTensor& bias,
                                      int64_t top_k, int64_t n_group, int64_t topk_group,
                                      bool renormalize, double routed_scaling_factor,
                                      const std::string& scoring) {
    const char* op = "ll_bf16_router";
    return Route({op, nullptr, x, w, bias, std::nullopt,
                  routing_params(op, top_k, n_group, topk_group, renormalize,
                                 routed_scaling_factor, scoring)});
  }

  static RouterOutputs router(const Tensor& x, const Tensor& w, const OptionalTensor& bias,
                              int64_t top_k, int64_t n_group, int64_t topk_group,
                              bool renormalize, double routed_scaling_factor,
                              const std::string& scoring, const OptionalTensor& gate_bias,
                              const OptionalTensor& input_ids, const OptionalTensor& hash_table) {
    const char* op = "router";
    return Route({op, nullptr, x, w, bias, gate_bias,
                  routing_params(op, top_k, n_group, topk_group, renormalize,
                                 routed_scaling_factor, scoring, input_ids, hash_table)});
  }

  static RouterOutputs router_with_variant(
      const Tensor& x, const Tensor& w, const OptionalTensor& bias, int64_t top_k,
      int64_t n_group, int64_t topk_group, bool renormalize, double routed_scaling_factor,
      const std::string& variant, const std::string& scoring, const OptionalTensor& gate_bias,
      const OptionalTensor& input_ids, const OptionalTensor& hash_table) {
    const char* op = "router_with_variant";
    return Route({op, &router_row_by_name(variant), x, w, bias, gate_bias,
                  routing_params(op, top_k, n_group, topk_group, renormalize,
                                 routed_scaling_factor, scoring, input_ids, hash_table)});
  }

  // `router` into the caller's tensors (CUDA graphs' static buffers), with expert counts and
  // shared-expert slots: moe_routing_out's outputs, and logits.
  static void router_out(const Tensor& x, const Tensor& w, const OptionalTensor& bias,
                         int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize,
                         double routed_scaling_factor, const std::string& scoring,
                         const OptionalTensor& gate_bias, const OptionalTensor& input_ids,
                         const OptionalTensor& hash_table, const Tensor& topk_weights,
                         const Tensor& topk_ids, const OptionalTensor& expert_counts,
                         int64_t num_fused_shared_experts, double shared_expert_weight,
                         const Tensor& logits) {
    const char* op = "router_out";
    const RoutingParams r = routing_params_out(
        op, top_k, n_group, topk_group, renormalize, routed_scaling_factor, scoring, input_ids,
        hash_table, num_fused_shared_experts, shared_expert_weight);
    check_router_inputs(op, x, w, bias, gate_bias, r);
    const RouterDestination out{logits, {topk_weights, topk_ids, expert_counts}};
    check_router_outputs(op, x, w, r, out);
    Route({op, nullptr, x, w, bias, gate_bias, r, &out});
  }

  // Registers the four for one dispatch key (STABLE_TORCH_LIBRARY_IMPL's library).
  template <typename Library>
  static void impl(Library& m) {
    m.impl("ll_bf16_router", TORCH_BOX(&ll_bf16_router));
    m.impl("router", TORCH_BOX(&router));
    m.impl("router_with_variant", TORCH_BOX(&router_with_variant));
    m.impl("router_out", TORCH_BOX(&router_out));
  }
};

}  // namespace kimi
