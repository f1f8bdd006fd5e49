#pragma once

#include <string>
#include <tuple>

#include "kimi_tables.h"  // Scoring, RoutingScalars (generated from variants.py)
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

  bool hashed() const { return hash_table.has_value(); }
  // The same as the kernels take them, with or without a score-correction bias.
  RoutingScalars kernel_scalars(bool has_bias) const;
};

// The routing arguments of a call of `op`, its `scoring` argument checked (the name of a
// Scoring, lower case).
RoutingParams routing_params(const char* op, int64_t top_k, int64_t n_group, int64_t topk_group,
                             bool renormalize, double routed_scaling_factor,
                             const std::string& scoring,
                             const OptionalTensor& input_ids = std::nullopt,
                             const OptionalTensor& hash_table = std::nullopt);

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

// The routing as ATen ops, on checked fp32 or bf16 logits [M, N]: (weights, ids).
std::tuple<Tensor, Tensor> routing_reference(const Tensor& logits, const OptionalTensor& bias,
                                             const RoutingParams& r);

// Whether the routing kernel serves a problem on a GPU of compute capability sm.
bool routing_kernel_fits(int64_t N, const RoutingParams& r, int64_t sm);

#ifdef KIMI_WITH_CUDA
// The routing of checked CUDA logits on the current stream: the kernel where it fits,
// the reference otherwise (csrc/cuda/moe_routing_cuda.cpp).
std::tuple<Tensor, Tensor> moe_routing_on_gpu(const Tensor& logits, const OptionalTensor& bias,
                                              const RoutingParams& r);
#endif

}  // namespace kimi
