// The op's schema, its input contract, the kernel choice and the CPU reference kernel.
//
// `_C` is a plain shared library (no Python module): kimi_router_ops/__init__.py loads it
// with torch.ops.load_library, and its static initializers register the ops. It reaches
// torch through the stable ABI only (torch_stable.h). The derivative of ll_bf16_gemm and the
// fake kernels are registered in Python (ops.py), the one place torch offers them to
// stable-ABI libraries.

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <sstream>

#include "kimi_tables.h"
#include "ll_bf16_gemm.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#endif

namespace kimi {

namespace {

void check_out_dtype(ScalarType out_dtype, const char* op) {
  KIMI_CHECK(out_dtype == kFloat || out_dtype == kBFloat16,
             op, ": out_dtype must be torch.float32 or torch.bfloat16, got ",
             dtype_name(out_dtype));
}

// Shapes, devices and out_dtype: the part of the contract every GEMM op shares.
void check_shapes(const Tensor& x, const Tensor& w, ScalarType out_dtype, const char* op) {
  KIMI_CHECK(x.dim() == 2, op, ": hidden_states must be 2-D [M, K], got shape ",
             x.sizes());
  KIMI_CHECK(w.dim() == 2, op, ": router_weight must be 2-D [N, K], got shape ",
             w.sizes());
  KIMI_CHECK(x.size(1) == w.size(1),
             op, ": hidden_states [M, K] and router_weight [N, K] must have the "
             "same K, got hidden_states ", x.sizes(), " and router_weight ", w.sizes());
  KIMI_CHECK(x.size(1) > 0, op, ": K must be at least 1, got hidden_states ", x.sizes());
  KIMI_CHECK(w.size(0) > 0, op, ": router_weight must have N >= 1 rows, got ",
             w.sizes());
  KIMI_CHECK(x.device() == w.device(),
             op, ": hidden_states and router_weight must be on the same device, got ",
             x.device(), " and ", w.device());
  check_out_dtype(out_dtype, op);
}

bool is_float_or_bf16(ScalarType t) { return t == kFloat || t == kBFloat16; }

// router_gemm's dtype rules on its inputs (after them: the shapes, then the bias).
void check_router_gemm_dtypes(ScalarType x, ScalarType w, const char* op) {
  KIMI_CHECK(is_float_or_bf16(w), op, ": router_weight must be torch.bfloat16 or torch.float32, got ",
             dtype_name(w));
  KIMI_CHECK(is_float_or_bf16(x), op, ": hidden_states must be torch.bfloat16 or torch.float32, got ",
             dtype_name(x));
  KIMI_CHECK(w == kFloat || x == kBFloat16, op,
             ": bf16 router_weight takes bf16 hidden_states, got ", dtype_name(x));
}

void check_gate_bias_dtype(ScalarType b, ScalarType w, const char* op, const char* bias_name) {
  KIMI_CHECK(b == w, op, ": ", bias_name, " must have router_weight's dtype ", dtype_name(w),
             ", got ", dtype_name(b));
}

}  // namespace

void check_inputs(const Tensor& x, const Tensor& w, ScalarType out_dtype, const char* op) {
  KIMI_CHECK(x.scalar_type() == kBFloat16, op,
             ": hidden_states must be torch.bfloat16, got ", dtype_name(x.scalar_type()));
  KIMI_CHECK(w.scalar_type() == kBFloat16, op,
             ": router_weight must be torch.bfloat16, got ", dtype_name(w.scalar_type()));
  check_shapes(x, w, out_dtype, op);
}

void check_router_gemm_inputs(const Tensor& x, const Tensor& w, const OptionalTensor& gate_bias,
                              ScalarType out_dtype, const char* op, const char* bias_name) {
  check_router_gemm_dtypes(x.scalar_type(), w.scalar_type(), op);
  check_shapes(x, w, out_dtype, op);
  if (gate_bias.has_value()) {
    const Tensor& b = *gate_bias;
    check_gate_bias_dtype(b.scalar_type(), w.scalar_type(), op, bias_name);
    KIMI_CHECK(b.dim() == 1 && b.size(0) == w.size(0), op, ": ", bias_name,
               " must have shape [N]=[", w.size(0), "], got ", b.sizes());
    KIMI_CHECK(b.device() == w.device(), op, ": ", bias_name,
               " must be on the device of router_weight, got ", b.device(), " and ", w.device());
  }
}

namespace {

std::atomic<bool>& batch_invariant_flag() {
  static std::atomic<bool> flag([] {
    const char* value = std::getenv("KIMI_ROUTER_OPS_BATCH_INVARIANT");
    return value != nullptr && std::strcmp(value, "") != 0 && std::strcmp(value, "0") != 0;
  }());
  return flag;
}

}  // namespace

bool batch_invariant() { return batch_invariant_flag().load(std::memory_order_relaxed); }

Tensor gemm_reference(const Tensor& x_in, const Tensor& w, const OptionalTensor& gate_bias,
                      ScalarType out_dtype) {
  const NoGradGuard no_grad;
  const Tensor wt = torch::stable::transpose(torch::stable::to(w, kFloat), 0, 1);
  Tensor x = torch::stable::to(x_in, kFloat);
  Tensor logits;
  if (batch_invariant() && x.size(0) > 1) {
    // One token at a time: a matrix product's blocking (and so its sums) depends on M.
    logits = empty_on(x, {x.size(0), w.size(0)}, kFloat);
    for (int64_t m = 0; m < x.size(0); ++m) {
      copy_into(torch::stable::narrow(logits, 0, m, 1), aten::mm(torch::stable::narrow(x, 0, m, 1), wt));
    }
  } else {
    logits = aten::mm(x, wt);
  }
  if (gate_bias.has_value()) {
    logits = aten::add(logits, torch::stable::to(*gate_bias, kFloat));
  }
  return torch::stable::to(logits, out_dtype);
}

bool kernels_support(int64_t sm, int64_t N, int64_t K) {
  // Sizes are 32-bit.
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  return kernels_built_for(sm) && N <= kInt32Max && K <= kInt32Max;
}

Choice choose_kernel(int64_t M, int64_t N, int64_t K, int64_t sm, ScalarType weight_dtype,
                     bool vec16_ok) {
  const Choice cublas{nullptr, 0};
  if (!kernels_support(sm, N, K)) {
    return cublas;
  }
  // The first line of CHOICES (BATCH_INVARIANT_CHOICES in that mode) that takes the problem
  // (kimi_router_ops/tables/gemm.py); a row built for 16-byte loads only is passed over when the input does not
  // allow them. No line: cuBLAS.
  const bool invariant = batch_invariant();
  const ChoiceRow* first = invariant ? std::begin(kBatchInvariantChoiceRows) : std::begin(kChoiceRows);
  const ChoiceRow* last = invariant ? std::end(kBatchInvariantChoiceRows) : std::end(kChoiceRows);
  for (const ChoiceRow* line = first; line != last; ++line) {
    const ChoiceRow& choice = *line;
    if (choice.weight_dtype == weight_dtype && choice.m_lo <= M && M <= choice.m_hi &&
        choice.n_min <= N && N <= choice.n_max && choice.k_min <= K && K <= choice.k_max) {
      if (choice.variant < 0) {
        return cublas;
      }
      const VariantRow& row = kVariantRows[choice.variant];
      if (vec16_ok || row.scalar_loads) {
        return {&row, vec16_ok ? row.vec16 : 1};
      }
    }
  }
  return cublas;
}

std::string describe(const Choice& choice) {
  if (choice.row == nullptr) {
    return "cublas";
  }
  return std::string(choice.row->name) + ":vec" + std::to_string(choice.vec);
}

int vec16_elements(ScalarType weight_dtype) { return weight_dtype == kFloat ? 4 : 8; }

const VariantRow& variant_by_name(const std::string& name) {
  return row_by_name(kVariantRows, name, "router_gemm_with_variant", "cublas or ");
}

#ifndef KIMI_WITH_CUDA
std::vector<std::string> compiled_kernel_symbols() { return {}; }
#endif

namespace {

Tensor ll_bf16_gemm_cpu(const Tensor& x, const Tensor& w, ScalarType out_dtype) {
  check_inputs(x, w, out_dtype);
  return gemm_reference(x, w, std::nullopt, out_dtype);
}

Tensor router_gemm_cpu(const Tensor& x, const Tensor& w, const OptionalTensor& bias,
                       ScalarType out_dtype) {
  check_router_gemm_inputs(x, w, bias, out_dtype, "router_gemm");
  return gemm_reference(x, w, bias, out_dtype);
}

Tensor router_gemm_with_variant_cpu(const Tensor& x, const Tensor& w, const std::string& variant,
                                     ScalarType out_dtype) {
  if (variant != "cublas") {
    variant_by_name(variant);
  }
  check_router_gemm_inputs(x, w, std::nullopt, out_dtype, "router_gemm_with_variant");
  return gemm_reference(x, w, std::nullopt, out_dtype);
}

bool set_batch_invariant(bool enabled) { return batch_invariant_flag().exchange(enabled); }

bool is_batch_invariant() { return batch_invariant(); }

std::string ll_bf16_gemm_variant(int64_t M, int64_t N, int64_t K, ScalarType out_dtype,
                                 int64_t sm, bool aligned, ScalarType weight_dtype) {
  KIMI_CHECK(M >= 0 && N >= 1 && K >= 1,
             "ll_bf16_gemm_variant: expected M >= 0, N >= 1, K >= 1, got M=", M, " N=", N,
             " K=", K);
  KIMI_CHECK(out_dtype == kFloat || out_dtype == kBFloat16,
             "ll_bf16_gemm_variant: out_dtype must be torch.float32 or torch.bfloat16, got ",
             dtype_name(out_dtype));
  KIMI_CHECK(is_float_or_bf16(weight_dtype),
             "ll_bf16_gemm_variant: weight_dtype must be torch.bfloat16 or torch.float32, got ",
             dtype_name(weight_dtype));
  if (M == 0) {
    return "empty";
  }
  return describe(choose_kernel(M, N, K, sm, weight_dtype,
                                aligned && K % vec16_elements(weight_dtype) == 0));
}

// "" where router_gemm takes these dtypes, else the error it raises: for callers choosing
// between it and another GEMM (the engines' plugins), in the op's order of checks.
std::string router_gemm_misfit(ScalarType x_dtype, ScalarType weight_dtype, ScalarType out_dtype,
                               std::optional<ScalarType> bias_dtype) {
  const char* op = "router_gemm";
  try {
    check_router_gemm_dtypes(x_dtype, weight_dtype, op);
    check_out_dtype(out_dtype, op);
    if (bias_dtype.has_value()) {
      check_gate_bias_dtype(*bias_dtype, weight_dtype, op, "bias");
    }
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

STABLE_TORCH_LIBRARY(kimi, m) {
  m.def(
      "ll_bf16_gemm(Tensor hidden_states, Tensor router_weight, "
      "ScalarType out_dtype=float32) -> Tensor");
  // router_gemm without a bias, with the kernel named instead of chosen (any weight dtype
  // the named row takes): for benchmarks and tests.
  m.def(
      "router_gemm_with_variant(Tensor hidden_states, Tensor router_weight, str variant, "
      "ScalarType out_dtype=float32) -> Tensor");
  // Batch-invariant mode on or off (ll_bf16_gemm.h: batch_invariant); returns the previous
  // setting. And the setting now.
  m.def("set_batch_invariant(bool enabled) -> bool");
  m.def("is_batch_invariant() -> bool");
  // The dispatch's choice for a problem, as "<variant>:vec<8|1>", "cublas" or "empty".
  m.def(
      "ll_bf16_gemm_variant(int M, int N, int K, ScalarType out_dtype=float32, int sm=90, "
      "bool aligned=True, ScalarType weight_dtype=bfloat16) -> str");
  // The router GEMM for bf16 or fp32 router weights, with F.linear's optional bias.
  m.def(
      "router_gemm(Tensor hidden_states, Tensor router_weight, Tensor? bias=None, "
      "ScalarType out_dtype=float32) -> Tensor");
  m.def("compiled_kernels() -> str[]");
  m.def(
      "router_gemm_misfit(ScalarType x_dtype, ScalarType weight_dtype, "
      "ScalarType out_dtype=float32, ScalarType? bias_dtype=None) -> str");
}

// Ops without tensor arguments: one kernel serves every caller.
STABLE_TORCH_LIBRARY_IMPL(kimi, CompositeExplicitAutograd, m) {
  m.impl("ll_bf16_gemm_variant", TORCH_BOX(&ll_bf16_gemm_variant));
  m.impl("compiled_kernels", TORCH_BOX(&compiled_kernel_symbols));
  m.impl("set_batch_invariant", TORCH_BOX(&set_batch_invariant));
  m.impl("is_batch_invariant", TORCH_BOX(&is_batch_invariant));
  m.impl("router_gemm_misfit", TORCH_BOX(&router_gemm_misfit));
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("ll_bf16_gemm", TORCH_BOX(&ll_bf16_gemm_cpu));
  m.impl("router_gemm", TORCH_BOX(&router_gemm_cpu));
  m.impl("router_gemm_with_variant", TORCH_BOX(&router_gemm_with_variant_cpu));
}

#ifdef KIMI_WITH_CUDA

// CUDA implementation: validate, choose the kernel, launch it on the current stream.
// The kernels were compiled ahead of time (kimi_router_ops.aot); nothing compiles here.

std::vector<std::string> compiled_kernel_symbols() {
  return {std::begin(kKernelSymbols), std::end(kKernelSymbols)};
}

namespace {

const GemmKernel& gemm_kernel(const VariantRow& row, int vec, ScalarType x_dtype,
                              ScalarType out_dtype, int sm) {
  const int variant = static_cast<int>(&row - kVariantRows);
  const GemmKernel* kernel = find_kernel(kGemmKernels, sm, [&](const GemmKernel& k) {
    return k.variant == variant && k.vec == vec && k.x_dtype == x_dtype &&
           k.out_dtype == out_dtype;
  });
  KIMI_CHECK(kernel != nullptr, "router_gemm: no compiled kernel ", row.name, " vec", vec,
             " for ", dtype_name(x_dtype), " hidden_states, ", dtype_name(out_dtype),
             " out, sm_", sm, " (a lab row's kernels are built only with KIMI_ROUTER_OPS_LAB=1)");
  return *kernel;
}

Tensor cublas_mm(const Tensor& x, const Tensor& w, const OptionalTensor& gate_bias,
                 ScalarType out_dtype) {
  // fp32 logits straight from cuBLAS's fp32 accumulator, never rounded through bf16; fp32
  // weights are multiplied in fp32 (the tokens widened), as F.linear(x.float(), w) does.
  const NoGradGuard no_grad;
  const Tensor wt = torch::stable::transpose(w, 0, 1);
  Tensor logits;
  if (w.scalar_type() == kFloat) {
    logits = aten::mm(torch::stable::to(x, kFloat), wt);
  } else if (out_dtype == kFloat || gate_bias.has_value()) {
    logits = aten::mm_float32(x, wt);
  } else {
    return aten::mm(x, wt);
  }
  if (gate_bias.has_value()) {
    logits = aten::add(logits, torch::stable::to(*gate_bias, kFloat));
  }
  return out_dtype == kFloat ? logits : torch::stable::to(logits, out_dtype);
}

}  // namespace

bool vec16_ok(const Tensor& x, const Tensor& w) {
  const int elements = vec16_elements(w.scalar_type());
  auto fits = [elements](const Tensor& t) {
    const TensorArg a = matrix_arg(t);
    const int64_t bytes = int64_t(elements) * int64_t(t.element_size());
    return a.shapes[1] % elements == 0 && a.strides[0] % elements == 0 &&
           reinterpret_cast<uintptr_t>(a.data) % bytes == 0;
  };
  return fits(x) && fits(w);
}

namespace {

// `row`: the variant named by router_gemm_with_variant, or nullptr for the automatic choice;
// `into`: the output, or nullptr for a new one.
Tensor launch(const VariantRow* row, const Tensor& x_in, const Tensor& w_in,
              const OptionalTensor& gate_bias, ScalarType out_dtype, const Tensor* into = nullptr) {
  const Tensor x = unit_inner_stride(x_in);
  const Tensor w = unit_inner_stride(w_in);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  if (M == 0) {
    return into != nullptr ? *into : empty_on(x, {M, N}, out_dtype);
  }
  const int device = x.get_device_index();
  const int sm = device_sm(device);
  const bool vec16 = vec16_ok(x, w);
  if (row == nullptr) {
    row = choose_kernel(M, N, K, sm, w.scalar_type(), vec16).row;
  } else {
    KIMI_CHECK(row->weight_dtype == w.scalar_type(), "router_gemm_with_variant: variant ",
               row->name, " takes ", dtype_name(row->weight_dtype), " router_weight, got ",
               dtype_name(w.scalar_type()));
    KIMI_CHECK(M <= row->max_m, "router_gemm_with_variant: variant ", row->name,
               " handles M <= ", row->max_m, ", got M = ", M);
    KIMI_CHECK(kernels_support(sm, N, K), "router_gemm_with_variant: no kernels for sm_", sm,
               " or for N=", N, " K=", K);
    KIMI_CHECK(vec16 || row->scalar_loads, "router_gemm_with_variant: variant ", row->name,
               " needs K % ", row->vec16, " == 0, row strides % ", row->vec16,
               " == 0 and aligned data; got K = ", K);
    KIMI_CHECK(row->k_only == 0 || K == row->k_only, "router_gemm_with_variant: variant ", row->name,
               " computes K = ", row->k_only, " only (compiled in), got K = ", K);
  }
  if (row == nullptr && !(batch_invariant() && M > 1)) {
    const Tensor logits = cublas_mm(x, w, gate_bias, out_dtype);
    if (into == nullptr) {
      return logits;
    }
    copy_into(*into, logits);
    return *into;
  }
  Tensor out = into != nullptr ? *into : empty_on(x, {M, N}, out_dtype);
  if (row == nullptr) {
    // Batch-invariant and no kernel: cuBLAS one token at a time (its algorithm depends on M).
    Tensor rows = x;
    for (int64_t m = 0; m < M; ++m) {
      copy_into(torch::stable::narrow(out, 0, m, 1),
                cublas_mm(torch::stable::narrow(rows, 0, m, 1), w, gate_bias, out_dtype));
    }
    return out;
  }
  const GemmKernel& kernel =
      gemm_kernel(*row, vec16 ? row->vec16 : 1, x.scalar_type(), out_dtype, sm);
  GemmArgs args{};
  const Tensor gate = put_gemm_operands(args, x, w, gate_bias);
  args.out = matrix_arg(out);
  const cudaStream_t stream = current_stream(device);
  if (M <= row->max_m) {
    launch_kernel(kGemmKernels, kernel, args, device, stream);
    return out;
  }
  // More tokens than one grid holds (a batch-invariant row takes any M): one launch a slice.
  for (int64_t first = 0; first < M; first += row->max_m) {
    const int64_t count = std::min<int64_t>(row->max_m, M - first);
    Tensor xs = x;
    args.x = matrix_arg(torch::stable::narrow(xs, 0, first, count));
    args.out = matrix_arg(torch::stable::narrow(out, 0, first, count));
    launch_kernel(kGemmKernels, kernel, args, device, stream);
  }
  return out;
}

Tensor ll_bf16_gemm_cuda(const Tensor& x, const Tensor& w, ScalarType out_dtype) {
  check_inputs(x, w, out_dtype);
  const DeviceGuard guard(x.get_device_index());
  return launch(nullptr, x, w, std::nullopt, out_dtype);
}

Tensor router_gemm_cuda(const Tensor& x, const Tensor& w, const OptionalTensor& bias,
                        ScalarType out_dtype) {
  check_router_gemm_inputs(x, w, bias, out_dtype, "router_gemm");
  const DeviceGuard guard(x.get_device_index());
  return launch(nullptr, x, w, bias, out_dtype);
}

Tensor router_gemm_with_variant_cuda(const Tensor& x, const Tensor& w, const std::string& variant,
                                      ScalarType out_dtype) {
  check_router_gemm_inputs(x, w, std::nullopt, out_dtype, "router_gemm_with_variant");
  const DeviceGuard guard(x.get_device_index());
  if (variant == "cublas") {
    return cublas_mm(unit_inner_stride(x), unit_inner_stride(w), std::nullopt, out_dtype);
  }
  return launch(&variant_by_name(variant), x, w, std::nullopt, out_dtype);
}

}  // namespace

Tensor gemm_on_gpu(const Tensor& x, const Tensor& w, const OptionalTensor& gate_bias,
                   ScalarType out_dtype, const Tensor* into) {
  return launch(nullptr, x, w, gate_bias, out_dtype, into);
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("ll_bf16_gemm", TORCH_BOX(&ll_bf16_gemm_cuda));
  m.impl("router_gemm", TORCH_BOX(&router_gemm_cuda));
  m.impl("router_gemm_with_variant", TORCH_BOX(&router_gemm_with_variant_cuda));
}

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
