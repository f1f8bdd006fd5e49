// The routing op: the routing of ll_bf16_router on logits a caller already has.
//
//   scores  = sigmoid(logits);  choice = scores + bias
//   groups  = n_group equal slices of the experts; a group's score is the sum of its two
//             best choice values; the topk_group best groups are kept, the rest masked out
//   ids     = the top_k best choice values among the kept experts, sorted by choice value,
//             descending, ties to the lower expert id (groups likewise, to the lower group)
//   weights = scores[ids], divided by (their sum + 1e-20) if renormalize, times
//             routed_scaling_factor
//
// This file has the schema, the contract shared with the router op, and the reference (the
// routing as ATen ops), which the CPU runs; CUDA runs the kernel of
// kernels/moe_routing.py where it fits (csrc/cuda/moe_routing_cuda.cpp).

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <limits>

#include "kimi_variant_table.h"
#include "ll_bf16_gemm.h"
#include "moe_routing.h"

namespace kimi {

void check_routing_args(const char* op, int64_t N, const c10::Device& device,
                        const char* device_of, const std::optional<at::Tensor>& bias,
                        int64_t top_k, int64_t n_group, int64_t topk_group) {
  TORCH_CHECK_VALUE(n_group >= 1 && N % n_group == 0, op,
                    ": n_group must divide the number of experts, got n_group=", n_group,
                    " and N=", N);
  TORCH_CHECK_VALUE(topk_group >= 1 && topk_group <= n_group, op,
                    ": topk_group must be in [1, n_group=", n_group, "], got ", topk_group);
  TORCH_CHECK_VALUE(n_group == 1 || N / n_group >= 2, op,
                    ": with n_group > 1 each group needs at least 2 experts (a group's score is "
                    "the sum of its two best), got N=", N, " and n_group=", n_group);
  const int64_t kept = topk_group * (N / n_group);
  TORCH_CHECK_VALUE(top_k >= 1 && top_k <= kept, op,
                    ": top_k must be in [1, experts in the kept groups=", kept, "], got ", top_k);
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    TORCH_CHECK_TYPE(b.scalar_type() == at::kFloat || b.scalar_type() == at::kBFloat16, op,
                     ": e_score_correction_bias must be torch.float32 or torch.bfloat16, got ",
                     dtype_name(b.scalar_type()));
    TORCH_CHECK_VALUE(b.dim() == 1 && b.size(0) == N, op,
                      ": e_score_correction_bias must have shape [N]=[", N, "], got ", b.sizes());
    TORCH_CHECK(b.device() == device, op, ": e_score_correction_bias must be on the device of ",
                device_of, ", got ", b.device(), " and ", device);
  }
}

bool routing_kernel_fits(int64_t N, int64_t top_k, int64_t n_group, int64_t topk_group,
                         int64_t sm) {
  // The picked ids are spread over the lanes of a warp, and so are the group scores.
  return (sm == 90 || sm == 100) && N <= kRouterMaxN && top_k <= kRouterMaxTopK &&
         (topk_group == n_group || n_group <= kRouterMaxGroups);
}

namespace {
constexpr const char* kOp = "moe_routing";
}  // namespace

void check_moe_routing_inputs(const at::Tensor& logits, const std::optional<at::Tensor>& bias,
                              int64_t top_k, int64_t n_group, int64_t topk_group) {
  TORCH_CHECK_TYPE(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16,
                   kOp, ": logits must be torch.float32 or torch.bfloat16, got ",
                   dtype_name(logits.scalar_type()));
  TORCH_CHECK_VALUE(logits.dim() == 2, kOp, ": logits must be 2-D [M, N], got shape ",
                    logits.sizes());
  TORCH_CHECK_VALUE(logits.size(1) >= 1, kOp, ": logits must have N >= 1 experts, got shape ",
                    logits.sizes());
  check_routing_args(kOp, logits.size(1), logits.device(), "logits", bias, top_k, n_group,
                     topk_group);
}

namespace {

// Indices of the k largest values along the last dimension, largest first; equal values in
// index order. A stable descending sort gives exactly that tie rule.
at::Tensor top_indices(const at::Tensor& values, int64_t k) {
  return std::get<1>(at::sort(values, /*stable=*/true, /*dim=*/-1, /*descending=*/true))
      .narrow(-1, 0, k);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> routing_reference(const at::Tensor& logits_in,
                                                     const std::optional<at::Tensor>& bias,
                                                     int64_t top_k, int64_t n_group,
                                                     int64_t topk_group, bool renormalize,
                                                     double routed_scaling_factor) {
  const at::Tensor logits = logits_in.to(at::kFloat);
  const int64_t M = logits.size(0), N = logits.size(1);
  const at::Tensor scores = logits.sigmoid();
  at::Tensor choice = bias.has_value() ? scores + bias->to(at::kFloat) : scores;
  if (topk_group < n_group) {
    const at::Tensor grouped = choice.view({M, n_group, N / n_group});
    const at::Tensor group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);
    const at::Tensor kept = at::zeros_like(group_scores, at::kBool)
                                .scatter_(1, top_indices(group_scores, topk_group), true);
    choice = grouped.masked_fill(kept.logical_not().unsqueeze(-1),
                                 -std::numeric_limits<float>::infinity())
                 .view({M, N});
  }
  const at::Tensor ids = top_indices(choice, top_k);
  at::Tensor weights = scores.gather(1, ids);
  if (renormalize) {
    weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
  }
  return {weights * routed_scaling_factor, ids.to(at::kInt)};
}

namespace {

std::tuple<at::Tensor, at::Tensor> moe_routing_cpu(const at::Tensor& logits,
                                                   const std::optional<at::Tensor>& bias,
                                                   int64_t top_k, int64_t n_group,
                                                   int64_t topk_group, bool renormalize,
                                                   double routed_scaling_factor) {
  check_moe_routing_inputs(logits, bias, top_k, n_group, topk_group);
  return routing_reference(logits, bias, top_k, n_group, topk_group, renormalize,
                           routed_scaling_factor);
}


}  // namespace

TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def(
      "moe_routing(Tensor logits, Tensor? e_score_correction_bias, int top_k, int n_group=1, "
      "int topk_group=1, bool renormalize=True, float routed_scaling_factor=1.0) "
      "-> (Tensor topk_weights, Tensor topk_ids)");
}

TORCH_LIBRARY_IMPL(kimi, CPU, m) { m.impl("moe_routing", &moe_routing_cpu); }
// Routing picks discrete experts: the op has no derivative (backward raises).
TORCH_LIBRARY_IMPL(kimi, Autograd, m) {
  m.impl("moe_routing", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace kimi
