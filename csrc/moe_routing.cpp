// The routing op: the routing of ll_bf16_router on logits a caller already has.
//
//   scores  = sigmoid(logits), with scoring="softmax" softmax(logits) over the N experts, with
//             scoring="sqrtsoftplus" sqrt(softplus(logits)) (DeepSeek-V4)
//   choice  = scores + bias
//   groups  = n_group equal slices of the experts; a group's score is the sum of its two
//             best choice values (softmax: its best one); the topk_group best groups are
//             kept, the rest masked out
//   ids     = the top_k best choice values among the kept experts, sorted by choice value,
//             descending, ties to the lower expert id (groups likewise, to the lower group)
//   weights = scores[ids], divided by (their sum + 1e-20) if renormalize, times
//             routed_scaling_factor
//
// A bias that is not finite is an error on the CPU and makes every weight NaN on a GPU.
// A hash-routed layer (input_ids and hash_table given) takes ids = hash_table[input_ids]
// instead of choosing (no bias, no groups), and the weights the same way. On the CPU an
// index outside the table or an expert outside [0, N) is an error; a GPU, which cannot say
// so without a sync, routes that slot to expert 0 with a NaN weight.
//
// This file has the schema, the contract shared with the router op, and the reference (the
// routing as ATen ops), which the CPU runs; CUDA runs the kernel of
// kernels/moe_routing.py where it fits (below).

#include <cmath>
#include <limits>
#include <sstream>

#include "moe_routing.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#endif

namespace kimi {

RoutingScalars RoutingParams::kernel_scalars(bool has_bias) const {
  RoutingScalars s{};
  s.top_k = int32_t(top_k);
  s.n_group = int32_t(n_group);
  s.topk_group = int32_t(topk_group);
  s.renormalize = renormalize ? 1 : 0;
  s.has_bias = has_bias ? 1 : 0;
  s.scoring = static_cast<int32_t>(scoring);
  s.scaling = static_cast<float>(routed_scaling_factor);
  // An int64 is two of the kernels' int32 words (csrc/cuda/kernel_support.h: hash_args).
  const auto words = [](const OptionalTensor& t) {
    return !t.has_value() ? 0 : t->scalar_type() == ScalarType::Long ? 2 : 1;
  };
  s.ids_words = words(input_ids);
  s.table_words = words(hash_table);
  s.shared_experts = int32_t(shared_experts);
  s.shared_weight = static_cast<float>(shared_expert_weight);
  s.id_words = 1;
  s.has_counts = 0;
  return s;
}

RoutingParams routing_params(const char* op, int64_t top_k, int64_t n_group, int64_t topk_group,
                             bool renormalize, double routed_scaling_factor,
                             const std::string& scoring, const OptionalTensor& input_ids,
                             const OptionalTensor& hash_table) {
  // A NaN or negative scale would turn every weight into a valid-looking wrong one.
  KIMI_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0, op,
             ": routed_scaling_factor must be finite and > 0, got ", routed_scaling_factor);
  constexpr int kCount = sizeof(kScoringNames) / sizeof(kScoringNames[0]);
  std::ostringstream names;
  for (int i = 0; i < kCount; ++i) {
    if (scoring == kScoringNames[i]) {
      return {top_k,      n_group,       topk_group, renormalize, routed_scaling_factor,
              Scoring(i), input_ids, hash_table};
    }
    names << (i == 0 ? "" : i + 1 == kCount ? " or " : ", ") << "'" << kScoringNames[i] << "'";
  }
  throw std::runtime_error(
      message(op, ": scoring must be ", names.str(), ", got '", scoring, "'"));
}

RoutingParams routing_params_out(const char* op, int64_t top_k, int64_t n_group, int64_t topk_group,
                                 bool renormalize, double routed_scaling_factor,
                                 const std::string& scoring, const OptionalTensor& input_ids,
                                 const OptionalTensor& hash_table, int64_t num_fused_shared_experts,
                                 double shared_expert_weight) {
  RoutingParams r = routing_params(op, top_k, n_group, topk_group, renormalize,
                                   routed_scaling_factor, scoring, input_ids, hash_table);
  KIMI_CHECK(num_fused_shared_experts >= 0, op,
             ": num_fused_shared_experts must be >= 0, got ", num_fused_shared_experts);
  KIMI_CHECK(std::isfinite(shared_expert_weight), op,
             ": shared_expert_weight must be finite, got ", shared_expert_weight);
  r.shared_experts = num_fused_shared_experts;
  r.shared_expert_weight = shared_expert_weight;
  return r;
}

namespace {

// `name` must be a [rows, cols] tensor of `dtype` (or one of two) on `device` with a unit
// stride along its last dimension.
void check_output(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols,
                  const Device& device, ScalarType dtype, std::optional<ScalarType> or_dtype = {}) {
  KIMI_CHECK(t.scalar_type() == dtype || (or_dtype && t.scalar_type() == *or_dtype), op, ": ", name,
             " must be ", dtype_name(dtype), or_dtype ? " or " + dtype_name(*or_dtype) : "", ", got ",
             dtype_name(t.scalar_type()));
  const bool shaped = rows < 0 ? t.dim() == 1 && t.size(0) == cols
                               : t.dim() == 2 && t.size(0) == rows && t.size(1) == cols;
  if (rows < 0) {
    KIMI_CHECK(shaped, op, ": ", name, " must have shape [", cols, "], got ", t.sizes());
  } else {
    KIMI_CHECK(shaped, op, ": ", name, " must have shape [", rows, ", ", cols, "], got ", t.sizes());
  }
  KIMI_CHECK(t.device() == device, op, ": ", name, " must be on ", device, ", got ", t.device());
  KIMI_CHECK(t.stride(t.dim() - 1) == 1 || t.size(t.dim() - 1) <= 1, op, ": ", name,
             " must have a unit stride along its last dimension, got strides ", t.strides());
}

}  // namespace

void check_routing_outputs(const char* op, int64_t M, int64_t N, const Device& device,
                           const RoutingParams& r, const RoutingOutputs& out) {
  check_output(op, "topk_weights", out.weights, M, r.width(), device, kFloat);
  check_output(op, "topk_ids", out.ids, M, r.width(), device, kInt, ScalarType::Long);
  if (out.counts.has_value()) {
    check_output(op, "expert_counts", *out.counts, -1, N + r.shared_experts, device, kInt);
  }
}

void write_routing(const Tensor& weights, const Tensor& ids, int64_t N, const RoutingParams& r,
                   const RoutingOutputs& out) {
  const NoGradGuard no_grad;
  Tensor out_weights = out.weights, out_ids = out.ids;
  copy_into(torch::stable::narrow(out_weights, 1, 0, r.top_k), weights);
  copy_into(torch::stable::narrow(out_ids, 1, 0, r.top_k), ids);
  for (int64_t s = 0; s < r.shared_experts; ++s) {
    torch::stable::fill_(torch::stable::narrow(out_weights, 1, r.top_k + s, 1), r.shared_expert_weight);
    torch::stable::fill_(torch::stable::narrow(out_ids, 1, r.top_k + s, 1), double(N + s));
  }
  if (out.counts.has_value() && out.ids.numel() > 0) {
    // bincount of every stored id, added to the caller's counts.
    const Tensor index = torch::stable::reshape(torch::stable::to(out.ids, ScalarType::Long), {-1});
    const Tensor ones = torch::stable::full(index.sizes(), 1.0, kInt, std::nullopt, index.device());
    (void)call_tensor_op("aten::scatter_add_", "", *out.counts, int64_t(0), index, ones);
  }
}

namespace {

bool is_index_dtype(const Tensor& t) {
  return t.scalar_type() == kInt || t.scalar_type() == ScalarType::Long;
}

// Element i of an int32 or int64 tensor on the CPU, `stride` elements apart.
int64_t index_at(const Tensor& t, int64_t i, int64_t stride) {
  return t.scalar_type() == kInt ? static_cast<const int32_t*>(t.data_ptr())[i * stride]
                                 : static_cast<const int64_t*>(t.data_ptr())[i * stride];
}

// A hash-routed call's tensors: shapes, dtypes, device, and on the CPU every index used.
void check_hash_args(const char* op, int64_t M, int64_t N, const std::optional<Device>& device,
                     const char* device_of, const RoutingParams& r) {
  KIMI_CHECK(r.input_ids.has_value() == r.hash_table.has_value(), op,
             ": input_ids and hash_table go together (a hash-routed layer takes both), got ",
             r.input_ids.has_value() ? "input_ids without hash_table" : "hash_table without input_ids");
  if (!r.hashed()) {
    return;
  }
  const Tensor& ids = *r.input_ids;
  const Tensor& table = *r.hash_table;
  KIMI_CHECK(is_index_dtype(ids), op, ": input_ids must be torch.int32 or torch.int64, got ",
             dtype_name(ids.scalar_type()));
  KIMI_CHECK(is_index_dtype(table), op, ": hash_table must be torch.int32 or torch.int64, got ",
             dtype_name(table.scalar_type()));
  KIMI_CHECK(M < 0 || (ids.dim() == 1 && ids.size(0) == M), op,
             ": input_ids must have shape [M]=[", M, "], got ", ids.sizes());
  KIMI_CHECK(table.dim() == 2 && table.size(0) >= 1 && table.size(1) == r.top_k, op,
             ": hash_table must have shape [V, top_k=", r.top_k, "] with V >= 1, got ",
             table.sizes());
  for (const Tensor* t : {&ids, &table}) {
    KIMI_CHECK(!device.has_value() || t->device() == *device, op, ": ",
               t == &ids ? "input_ids" : "hash_table", " must be on the device of ", device_of,
               ", got ", t->device(), " and ", *device);
  }
  if (ids.device().type() != torch::headeronly::DeviceType::CPU) {
    return;  // a GPU flags a bad index in the routing (NaN weights) instead of a sync here
  }
  const int64_t V = table.size(0);
  for (int64_t m = 0; m < ids.size(0); ++m) {
    const int64_t token = index_at(ids, m, ids.stride(0));
    KIMI_CHECK(token >= 0 && token < V, op, ": input_ids must be in [0, V=", V,
               ") (hash_table's rows), got ", token, " at ", m);
    for (int64_t i = 0; i < r.top_k; ++i) {
      const int64_t expert = index_at(table, token * table.stride(0) + i * table.stride(1), 1);
      KIMI_CHECK(expert >= 0 && expert < N, op, ": hash_table must hold expert ids in [0, N=",
                 N, "), got ", expert, " at [", token, ", ", i, "]");
    }
  }
}

}  // namespace

void check_routed_dtype(const char* op, const char* name, ScalarType dtype) {
  KIMI_CHECK(dtype == kFloat || dtype == kBFloat16, op, ": ", name,
             " must be torch.float32 or torch.bfloat16, got ", dtype_name(dtype));
}

void check_routing_args(const char* op, int64_t M, int64_t N, const std::optional<Device>& device,
                        const char* device_of, const OptionalTensor& bias,
                        const RoutingParams& r) {
  const int64_t top_k = r.top_k, n_group = r.n_group, topk_group = r.topk_group;
  const Scoring scoring = r.scoring;
  KIMI_CHECK(n_group >= 1 && N % n_group == 0, op,
             ": n_group must divide the number of experts, got n_group=", n_group,
             " and N=", N);
  KIMI_CHECK(topk_group >= 1 && topk_group <= n_group, op,
             ": topk_group must be in [1, n_group=", n_group, "], got ", topk_group);
  KIMI_CHECK(n_group == 1 || N / n_group >= 2 || scoring == Scoring::kSoftmax, op,
             ": with n_group > 1 and ", kScoringNames[static_cast<int>(scoring)],
             " scoring each group needs at least 2 experts "
             "(a group's score is the sum of its two best), got N=", N, " and n_group=",
             n_group);
  const int64_t kept = topk_group * (N / n_group);
  KIMI_CHECK(top_k >= 1 && top_k <= kept, op,
             ": top_k must be in [1, experts in the kept groups=", kept, "], got ", top_k);
  if (bias.has_value()) {
    const Tensor& b = *bias;
    check_routed_dtype(op, "e_score_correction_bias", b.scalar_type());
    KIMI_CHECK(b.dim() == 1 && b.size(0) == N, op,
               ": e_score_correction_bias must have shape [N]=[", N, "], got ", b.sizes());
    KIMI_CHECK(!device.has_value() || b.device() == *device, op,
               ": e_score_correction_bias must be on the device of ", device_of, ", got ",
               b.device(), " and ", *device);
    if (b.device().type() == torch::headeronly::DeviceType::CPU && !r.hashed()) {
      // (A GPU makes the weights NaN instead: routing_reference, kernels/routing.py.)
      const Tensor values = torch::stable::contiguous(torch::stable::to(b, kFloat));
      const float* v = static_cast<const float*>(values.data_ptr());
      for (int64_t e = 0; e < N; ++e) {
        KIMI_CHECK(std::isfinite(v[e]), op, ": e_score_correction_bias must be finite, got ",
                   v[e], " at ", e);
      }
    }
  }
  check_hash_args(op, M, N, device, device_of, r);
}

bool routing_kernel_fits(int64_t N, const RoutingParams& r, int64_t sm) {
  // The picked ids (and shared slots) are spread over the lanes of a warp, and so are the
  // group scores.
  return kernels_built_for(sm) && N <= kRouterMaxN && r.width() <= kRouterMaxTopK &&
         (r.topk_group == r.n_group || r.n_group <= kRouterMaxGroups);
}

namespace {
constexpr const char* kOp = "moe_routing";
}  // namespace

void check_moe_routing_inputs(const Tensor& logits, const OptionalTensor& bias,
                              const RoutingParams& r) {
  check_routed_dtype(kOp, "logits", logits.scalar_type());
  KIMI_CHECK(logits.dim() == 2, kOp, ": logits must be 2-D [M, N], got shape ",
             logits.sizes());
  KIMI_CHECK(logits.size(1) >= 1, kOp, ": logits must have N >= 1 experts, got shape ",
             logits.sizes());
  check_routing_args(kOp, logits.size(0), logits.size(1), logits.device(), "logits", bias, r);
}

namespace {

// Why moe_routing rejects N experts with these arguments and dtypes, or "" where it takes
// them: its own checks (not those of the tensors' values), for callers that choose between
// it and another implementation (the engines' plugins) without restating them.
std::string routing_misfit(int64_t num_experts, int64_t top_k, int64_t n_group,
                           int64_t topk_group, const std::string& scoring,
                           ScalarType logits_dtype, std::optional<ScalarType> bias_dtype) {
  try {  // in the op's order, so the first error is the op's
    const RoutingParams r = routing_params(kOp, top_k, n_group, topk_group, true, 1.0, scoring);
    check_routed_dtype(kOp, "logits", logits_dtype);
    KIMI_CHECK(num_experts >= 1, kOp, ": logits must have N >= 1 experts, got N=", num_experts);
    check_routing_args(kOp, 1, num_experts, std::nullopt, "logits", std::nullopt, r);
    if (bias_dtype.has_value()) {
      check_routed_dtype(kOp, "e_score_correction_bias", *bias_dtype);
    }
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// The picks' scores renormalized (if asked) and scaled.
Tensor routing_weights(Tensor weights, const RoutingParams& r) {
  if (r.renormalize) {
    weights = aten::div(weights, aten::add(aten::sum_last(weights), aten::scalar(1e-20)));
  }
  return aten::mul(weights, aten::scalar(r.routed_scaling_factor));
}

// Hash routing on the scores [M, N]: ids = hash_table[input_ids]. Where an index is out of
// range (only on a GPU: the CPU's check rejects it) the slot gets expert 0 and a NaN score,
// as the kernels do.
std::tuple<Tensor, Tensor> hashed_reference(const Tensor& scores, const RoutingParams& r) {
  using aten::scalar;
  const ScalarType kLong = ScalarType::Long;
  const auto within = [](const Tensor& t, int64_t end) {
    return call_tensor_op("aten::logical_and", "", call_tensor_op("aten::ge", "Tensor", t, scalar(0, kLong)),
                          call_tensor_op("aten::lt", "Tensor", t, scalar(double(end), kLong)));
  };
  const Tensor tokens = torch::stable::to(*r.input_ids, kLong);
  const Tensor table = torch::stable::to(*r.hash_table, kLong);
  const Tensor token_ok = within(tokens, table.size(0));
  const Tensor rows = call_tensor_op("aten::where", "self", token_ok, tokens, scalar(0, kLong));
  Tensor experts = call_tensor_op("aten::index_select", "", table, int64_t(0), rows);
  const Tensor ok = call_tensor_op("aten::logical_and", "", within(experts, scores.size(1)),
                                   torch::stable::unsqueeze(token_ok, -1));
  experts = call_tensor_op("aten::where", "self", ok, experts, scalar(0, kLong));
  const Tensor picked = call_tensor_op("aten::where", "self", ok, aten::gather_last(scores, experts),
                                       scalar(std::numeric_limits<double>::quiet_NaN()));
  return {routing_weights(picked, r), torch::stable::to(experts, kInt)};
}

}  // namespace

std::tuple<Tensor, Tensor> routing_reference(const Tensor& logits_in, const OptionalTensor& bias,
                                             const RoutingParams& r) {
  const NoGradGuard no_grad;
  const int64_t top_k = r.top_k, n_group = r.n_group, topk_group = r.topk_group;
  const Tensor logits = torch::stable::to(logits_in, kFloat);
  const int64_t M = logits.size(0), N = logits.size(1);
  const bool softmax = r.scoring == Scoring::kSoftmax;
  const Tensor scores = softmax ? aten::softmax_last(logits)
                        : r.scoring == Scoring::kSqrtsoftplus ? aten::sqrt_softplus(logits)
                                                               : aten::sigmoid(logits);
  if (r.hashed()) {
    return hashed_reference(scores, r);
  }
  Tensor choice = bias.has_value() ? aten::add(scores, torch::stable::to(*bias, kFloat)) : scores;
  if (topk_group < n_group) {
    const Tensor grouped = torch::stable::view(choice, {M, n_group, N / n_group});
    // A group's score: the sum of its two largest choice values (softmax: its largest).
    const Tensor best = aten::gather_last(grouped, aten::top_indices(grouped, softmax ? 1 : 2));
    const Tensor group_scores = torch::stable::view(aten::sum_last(best), {M, n_group});
    const Tensor kept = aten::mask_of(group_scores, aten::top_indices(group_scores, topk_group));
    const Tensor dropped = torch::stable::unsqueeze(aten::logical_not(kept), -1);
    choice = torch::stable::view(
        aten::masked_fill(grouped, dropped, -std::numeric_limits<double>::infinity()), {M, N});
  }
  const Tensor ids = aten::top_indices(choice, top_k);
  Tensor weights = routing_weights(aten::gather_last(scores, ids), r);
  if (bias.has_value()) {
    // A bias that is not finite (only on a GPU: the CPU's check rejects it) makes every
    // weight NaN, as the kernels do, rather than a valid-looking routing.
    const Tensor finite = call_tensor_op("aten::all", "", call_tensor_op("aten::isfinite", "", *bias));
    weights = call_tensor_op("aten::where", "self", finite, weights,
                             aten::scalar(std::numeric_limits<double>::quiet_NaN()));
  }
  return {weights, torch::stable::to(ids, kInt)};
}

RoutingParams moe_routing_out_params(const Tensor& logits, const OptionalTensor& bias,
                                     int64_t top_k, int64_t n_group, int64_t topk_group,
                                     bool renormalize, double routed_scaling_factor,
                                     const std::string& scoring, const OptionalTensor& input_ids,
                                     const OptionalTensor& hash_table,
                                     int64_t num_fused_shared_experts,
                                     double shared_expert_weight, const RoutingOutputs& out) {
  const char* op = "moe_routing_out";
  const RoutingParams r =
      routing_params_out(op, top_k, n_group, topk_group, renormalize, routed_scaling_factor,
                         scoring, input_ids, hash_table, num_fused_shared_experts,
                         shared_expert_weight);
  check_moe_routing_inputs(logits, bias, r);
  check_routing_outputs(op, logits.size(0), logits.size(1), logits.device(), r, out);
  return r;
}

void routing_reference_into(const Tensor& logits, const OptionalTensor& bias,
                            const RoutingParams& r, const RoutingOutputs& out) {
  auto [weights, ids] = routing_reference(logits, bias, r);
  write_routing(weights, ids, logits.size(1), r, out);
}

STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  // moe_routing into the caller's tensors: topk_weights fp32 and topk_ids int32 or int64
  // [M, top_k + num_fused_shared_experts] (the shared experts' slots last: ids N, N + 1, ...,
  // weight shared_expert_weight), expert_counts int32 [N + num_fused_shared_experts] added to.
  m.def(
      "moe_routing_out(Tensor logits, " KIMI_ROUTING_ARGS
      ", Tensor? input_ids=None, Tensor? hash_table=None, " KIMI_ROUTING_OUT_ARGS ") -> ()");
  m.def(
      "moe_routing(Tensor logits, " KIMI_ROUTING_ARGS
      ", Tensor? input_ids=None, Tensor? hash_table=None) -> (Tensor topk_weights, Tensor topk_ids)");
  // "" where moe_routing takes N experts with these arguments and dtypes, else its error.
  m.def(
      "routing_misfit(int num_experts, int top_k, int n_group=1, int topk_group=1, "
      "str scoring=\"sigmoid\", ScalarType logits_dtype=float32, ScalarType? bias_dtype=None) -> str");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CompositeExplicitAutograd, m) {
  m.impl("routing_misfit", TORCH_BOX(&routing_misfit));
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("moe_routing", TORCH_BOX(&moe_routing_op<routing_reference>));
  m.impl("moe_routing_out", TORCH_BOX(&moe_routing_out_op<routing_reference_into>));
}

#ifdef KIMI_WITH_CUDA

// CUDA implementation of the routing ops: the PDL-launched routing kernel where it fits
// (sm_90 / sm_100, N <= 1024, top_k + shared slots <= 32, at most 32 groups when some are
// dropped), the ATen reference otherwise; hash-routed calls too.

namespace {

// The routing kernel for checked CUDA logits, or nullptr (the reference serves them).
const RoutingKernel* routing_kernel(const Tensor& logits, const OptionalTensor& bias,
                                    const RoutingParams& r) {
  const int sm = device_sm(logits.get_device_index());
  // Without a bias the fp32 kernel runs with has_bias = 0 and never reads the stand-in.
  const ScalarType bias_dtype = bias.has_value() ? bias->scalar_type() : kFloat;
  if (!routing_kernel_fits(logits.size(1), r, sm) ||
      logits.size(0) > std::numeric_limits<int32_t>::max()) {
    return nullptr;
  }
  const int64_t N = logits.size(1);
  return find_kernel(kRoutingKernels, sm, [&](const RoutingKernel& k) {
    return k.n_min <= N && N <= k.n_max && k.logits_dtype == logits.scalar_type() &&
           k.bias_dtype == bias_dtype;
  });
}

void launch_routing(const RoutingKernel& kernel, const Tensor& logits, const OptionalTensor& bias_in,
                    const RoutingParams& r, const RoutingOutputs& out) {
  const int64_t N = logits.size(1);
  const int device = logits.get_device_index();
  const Tensor bias = bias_in.has_value() ? unit_stride_vector(*bias_in) : out.weights;  // a stand-in
  RoutingArgs args{};
  args.logits = matrix_arg(logits);
  args.bias = row_arg(bias, N);
  const HashArgs hash = hash_args(r.input_ids, r.hash_table, out.weights);
  args.input_ids = hash.input_ids;
  args.hash_table = hash.hash_table;
  args.routing = r.kernel_scalars(bias_in.has_value());
  put_routing_outputs(args, out, N, r);
  launch_kernel(kRoutingKernels, kernel, args, device, current_stream(device));
}

}  // namespace

std::tuple<Tensor, Tensor> moe_routing_on_gpu(const Tensor& logits_in, const OptionalTensor& bias,
                                              const RoutingParams& r) {
  const Tensor logits = unit_inner_stride(logits_in);
  const RoutingKernel* kernel = routing_kernel(logits, bias, r);
  if (kernel == nullptr) {
    return routing_reference(logits, bias, r);
  }
  const int64_t M = logits.size(0);
  const RoutingOutputs out{empty_on(logits, {M, r.width()}, kFloat),
                           empty_on(logits, {M, r.width()}, kInt), std::nullopt};
  if (M > 0) {
    launch_routing(*kernel, logits, bias, r, out);
  }
  return {out.weights, out.ids};
}

void moe_routing_on_gpu_into(const Tensor& logits_in, const OptionalTensor& bias,
                             const RoutingParams& r, const RoutingOutputs& out) {
  const Tensor logits = unit_inner_stride(logits_in);
  const RoutingKernel* kernel = routing_kernel(logits, bias, r);
  if (kernel == nullptr) {
    routing_reference_into(logits, bias, r, out);
  } else if (logits.size(0) > 0) {
    launch_routing(*kernel, logits, bias, r, out);
  }
}

namespace {

// The entry points' implementations: on the logits' device.
std::tuple<Tensor, Tensor> routing_on_device(const Tensor& logits, const OptionalTensor& bias,
                                             const RoutingParams& r) {
  const DeviceGuard guard(logits.get_device_index());
  return moe_routing_on_gpu(logits, bias, r);
}

void routing_on_device_into(const Tensor& logits, const OptionalTensor& bias,
                            const RoutingParams& r, const RoutingOutputs& out) {
  const DeviceGuard guard(logits.get_device_index());
  moe_routing_on_gpu_into(logits, bias, r, out);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("moe_routing", TORCH_BOX(&moe_routing_op<routing_on_device>));
  m.impl("moe_routing_out", TORCH_BOX(&moe_routing_out_op<routing_on_device_into>));
}

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
