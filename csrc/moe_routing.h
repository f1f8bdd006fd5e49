#pragma once

#include <string>
#include <tuple>

#include "kimi_tables.h"  // Scoring, RoutingScalars (generated from kimi_router_ops/tables/)
#include "torch_stable.h"

namespace kimi {

// The routing arguments of one call, as the routing ops take them.
struct RoutingParams {
  int64_t top_k, n_group, topk_group;
  bool renormalize;
  double routed_scaling_factor;
  Scoring scoring;
  // A hash-routed layer (DeepSeek-V4's first ones): ids = hash_table[input_ids], input_ids
  // int32/int64 [M], hash_table int32/int64 [V, top_k]; both or neither.
  OptionalTensor input_ids, hash_table;
  // Fused shared experts (the `_out` ops): `shared_experts` slots after the top_k, ids N,
  // N + 1, ..., each of weight `shared_expert_weight` (SGLang's moe_fused_gate convention).
  int64_t shared_experts = 0;
  double shared_expert_weight = 1.0;

  bool hashed() const { return hash_table.has_value(); }
  // Slots a token's outputs hold: the top_k picks, then the shared experts.
  int64_t width() const { return top_k + shared_experts; }
  // The same as the kernels take them, with or without a score-correction bias (one int32
  // word an id, no expert counts: put_routing_outputs sets those).
  RoutingScalars kernel_scalars(bool has_bias) const;
};

// Where a routing writes: topk_weights fp32 and topk_ids int32 or int64 [M, width], each with
// a unit stride along its last dimension, and optionally expert counts int32 [N +
// shared_experts], added to (bincount of the ids). The functional ops allocate them; the
// `_out` ops take the caller's.
struct RoutingOutputs {
  Tensor weights, ids;
  OptionalTensor counts;
};

// The `_out` ops' routing arguments: `routing_params`'s, plus the shared-expert slots,
// checked (count >= 0, a finite weight).
RoutingParams routing_params_out(const char* op, int64_t top_k, int64_t n_group, int64_t topk_group,
                                 bool renormalize, double routed_scaling_factor,
                                 const std::string& scoring, const OptionalTensor& input_ids,
                                 const OptionalTensor& hash_table, int64_t num_fused_shared_experts,
                                 double shared_expert_weight);

// The `_out` ops' contract on their outputs for M tokens and N experts on `device`: dtypes,
// shapes, unit inner strides, devices.
void check_routing_outputs(const char* op, int64_t M, int64_t N, const Device& device,
                           const RoutingParams& r, const RoutingOutputs& out);

// Writes a reference routing (weights fp32, ids int32 [M, top_k]) into `out`: the picks,
// the shared-expert slots, the counts.
void write_routing(const Tensor& weights, const Tensor& ids, int64_t N, const RoutingParams& r,
                   const RoutingOutputs& out);

// The routing arguments of every routing op after its tensors, the bias first (its schema's
// text, written once).
#define KIMI_ROUTING_ARGS                                                                   \
  "Tensor? e_score_correction_bias, int top_k, int n_group=1, int topk_group=1, "         \
  "bool renormalize=True, float routed_scaling_factor=1.0, str scoring=\"sigmoid\""

// The routing arguments of every `_out` op after its inputs: where it writes (the caller's
// buffers, for CUDA graphs), what it adds (expert counts) and the shared-expert slots.
#define KIMI_ROUTING_OUT_ARGS                                                               \
  "*, Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor(c!)? expert_counts=None, "      \
  "int num_fused_shared_experts=0, float shared_expert_weight=1.0"

// The routing arguments of a call of `op`, its `scoring` argument checked (the name of a
// Scoring, lower case).
RoutingParams routing_params(const char* op, int64_t top_k, int64_t n_group, int64_t topk_group,
                             bool renormalize, double routed_scaling_factor,
                             const std::string& scoring,
                             const OptionalTensor& input_ids = std::nullopt,
                             const OptionalTensor& hash_table = std::nullopt);

// A routed tensor's dtype (logits, e_score_correction_bias): fp32 or bf16.
void check_routed_dtype(const char* op, const char* name, ScalarType dtype);

// The routing's contract on M tokens and N experts (every routing op calls it; `op` names
// the op in the messages): n_group, topk_group, top_k, the bias and the hash routing's
// tensors (on the CPU, their values too). `device` is where the tensors must be (nullopt:
// no device to compare, as for the op that only names a kernel).
void check_routing_args(const char* op, int64_t M, int64_t N, const std::optional<Device>& device,
                        const char* device_of, const OptionalTensor& bias,
                        const RoutingParams& r);

// The routing op's input contract: logits fp32 or bf16 [M, N], then check_routing_args.
void check_moe_routing_inputs(const Tensor& logits, const OptionalTensor& bias,
                              const RoutingParams& r);

// moe_routing_out's contract (every implementation calls it first): its routing parameters,
// checked with the logits, the bias and the caller's outputs.
RoutingParams moe_routing_out_params(const Tensor& logits, const OptionalTensor& bias,
                                     int64_t top_k, int64_t n_group, int64_t topk_group,
                                     bool renormalize, double routed_scaling_factor,
                                     const std::string& scoring, const OptionalTensor& input_ids,
                                     const OptionalTensor& hash_table,
                                     int64_t num_fused_shared_experts,
                                     double shared_expert_weight, const RoutingOutputs& out);

// The routing as ATen ops, on checked fp32 or bf16 logits [M, N]: (weights, ids).
std::tuple<Tensor, Tensor> routing_reference(const Tensor& logits, const OptionalTensor& bias,
                                             const RoutingParams& r);
// The same into `out` (checked).
void routing_reference_into(const Tensor& logits, const OptionalTensor& bias,
                            const RoutingParams& r, const RoutingOutputs& out);

// Whether the routing kernel serves a problem on a GPU of compute capability sm.
bool routing_kernel_fits(int64_t N, const RoutingParams& r, int64_t sm);

#ifdef KIMI_WITH_CUDA
// The routing of checked CUDA logits on the current stream: the kernel where it fits,
// the reference otherwise (csrc/moe_routing.cpp).
std::tuple<Tensor, Tensor> moe_routing_on_gpu(const Tensor& logits, const OptionalTensor& bias,
                                              const RoutingParams& r);
// The same into `out` (checked).
void moe_routing_on_gpu_into(const Tensor& logits, const OptionalTensor& bias,
                             const RoutingParams& r, const RoutingOutputs& out);
#endif

// moe_routing's and moe_routing_out's entry points (their schemas' arguments) over one
// implementation each, which gets checked arguments: the CPU's reference or the CUDA dispatch.
using RoutingFn = std::tuple<Tensor, Tensor> (*)(const Tensor& logits, const OptionalTensor& bias,
                                                 const RoutingParams& r);
using RoutingIntoFn = void (*)(const Tensor& logits, const OptionalTensor& bias,
                               const RoutingParams& r, const RoutingOutputs& out);

template <RoutingFn Run>
std::tuple<Tensor, Tensor> moe_routing_op(const Tensor& logits, const OptionalTensor& bias,
                                          int64_t top_k, int64_t n_group, int64_t topk_group,
                                          bool renormalize, double routed_scaling_factor,
                                          const std::string& scoring,
                                          const OptionalTensor& input_ids,
                                          const OptionalTensor& hash_table) {
  const RoutingParams r = routing_params("moe_routing", top_k, n_group, topk_group, renormalize,
                                         routed_scaling_factor, scoring, input_ids, hash_table);
  check_moe_routing_inputs(logits, bias, r);
  return Run(logits, bias, r);
}

template <RoutingIntoFn Run>
void moe_routing_out_op(const Tensor& logits, const OptionalTensor& bias, int64_t top_k,
                        int64_t n_group, int64_t topk_group, bool renormalize,
                        double routed_scaling_factor, const std::string& scoring,
                        const OptionalTensor& input_ids, const OptionalTensor& hash_table,
                        const Tensor& topk_weights, const Tensor& topk_ids,
                        const OptionalTensor& expert_counts, int64_t num_fused_shared_experts,
                        double shared_expert_weight) {
  const RoutingOutputs out{topk_weights, topk_ids, expert_counts};
  const RoutingParams r = moe_routing_out_params(
      logits, bias, top_k, n_group, topk_group, renormalize, routed_scaling_factor, scoring,
      input_ids, hash_table, num_fused_shared_experts, shared_expert_weight, out);
  Run(logits, bias, r, out);
}

}  // namespace kimi
