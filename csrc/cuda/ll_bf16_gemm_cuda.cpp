// CUDA implementation: validate, choose the kernel, launch it on the current stream.
// The kernels were compiled ahead of time (kimi_router_ops/aot.py); nothing compiles here.

#include "kernel_support.h"
#include "kimi_kernels.h"
#include "kimi_variant_table.h"
#include "../ll_bf16_gemm.h"

namespace kimi {

std::vector<std::string> compiled_kernel_symbols() {
  std::vector<std::string> symbols;
  for (const CompiledKernel& kernel : kCompiledKernels) {
    symbols.emplace_back(kernel.symbol);
  }
  for (const CompiledRouterKernel& kernel : kCompiledRouterKernels) {
    symbols.emplace_back(kernel.symbol);
  }
  for (const CompiledRoutingKernel& kernel : kCompiledRoutingKernels) {
    symbols.emplace_back(kernel.symbol);
  }
  for (const CompiledNormKernel& kernel : kCompiledNormKernels) {
    symbols.emplace_back(kernel.symbol);
  }
  for (const CompiledAttnResKernel& kernel : kCompiledAttnResKernels) {
    symbols.emplace_back(kernel.symbol);
  }
  return symbols;
}

namespace {

const CompiledKernel& find_kernel(const VariantRow& row, int vec, ScalarType out_dtype, int sm) {
  const int variant = static_cast<int>(&row - kVariantRows);
  for (const CompiledKernel& kernel : kCompiledKernels) {
    if (kernel.variant == variant && kernel.vec == vec && kernel.out_dtype == out_dtype &&
        kernel.sm == sm) {
      return kernel;
    }
  }
  throw std::runtime_error(message("ll_bf16_gemm: no compiled kernel ", row.name, " vec", vec,
                                   " ", dtype_name(out_dtype), " for sm_", sm));
}

Tensor cublas_mm(const Tensor& x, const Tensor& w, ScalarType out_dtype) {
  // fp32 logits straight from cuBLAS's fp32 accumulator, never rounded through bf16.
  const NoGradGuard no_grad;
  const Tensor wt = torch::stable::transpose(w, 0, 1);
  return out_dtype == kFloat ? aten::mm_float32(x, wt) : aten::mm(x, wt);
}

// `row`: the variant named by ll_bf16_gemm_with_variant, or nullptr for the automatic choice.
Tensor launch(const VariantRow* row, const Tensor& x_in, const Tensor& w_in, ScalarType out_dtype) {
  const Tensor x = unit_inner_stride(x_in);
  const Tensor w = unit_inner_stride(w_in);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  if (M == 0) {
    return empty_on(x, {M, N}, out_dtype);
  }
  const int device = x.get_device_index();
  const int sm = device_sm(device);
  const bool vec8 = vec8_aligned(x) && vec8_aligned(w);
  if (row == nullptr) {
    row = choose_kernel(M, N, K, sm, vec8).row;
  } else {
    KIMI_CHECK(M <= row->max_m, "ll_bf16_gemm_with_variant: variant ", row->name,
                     " handles M <= ", row->max_m, ", got M = ", M);
    KIMI_CHECK(kernels_support(sm, N, K), "ll_bf16_gemm_with_variant: no kernels for sm_", sm,
               " or for N=", N, " K=", K);
    KIMI_CHECK(vec8 || row->scalar_loads, "ll_bf16_gemm_with_variant: variant ", row->name,
                     " needs K % 8 == 0, row strides % 8 == 0 and 16-byte aligned data; got K = ",
                     K);
  }
  if (row == nullptr) {
    return cublas_mm(x, w, out_dtype);
  }
  Tensor out = empty_on(x, {M, N}, out_dtype);
  const CompiledKernel& kernel = find_kernel(*row, vec8 ? 8 : 1, out_dtype, sm);
  ensure_loaded(kCompiledKernels, device);
  TensorArg xa = matrix_arg(x), wa = matrix_arg(w), oa = matrix_arg(out);
  const int32_t err = kernel.launch(&xa, &wa, &oa, current_stream(device));
  check_cuda(static_cast<cudaError_t>(err), "launching", kernel.symbol);
  return out;
}

Tensor ll_bf16_gemm_cuda(const Tensor& x, const Tensor& w, ScalarType out_dtype) {
  check_inputs(x, w, out_dtype);
  const DeviceGuard guard(x.get_device_index());
  return launch(nullptr, x, w, out_dtype);
}

Tensor ll_bf16_gemm_with_variant_cuda(const Tensor& x, const Tensor& w, const std::string& variant,
                                      ScalarType out_dtype) {
  check_inputs(x, w, out_dtype);
  const DeviceGuard guard(x.get_device_index());
  if (variant == "cublas") {
    return cublas_mm(unit_inner_stride(x), unit_inner_stride(w), out_dtype);
  }
  return launch(&variant_by_name(variant), x, w, out_dtype);
}

}  // namespace

Tensor gemm_on_gpu(const Tensor& x, const Tensor& w, ScalarType out_dtype) {
  return launch(nullptr, x, w, out_dtype);
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("ll_bf16_gemm", TORCH_BOX(&ll_bf16_gemm_cuda));
  m.impl("ll_bf16_gemm_with_variant", TORCH_BOX(&ll_bf16_gemm_with_variant_cuda));
}

}  // namespace kimi
