// The MoE router op: logits, sigmoid or softmax scores, score-correction bias, grouped
// top-k and the routing weights, as DeepseekV3TopkRouter.forward (sigmoid) and
// DeepseekV2TopkRouter.forward (softmax) compute them in transformers 5.x:
//
//   logits  = hidden_states · router_weightᵀ (+ gate_bias)        (fp32, the GEMM op)
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
// runs the reference; CUDA (below) runs one fused kernel where
// a row of the router table applies, and otherwise the GEMM op, then the routing kernel.

#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "ll_bf16_gemm.h"
#include "ll_bf16_router.h"
#include "moe_routing.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#include "cuda/router_handoff.h"
#endif

namespace kimi {

namespace {
constexpr const char* kOp = "ll_bf16_router";
}  // namespace

void check_router_inputs(const char* op, const Tensor& x, const Tensor& w,
                         const OptionalTensor& bias, const OptionalTensor& gate_bias,
                         const RoutingParams& r) {
  if (std::string(op) == kOp) {
    check_inputs(x, w, kFloat, op);
  } else {
    check_router_gemm_inputs(x, w, gate_bias, kFloat, op, "gate_bias");
  }
  check_routing_args(op, x.size(0), w.size(0), w.device(), "router_weight", bias, r);
}

void check_router_outputs(const char* op, const Tensor& x, const Tensor& w,
                          const RoutingParams& r, const RouterDestination& out) {
  const int64_t M = x.size(0), N = w.size(0);
  check_routing_outputs(op, M, N, x.device(), r, out.routing);
  const Tensor& logits = out.logits;
  KIMI_CHECK(logits.scalar_type() == kFloat, op, ": logits must be torch.float32, got ",
             dtype_name(logits.scalar_type()));
  KIMI_CHECK(logits.dim() == 2 && logits.size(0) == M && logits.size(1) == N, op,
             ": logits must have shape [", M, ", ", N, "], got ", logits.sizes());
  KIMI_CHECK(logits.device() == x.device(), op, ": logits must be on ", x.device(), ", got ",
             logits.device());
  KIMI_CHECK(logits.stride(1) == 1 || N == 1, op,
             ": logits must have a unit stride along its last dimension, got strides ",
             logits.strides());
}

std::string router_row_misfit(const RouterRow& row, const RouterProblem& p,
                              const RoutingParams& r) {
  const int64_t M = p.M, N = p.N, K = p.K;
  std::ostringstream why;
  if (!kernels_support(p.sm, N, K)) {
    why << "no kernels for sm_" << p.sm << " or for N=" << N << " K=" << K;
  } else if (p.weight_dtype != row.weight_dtype) {
    why << "takes " << dtype_name(row.weight_dtype) << " router_weight, got "
        << dtype_name(p.weight_dtype);
  } else if (p.x_dtype != kBFloat16) {
    why << "takes torch.bfloat16 hidden_states, got " << dtype_name(p.x_dtype);
  } else if (M < 1 || M > row.m_hi) {
    why << "handles 1 <= M <= " << row.m_hi << ", got M = " << M;
  } else if (N > row.n_max) {
    why << "routes N <= " << row.n_max << " experts, got N = " << N;
  } else if (row.k_only != 0 && K != row.k_only) {
    why << "computes K = " << row.k_only << " only (compiled in), got K = " << K;
  } else if (r.width() > kRouterMaxTopK) {
    // The picked ids are spread over the lanes of a warp, and so are the group scores.
    why << "picks top_k <= " << kRouterMaxTopK
        << (r.shared_experts > 0 ? " (with the shared-expert slots)" : "") << ", got " << r.width();
  } else if (r.topk_group < r.n_group && r.n_group > kRouterMaxGroups) {
    why << "drops groups only among n_group <= " << kRouterMaxGroups << ", got " << r.n_group;
  } else if (!p.vec16_ok) {
    const int vec = vec16_elements(row.weight_dtype);
    why << "needs K % " << vec << " == 0, row strides % " << vec
        << " == 0 and aligned data; got K = " << K;
  }
  return why.str();
}

const RouterRow* choose_router(const RouterProblem& p, const RoutingParams& r) {
  if (batch_invariant()) {
    return nullptr;  // a fused row's GEMM sums as its M bucket does: the two launches
  }
  for (const RouterRow& row : kRouterRows) {
    if (row.m_lo <= p.M && row.n_min <= p.N && router_row_misfit(row, p, r).empty()) {
      return &row;
    }
  }
  return nullptr;
}

const RouterRow& router_row_by_name(const std::string& name) {
  return row_by_name(kRouterRows, name, "router_with_variant");
}

namespace {

// The CPU's router: the reference (a named row is only checked to exist).
RouterOutputs router_reference(const RouterCall& c) {
  check_router_inputs(c.op, c.x, c.w, c.bias, c.gate_bias, c.routing);
  const Tensor logits = gemm_reference(c.x, c.w, c.gate_bias, kFloat);
  auto [weights, ids] = routing_reference(logits, c.bias, c.routing);
  if (c.into == nullptr) {
    return {weights, ids, logits};
  }
  copy_into(c.into->logits, logits);
  write_routing(weights, ids, c.w.size(0), c.routing, c.into->routing);
  return {c.into->routing.weights, c.into->routing.ids, c.into->logits};
}

std::string ll_bf16_router_variant(int64_t M, int64_t N, int64_t K, int64_t top_k,
                                   int64_t n_group, int64_t topk_group, int64_t sm, bool aligned,
                                   const std::string& scoring, ScalarType weight_dtype,
                                   ScalarType x_dtype) {
  KIMI_CHECK(M >= 0 && N >= 1 && K >= 1,
             "ll_bf16_router_variant: expected M >= 0, N >= 1, K >= 1, got M=", M,
             " N=", N, " K=", K);
  // A problem the op rejects gets the op's error.
  const RoutingParams r = routing_params(kOp, top_k, n_group, topk_group, true, 1.0, scoring);
  check_routing_args(kOp, M, N, std::nullopt, "router_weight", std::nullopt, r);
  KIMI_CHECK((weight_dtype == kFloat || weight_dtype == kBFloat16) &&
                 (x_dtype == kFloat || x_dtype == kBFloat16),
             "ll_bf16_router_variant: weight_dtype and x_dtype must be torch.bfloat16 or "
             "torch.float32, got ", dtype_name(weight_dtype), " and ", dtype_name(x_dtype));
  const RouterProblem problem{M, N, K, x_dtype, weight_dtype, sm,
                              aligned && K % vec16_elements(weight_dtype) == 0};
  const RouterRow* row = M == 0 ? nullptr : choose_router(problem, r);
  if (row != nullptr) {
    return row->name;
  }
  return M > 0 && routing_kernel_fits(N, r, sm) ? "gemm+moe_routing" : "reference";
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def(
      "ll_bf16_router(Tensor hidden_states, Tensor router_weight, " KIMI_ROUTING_ARGS
      ") -> (Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  // `router` with a fused router row named (benchmarks, tests); the CPU runs the reference.
  m.def(
      "router_with_variant(Tensor hidden_states, Tensor router_weight, "
      "Tensor? e_score_correction_bias, int top_k, int n_group, int topk_group, "
      "bool renormalize, float routed_scaling_factor, str variant, str scoring=\"sigmoid\", "
      "Tensor? gate_bias=None, Tensor? input_ids=None, Tensor? hash_table=None) "
      "-> (Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  // Which kernel the CUDA op runs for a problem: a fused router row, "gemm+moe_routing" or
  // "reference".
  m.def(
      "ll_bf16_router_variant(int M, int N, int K, int top_k, int n_group=1, int topk_group=1, "
      "int sm=90, bool aligned=True, str scoring=\"sigmoid\", ScalarType weight_dtype=bfloat16, "
      "ScalarType x_dtype=bfloat16) -> str");
  // The whole router for bf16 or fp32 router weights, with an optional gate bias (added to
  // the logits, as F.linear's bias; e_score_correction_bias only changes the choice).
  m.def(
      "router(Tensor hidden_states, Tensor router_weight, " KIMI_ROUTING_ARGS
      ", Tensor? gate_bias=None, Tensor? input_ids=None, Tensor? hash_table=None) "
      "-> (Tensor topk_weights, Tensor topk_ids, Tensor logits)");
  // `router` into the caller's tensors: moe_routing_out's outputs, and logits fp32 [M, N].
  m.def(
      "router_out(Tensor hidden_states, Tensor router_weight, " KIMI_ROUTING_ARGS
      ", Tensor? gate_bias=None, Tensor? input_ids=None, Tensor? hash_table=None, " KIMI_ROUTING_OUT_ARGS
      ", Tensor(d!) logits) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CompositeExplicitAutograd, m) {
  m.impl("ll_bf16_router_variant", TORCH_BOX(&ll_bf16_router_variant));
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) { RouterOps<router_reference>::impl(m); }

#ifdef KIMI_WITH_CUDA

// CUDA implementation of the router op: one fused kernel (GEMM + routing) where a row of the
// router table applies, the GEMM op's kernel and then the routing op's otherwise.

namespace {

const RouterKernel& router_kernel(const RouterRow& row, ScalarType bias_dtype, int sm) {
  const int router = static_cast<int>(&row - kRouterRows);
  const RouterKernel* kernel = find_kernel(kRouterKernels, sm, [&](const RouterKernel& k) {
    return k.router == router && k.bias_dtype == bias_dtype;
  });
  KIMI_CHECK(kernel != nullptr, "ll_bf16_router: no compiled kernel ", row.name, " for sm_", sm);
  return *kernel;
}

}  // namespace

RouterOutputs route_on_gpu(const RouterCall& call) {
  const auto& [op, forced, x_in, w_in, bias_in, gate_bias, routing, into] = call;
  check_router_inputs(op, x_in, w_in, bias_in, gate_bias, routing);
  const DeviceGuard guard(x_in.get_device_index());
  const Tensor x = unit_inner_stride(x_in);
  const Tensor w = unit_inner_stride(w_in);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  const int device = x.get_device_index();
  const int sm = device_sm(device);
  const RouterProblem problem{M, N, K, x.scalar_type(), w.scalar_type(), sm,
                              M > 0 && vec16_ok(x, w)};
  const RouterRow* row = M == 0 ? nullptr : forced;  // no rows: the two launches, empty
  if (row != nullptr) {
    const std::string misfit = router_row_misfit(*forced, problem, routing);
    KIMI_CHECK(misfit.empty(), "router_with_variant: variant ", forced->name, " ",
               misfit);
  } else if (M > 0) {
    row = choose_router(problem, routing);
  }
  if (row == nullptr) {
    // Two launches: the GEMM op's kernel, then the routing kernel (the ATen reference where
    // none fits), which waits on it through PDL.
    if (into == nullptr) {
      const Tensor logits = gemm_on_gpu(x, w, gate_bias, kFloat);
      auto [weights, ids] = moe_routing_on_gpu(logits, bias_in, routing);
      return {weights, ids, logits};
    }
    gemm_on_gpu(x, w, gate_bias, kFloat, &into->logits);
    moe_routing_on_gpu_into(into->logits, bias_in, routing, into->routing);
    return {into->routing.weights, into->routing.ids, into->logits};
  }
  const RouterDestination out =
      into != nullptr ? *into
                      : RouterDestination{empty_on(x, {M, N}, kFloat),
                                          {empty_on(x, {M, routing.width()}, kFloat),
                                           empty_on(x, {M, routing.width()}, kInt), std::nullopt}};
  // The routing bias as a [1, N] row with unit stride; a missing one is a stand-in the kernel
  // never reads (has_bias = 0): the logits, for the fp32 kernels' bias.
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : out.logits;
  const RouterKernel& kernel = router_kernel(*row, bias.scalar_type(), sm);
  const cudaStream_t stream = current_stream(device);
  RouterArgs args{};
  const Tensor gate = put_gemm_operands(args, x, w, gate_bias);
  args.bias = row_arg(bias, N);
  args.logits = matrix_arg(out.logits);
  args.handoff = {router_handoff(device, stream, M * N), {int32_t(M), int32_t(N)}, {N}};
  const HashArgs hash = hash_args(routing.input_ids, routing.hash_table, out.routing.weights);
  args.input_ids = hash.input_ids;
  args.hash_table = hash.hash_table;
  args.routing = routing.kernel_scalars(bias_in.has_value());
  put_routing_outputs(args, out.routing, N, routing);
  launch_kernel(kRouterKernels, kernel, args, device, stream);
  return {out.routing.weights, out.routing.ids, out.logits};
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) { RouterOps<route_on_gpu>::impl(m); }

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
