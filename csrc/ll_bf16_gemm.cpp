// The op's schema, its input contract, the kernel choice and the CPU reference kernel.

#include <Python.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <limits>
#include <sstream>

#include "kimi_variant_table.h"
#include "ll_bf16_gemm.h"

// `import kimi_router_ops._C` loads this library, whose static initializers register the ops.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

namespace kimi {

std::string dtype_name(c10::ScalarType t) {
  return "torch." + std::string(c10::getDtypeNames(t).first);
}

void check_inputs(const at::Tensor& x, const at::Tensor& w, c10::ScalarType out_dtype,
                  const char* op) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kBFloat16,
                   op, ": hidden_states must be torch.bfloat16, got ", dtype_name(x.scalar_type()));
  TORCH_CHECK_TYPE(w.scalar_type() == at::kBFloat16,
                   op, ": router_weight must be torch.bfloat16, got ", dtype_name(w.scalar_type()));
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": hidden_states must be 2-D [M, K], got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(w.dim() == 2, op, ": router_weight must be 2-D [N, K], got shape ",
                    w.sizes());
  TORCH_CHECK_VALUE(x.size(1) == w.size(1),
                    op, ": hidden_states [M, K] and router_weight [N, K] must have the "
                    "same K, got hidden_states ", x.sizes(), " and router_weight ", w.sizes());
  TORCH_CHECK_VALUE(x.size(1) > 0, op, ": K must be at least 1, got hidden_states ",
                    x.sizes());
  TORCH_CHECK_VALUE(w.size(0) > 0, op, ": router_weight must have N >= 1 rows, got ",
                    w.sizes());
  TORCH_CHECK(x.device() == w.device(),
              op, ": hidden_states and router_weight must be on the same device, got ",
              x.device(), " and ", w.device());
  TORCH_CHECK_VALUE(out_dtype == at::kFloat || out_dtype == at::kBFloat16,
                    op, ": out_dtype must be torch.float32 or torch.bfloat16, got ",
                    dtype_name(out_dtype));
}

bool kernels_support(int64_t sm, int64_t N, int64_t K) {
  // Built for Hopper (sm_90a) and datacenter Blackwell (sm_100a); sizes are 32-bit.
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  return (sm == 90 || sm == 100) && N <= kInt32Max && K <= kInt32Max;
}

Choice choose_kernel(int64_t M, int64_t N, int64_t K, int64_t sm, bool vec8_ok) {
  const Choice cublas{nullptr, 0};
  if (!kernels_support(sm, N, K)) {
    return cublas;
  }
  // The first line of CHOICES that takes the problem (variants.py); a row built for 16-byte
  // loads only is passed over when the input does not allow them. No line: cuBLAS.
  for (const ChoiceRow& choice : kChoiceRows) {
    if (choice.m_lo <= M && M <= choice.m_hi && choice.n_min <= N && N <= choice.n_max &&
        choice.k_min <= K && K <= choice.k_max) {
      if (choice.variant < 0) {
        return cublas;
      }
      const VariantRow& row = kVariantRows[choice.variant];
      if (vec8_ok || row.scalar_loads) {
        return {&row, vec8_ok ? 8 : 1};
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

const VariantRow& variant_by_name(const std::string& name) {
  std::ostringstream names;
  for (const VariantRow& row : kVariantRows) {
    if (name == row.name) {
      return row;
    }
    names << " " << row.name;
  }
  TORCH_CHECK_VALUE(false, "ll_bf16_gemm_with_variant: unknown variant '", name,
                    "'; expected cublas or one of:", names.str());
}

#ifndef KIMI_WITH_CUDA
std::vector<std::string> compiled_kernel_symbols() { return {}; }
#endif

namespace {

at::Tensor ll_bf16_gemm_cpu(const at::Tensor& x, const at::Tensor& w, c10::ScalarType out_dtype) {
  check_inputs(x, w, out_dtype);
  // The reference: exact bf16 -> fp32 products, fp32 accumulation, one final rounding.
  return at::mm(x.to(at::kFloat), w.to(at::kFloat).t()).to(out_dtype);
}

at::Tensor ll_bf16_gemm_with_variant_cpu(const at::Tensor& x, const at::Tensor& w,
                                         const std::string& variant, c10::ScalarType out_dtype) {
  if (variant != "cublas") {
    variant_by_name(variant);
  }
  return ll_bf16_gemm_cpu(x, w, out_dtype);
}

std::string ll_bf16_gemm_variant(int64_t M, int64_t N, int64_t K, c10::ScalarType out_dtype,
                                 int64_t sm, bool aligned) {
  TORCH_CHECK_VALUE(M >= 0 && N >= 1 && K >= 1,
                    "ll_bf16_gemm_variant: expected M >= 0, N >= 1, K >= 1, got M=", M, " N=", N,
                    " K=", K);
  TORCH_CHECK_VALUE(out_dtype == at::kFloat || out_dtype == at::kBFloat16,
                    "ll_bf16_gemm_variant: out_dtype must be torch.float32 or torch.bfloat16, got ",
                    dtype_name(out_dtype));
  if (M == 0) {
    return "empty";
  }
  return describe(choose_kernel(M, N, K, sm, aligned && K % 8 == 0));
}

// Autograd in C++, so a call pays no Python on its way to the kernel. logits = x w^T:
// dx = dlogits w and dw = dlogits^T x, in fp32, returned in the inputs' dtype (bf16).
class LlBf16GemmFunction : public torch::autograd::Function<LlBf16GemmFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, c10::ScalarType out_dtype) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("kimi::ll_bf16_gemm", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::ScalarType)>();
    ctx->save_for_backward({x, w});
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x, w, out_dtype);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor grad = grads[0].to(at::kFloat);
    at::Tensor grad_x, grad_w;
    if (ctx->needs_input_grad(0)) {
      grad_x = at::mm(grad, w.to(at::kFloat)).to(x.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      grad_w = at::mm(grad.t(), x.to(at::kFloat)).to(w.scalar_type());
    }
    return {grad_x, grad_w, at::Tensor()};
  }
};

at::Tensor ll_bf16_gemm_autograd(const at::Tensor& x, const at::Tensor& w,
                                 c10::ScalarType out_dtype) {
  return LlBf16GemmFunction::apply(x, w, out_dtype);
}

}  // namespace

TORCH_LIBRARY(kimi, m) {
  m.def(
      "ll_bf16_gemm(Tensor hidden_states, Tensor router_weight, "
      "ScalarType out_dtype=float32) -> Tensor");
  // The same computation with the kernel named instead of chosen: for benchmarks and tests.
  m.def(
      "ll_bf16_gemm_with_variant(Tensor hidden_states, Tensor router_weight, str variant, "
      "ScalarType out_dtype=float32) -> Tensor");
  // The dispatch's choice for a problem, as "<variant>:vec<8|1>", "cublas" or "empty".
  m.def(
      "ll_bf16_gemm_variant(int M, int N, int K, ScalarType out_dtype=float32, int sm=90, "
      "bool aligned=True) -> str",
      &ll_bf16_gemm_variant);
  m.def("compiled_kernels() -> str[]", &compiled_kernel_symbols);
}

TORCH_LIBRARY_IMPL(kimi, Autograd, m) { m.impl("ll_bf16_gemm", &ll_bf16_gemm_autograd); }

TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("ll_bf16_gemm", &ll_bf16_gemm_cpu);
  m.impl("ll_bf16_gemm_with_variant", &ll_bf16_gemm_with_variant_cpu);
}

}  // namespace kimi
