// The MoE router op: logits, sigmoid scores, score-correction bias, grouped top-k and the
// routing weights, as DeepseekV3TopkRouter.forward computes them in transformers 5.x:
//
//   logits  = hidden_states · router_weightᵀ                      (fp32, the GEMM op)
//   scores  = sigmoid(logits);  choice = scores + bias
//   groups  = n_group equal slices of the experts; a group's score is the sum of its two
//             best choice values; the topk_group best groups are kept, the rest masked out
//   ids     = the top_k best choice values among the kept experts, sorted by choice value,
//             descending, ties to the lower expert id (groups likewise, to the lower group)
//   weights = scores[ids], divided by (their sum + 1e-20) if renormalize, times
//             routed_scaling_factor
//
// This file has the schema, the input contract, the choice of fused kernel and the
// reference: the GEMM op, then the routing as ATen ops. The CPU runs the reference; CUDA
// (csrc/cuda/ll_bf16_router_cuda.cpp) runs one fused kernel where a row of the router table
// applies, and the reference otherwise.

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "kimi_variant_table.h"
#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"

namespace kimi {

namespace {
constexpr const char* kOp = "ll_bf16_router";
}  // namespace

void check_router_inputs(const at::Tensor& x, const at::Tensor& w,
                         const std::optional<at::Tensor>& bias, int64_t top_k, int64_t n_group,
                         int64_t topk_group) {
  check_inputs(x, w, at::kFloat, kOp);
  const int64_t N = w.size(0);
  TORCH_CHECK_VALUE(n_group >= 1 && N % n_group == 0, kOp,
                    ": n_group must divide the number of experts, got n_group=", n_group,
                    " and N=", N);
  TORCH_CHECK_VALUE(topk_group >= 1 && topk_group <= n_group, kOp,
                    ": topk_group must be in [1, n_group=", n_group, "], got ", topk_group);
  TORCH_CHECK_VALUE(n_group == 1 || N / n_group >= 2, kOp,
                    ": with n_group > 1 each group needs at least 2 experts (a group's score is "
                    "the sum of its two best), got N=", N, " and n_group=", n_group);
  const int64_t kept = topk_group * (N / n_group);
  TORCH_CHECK_VALUE(top_k >= 1 && top_k <= kept, kOp,
                    ": top_k must be in [1, experts in the kept groups=", kept, "], got ", top_k);
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    TORCH_CHECK_TYPE(b.scalar_type() == at::kFloat || b.scalar_type() == at::kBFloat16, kOp,
                     ": e_score_correction_bias must be torch.float32 or torch.bfloat16, got ",
                     dtype_name(b.scalar_type()));
    TORCH_CHECK_VALUE(b.dim() == 1 && b.size(0) == N, kOp,
                      ": e_score_correction_bias must have shape [N]=[", N, "], got ", b.sizes());
    TORCH_CHECK(b.device() == w.device(), kOp,
                ": e_score_correction_bias must be on the device of router_weight, got ",
                b.device(), " and ", w.device());
  }
}

std::string router_row_misfit(const RouterRow& row, int64_t M, int64_t N, int64_t K,
                              int64_t top_k, int64_t n_group, int64_t topk_group, int64_t sm,
                              bool vec8_ok) {
  std::ostringstream why;
  if (!kernels_support(sm, N, K)) {
    why << "no kernels for sm_" << sm << " or for N=" << N << " K=" << K;
  } else if (M < 1 || M > row.m_hi) {
    why << "handles 1 <= M <= " << row.m_hi << ", got M = " << M;
  } else if (N > row.n_max) {
    why << "routes N <= " << row.n_max << " experts, got N = " << N;
  } else if (top_k > kRouterMaxTopK) {
    // The picked ids are spread over the lanes of a warp, and so are the group scores.
    why << "picks top_k <= " << kRouterMaxTopK << ", got " << top_k;
  } else if (topk_group < n_group && n_group > kRouterMaxGroups) {
    why << "drops groups only among n_group <= " << kRouterMaxGroups << ", got " << n_group;
  } else if (!vec8_ok) {
    why << "needs K % 8 == 0, row strides % 8 == 0 and 16-byte aligned data; got K = " << K;
  }
  return why.str();
}

const RouterRow* choose_router(int64_t M, int64_t N, int64_t K, int64_t top_k, int64_t n_group,
                               int64_t topk_group, int64_t sm, bool vec8_ok) {
  for (const RouterRow& row : kRouterRows) {
    if (row.automatic && row.m_lo <= M && row.n_min <= N &&
        router_row_misfit(row, M, N, K, top_k, n_group, topk_group, sm, vec8_ok).empty()) {
      return &row;
    }
  }
  return nullptr;
}

const RouterRow& router_row_by_name(const std::string& name) {
  std::ostringstream names;
  for (const RouterRow& row : kRouterRows) {
    if (name == row.name) {
      return row;
    }
    names << " " << row.name;
  }
  TORCH_CHECK_VALUE(false, "ll_bf16_router_with_variant: unknown variant '", name,
                    "'; expected one of:", names.str());
}

namespace {

// Indices of the k largest values along the last dimension, largest first; equal values in
// index order. A stable descending sort gives exactly that tie rule.
at::Tensor top_indices(const at::Tensor& values, int64_t k) {
  return std::get<1>(at::sort(values, /*stable=*/true, /*dim=*/-1, /*descending=*/true))
      .narrow(-1, 0, k);
}

std::tuple<at::Tensor, at::Tensor> route(const at::Tensor& logits,
                                         const std::optional<at::Tensor>& bias, int64_t top_k,
                                         int64_t n_group, int64_t topk_group, bool renormalize,
                                         double routed_scaling_factor) {
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

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> ll_bf16_router_reference(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
    int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize,
    double routed_scaling_factor) {
  static const auto gemm = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("kimi::ll_bf16_gemm", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::ScalarType)>();
  at::Tensor logits;
  {
    // The GEMM's own autograd wrapper is not wanted here: the router has no derivative.
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    logits = gemm.call(x, w, at::kFloat);
  }
  auto [weights, ids] =
      route(logits, bias, top_k, n_group, topk_group, renormalize, routed_scaling_factor);
  return {weights, ids, logits};
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> ll_bf16_router_cpu(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
    int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize,
    double routed_scaling_factor) {
  check_router_inputs(x, w, bias, top_k, n_group, topk_group);
  return ll_bf16_router_reference(x, w, bias, top_k, n_group, topk_group, renormalize,
                                  routed_scaling_factor);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ll_bf16_router_with_variant_cpu(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
    int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize,
    double routed_scaling_factor, const std::string& variant) {
  router_row_by_name(variant);
  return ll_bf16_router_cpu(x, w, bias, top_k, n_group, topk_group, renormalize,
                            routed_scaling_factor);
}

std::string ll_bf16_router_variant(int64_t M, int64_t N, int64_t K, int64_t top_k,
                                   int64_t n_group, int64_t topk_group, int64_t sm, bool aligned) {
  TORCH_CHECK_VALUE(M >= 0 && N >= 1 && K >= 1,
                    "ll_bf16_router_variant: expected M >= 0, N >= 1, K >= 1, got M=", M,
                    " N=", N, " K=", K);
  const RouterRow* row =
      M == 0 ? nullptr
             : choose_router(M, N, K, top_k, n_group, topk_group, sm, aligned && K % 8 == 0);
  return row == nullptr ? "reference" : row->name;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def(
      "ll_bf16_router(Tensor hidden_states, Tensor router_weight, Tensor? e_score_correction_bias, "
      "int top_k, int n_group=1, int topk_group=1, bool renormalize=True, "
      "float routed_scaling_factor=1.0) -> (Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  // The same with a fused router row named (benchmarks, tests); the CPU runs the reference.
  m.def(
      "ll_bf16_router_with_variant(Tensor hidden_states, Tensor router_weight, "
      "Tensor? e_score_correction_bias, int top_k, int n_group, int topk_group, "
      "bool renormalize, float routed_scaling_factor, str variant) "
      "-> (Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  // Which kernel the CUDA op runs for a problem: a fused router row, or "reference".
  m.def(
      "ll_bf16_router_variant(int M, int N, int K, int top_k, int n_group=1, int topk_group=1, "
      "int sm=90, bool aligned=True) -> str",
      &ll_bf16_router_variant);
}

TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("ll_bf16_router", &ll_bf16_router_cpu);
  m.impl("ll_bf16_router_with_variant", &ll_bf16_router_with_variant_cpu);
}
// Routing picks discrete experts: the op has no derivative (backward raises).
TORCH_LIBRARY_IMPL(kimi, Autograd, m) {
  m.impl("ll_bf16_router", torch::autograd::autogradNotImplementedFallback());
  m.impl("ll_bf16_router_with_variant", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace kimi
