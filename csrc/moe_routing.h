#pragma once

#include <string>
#include <tuple>

#include "torch_stable.h"

namespace kimi {

// How logits become routing scores: the ops' `scoring` argument, "sigmoid" or "softmax".
enum class Scoring { kSigmoid, kSoftmax };

// The `scoring` argument of `op`, checked.
Scoring parse_scoring(const char* op, const std::string& scoring);

// The routing's contract on N experts (every routing op calls it; `op` names the op in
// the messages): n_group, topk_group, top_k and the bias. `device` is where the bias must
// be (nullopt: no device to compare, as for the op that only names a kernel).
void check_routing_args(const char* op, int64_t N, const std::optional<Device>& device,
                        const char* device_of, const OptionalTensor& bias, int64_t top_k,
                        int64_t n_group, int64_t topk_group, Scoring scoring);

// The routing op's input contract: logits fp32 or bf16 [M, N], then check_routing_args.
void check_moe_routing_inputs(const Tensor& logits, const OptionalTensor& bias, int64_t top_k,
                              int64_t n_group, int64_t topk_group, Scoring scoring);

// The routing as ATen ops, on checked fp32 or bf16 logits [M, N]: (weights, ids).
std::tuple<Tensor, Tensor> routing_reference(const Tensor& logits, const OptionalTensor& bias,
                                             int64_t top_k, int64_t n_group, int64_t topk_group,
                                             bool renormalize, double routed_scaling_factor,
                                             Scoring scoring);

// Whether the routing kernel serves a problem on a GPU of compute capability sm.
bool routing_kernel_fits(int64_t N, int64_t top_k, int64_t n_group, int64_t topk_group,
                         int64_t sm);

#ifdef KIMI_WITH_CUDA
// The routing of checked CUDA logits on the current stream: the kernel where it fits,
// the reference otherwise (csrc/cuda/moe_routing_cuda.cpp).
std::tuple<Tensor, Tensor> moe_routing_on_gpu(const Tensor& logits, const OptionalTensor& bias,
                                              int64_t top_k, int64_t n_group, int64_t topk_group,
                                              bool renormalize, double routed_scaling_factor,
                                              Scoring scoring);
#endif

}  // namespace kimi
