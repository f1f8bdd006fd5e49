// The MoE router op: logits, sigmoid or softmax scores, score-correction bias, grouped
// top-k and the routing weights, as DeepseekV3TopkRouter.forward (sigmoid) and
// DeepseekV2TopkRouter.forward (softmax) compute them in transformers 5.x:
//
//   logits  = hidden_states · router_weightᵀ                      (fp32, the GEMM op)
//   scores  = sigmoid(logits), or with scoring="softmax" softmax(logits) over the N experts
//   choice  = scores + bias
//   groups  = n_group equal slices of the experts; a group's score is the sum of its two
//             best choice values (softmax: its best one); the topk_group best groups are
//             kept, the rest masked out
//   ids     = the top_k best choice values among the kept experts, sorted by choice value,
//             descending, ties to the lower expert id (groups likewise, to the lower group)
//   weights = scores[ids], divided by (their sum + 1e-20) if renormalize, times
//             routed_scaling_factor
//
// This file has the schema, the input contract, the choice of fused kernel and the
// reference: the GEMM's reference, then the routing op's (csrc/moe_routing.cpp). The CPU
// runs the reference; CUDA (csrc/cuda/ll_bf16_router_cuda.cpp) runs one fused kernel where
// a row of the router table applies, and otherwise the GEMM op, then the routing kernel.

#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "kimi_variant_table.h"
#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"
#include "moe_routing.h"

namespace kimi {

namespace {
constexpr const char* kOp = "ll_bf16_router";
}  // namespace

void check_router_inputs(const Tensor& x, const Tensor& w, const OptionalTensor& bias,
                         int64_t top_k, int64_t n_group, int64_t topk_group, Scoring scoring) {
  check_inputs(x, w, kFloat, kOp);
  check_routing_args(kOp, w.size(0), w.device(), "router_weight", bias, top_k, n_group,
                     topk_group, scoring);
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
  throw std::runtime_error(message("ll_bf16_router_with_variant: unknown variant '", name,
                                      "'; expected one of:", names.str()));
}

namespace {

std::tuple<Tensor, Tensor, Tensor> ll_bf16_router_cpu(const Tensor& x, const Tensor& w,
                                                      const OptionalTensor& bias, int64_t top_k,
                                                      int64_t n_group, int64_t topk_group,
                                                      bool renormalize,
                                                      double routed_scaling_factor,
                                                      const std::string& scoring) {
  const Scoring how = parse_scoring(kOp, scoring);
  check_router_inputs(x, w, bias, top_k, n_group, topk_group, how);
  const Tensor logits = gemm_reference(x, w, kFloat);
  auto [weights, ids] = routing_reference(logits, bias, top_k, n_group, topk_group, renormalize,
                                          routed_scaling_factor, how);
  return {weights, ids, logits};
}

std::tuple<Tensor, Tensor, Tensor> ll_bf16_router_with_variant_cpu(
    const Tensor& x, const Tensor& w, const OptionalTensor& bias, int64_t top_k, int64_t n_group,
    int64_t topk_group, bool renormalize, double routed_scaling_factor,
    const std::string& variant, const std::string& scoring) {
  router_row_by_name(variant);
  return ll_bf16_router_cpu(x, w, bias, top_k, n_group, topk_group, renormalize,
                            routed_scaling_factor, scoring);
}

std::string ll_bf16_router_variant(int64_t M, int64_t N, int64_t K, int64_t top_k,
                                   int64_t n_group, int64_t topk_group, int64_t sm, bool aligned,
                                   const std::string& scoring) {
  KIMI_CHECK(M >= 0 && N >= 1 && K >= 1,
                   "ll_bf16_router_variant: expected M >= 0, N >= 1, K >= 1, got M=", M,
                   " N=", N, " K=", K);
  // A problem the op rejects gets the op's error.
  check_routing_args(kOp, N, std::nullopt, "router_weight", std::nullopt, top_k, n_group,
                     topk_group, parse_scoring(kOp, scoring));
  const RouterRow* row =
      M == 0 ? nullptr
             : choose_router(M, N, K, top_k, n_group, topk_group, sm, aligned && K % 8 == 0);
  if (row != nullptr) {
    return row->name;
  }
  return M > 0 && routing_kernel_fits(N, top_k, n_group, topk_group, sm) ? "gemm+moe_routing"
                                                                          : "reference";
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def(
      "ll_bf16_router(Tensor hidden_states, Tensor router_weight, Tensor? e_score_correction_bias, "
      "int top_k, int n_group=1, int topk_group=1, bool renormalize=True, "
      "float routed_scaling_factor=1.0, str scoring=\"sigmoid\") "
      "-> (Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  // The same with a fused router row named (benchmarks, tests); the CPU runs the reference.
  m.def(
      "ll_bf16_router_with_variant(Tensor hidden_states, Tensor router_weight, "
      "Tensor? e_score_correction_bias, int top_k, int n_group, int topk_group, "
      "bool renormalize, float routed_scaling_factor, str variant, str scoring=\"sigmoid\") "
      "-> (Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  // Which kernel the CUDA op runs for a problem: a fused router row, "gemm+moe_routing" or
  // "reference".
  m.def(
      "ll_bf16_router_variant(int M, int N, int K, int top_k, int n_group=1, int topk_group=1, "
      "int sm=90, bool aligned=True, str scoring=\"sigmoid\") -> str");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CompositeExplicitAutograd, m) {
  m.impl("ll_bf16_router_variant", TORCH_BOX(&ll_bf16_router_variant));
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("ll_bf16_router", TORCH_BOX(&ll_bf16_router_cpu));
  m.impl("ll_bf16_router_with_variant", TORCH_BOX(&ll_bf16_router_with_variant_cpu));
}

}  // namespace kimi
