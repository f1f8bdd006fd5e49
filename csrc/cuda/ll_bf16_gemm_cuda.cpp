// CUDA implementation: validate, choose the kernel, launch it on the current stream.
// The kernels were compiled ahead of time (kimi_router_ops.aot); nothing compiles here.

#include "kernel_support.h"
#include "../ll_bf16_gemm.h"

namespace kimi {

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

}  // namespace kimi
