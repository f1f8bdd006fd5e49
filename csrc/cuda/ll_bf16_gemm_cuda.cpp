// CUDA implementation: validate, choose the kernel, launch it on the current stream.
// The kernels were compiled ahead of time (kimi_router_ops/aot.py); nothing compiles here.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <iterator>
#include <mutex>

#include "kimi_kernels.h"
#include "kimi_variant_table.h"
#include "../ll_bf16_gemm.h"

namespace kimi {

std::vector<std::string> compiled_kernel_symbols() {
  std::vector<std::string> symbols;
  for (const CompiledKernel& kernel : kCompiledKernels) {
    symbols.emplace_back(kernel.symbol);
  }
  return symbols;
}

namespace {

constexpr size_t kNumKernels = std::size(kCompiledKernels);
constexpr int kMaxDevices = 64;

int device_sm(int device) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(device);
  return props->major * 10 + props->minor;
}

void check_cuda(cudaError_t err, const char* what, const char* symbol) {
  TORCH_CHECK(err == cudaSuccess, "ll_bf16_gemm: ", what, " ", symbol, " failed: ",
              cudaGetErrorString(err));
}

// The first call in a process may happen inside CUDA-graph capture. Loading a library is
// not stream work, but the global capture mode forbids it on any thread; relaxed mode for
// the duration of the load lets it through without touching the captured stream.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Loads this device's kernels once: the embedded cubin of each once per process, then the
// per-device attributes. Devices load lazily, so a process touches only GPUs it uses.
void ensure_loaded(int device) {
  static cudaLibrary_t libraries[kNumKernels];
  static std::once_flag kernel_once[kNumKernels];
  static std::once_flag device_once[kMaxDevices];
  TORCH_CHECK(device < kMaxDevices, "ll_bf16_gemm: device index ", device, " >= ", kMaxDevices);
  std::call_once(device_once[device], [device] {
    RelaxedCaptureMode relaxed;
    const int sm = device_sm(device);
    for (size_t i = 0; i < kNumKernels; ++i) {
      const CompiledKernel& kernel = kCompiledKernels[i];
      if (kernel.sm != sm) {
        continue;
      }
      std::call_once(kernel_once[i], [&] {
        cudaLibrary_t* library = &libraries[i];
        cudaError_t err = cudaSuccess;
        struct {
          cudaLibrary_t** library;
          cudaError_t* err;
        } args = {&library, &err};
        kernel.init(reinterpret_cast<void**>(&args));
        check_cuda(err, "loading", kernel.symbol);
      });
      cudaLibrary_t* library = &libraries[i];
      int32_t device_id = device;
      cudaError_t err = cudaSuccess;
      struct {
        cudaLibrary_t** library;
        int32_t* device_id;
        cudaError_t* err;
      } args = {&library, &device_id, &err};
      kernel.load_to_device(reinterpret_cast<void**>(&args));
      check_cuda(err, "preparing", kernel.symbol);
    }
  });
}

const CompiledKernel& find_kernel(const VariantRow& row, int vec, c10::ScalarType out_dtype,
                                  int sm) {
  const int variant = static_cast<int>(&row - kVariantRows);
  for (const CompiledKernel& kernel : kCompiledKernels) {
    if (kernel.variant == variant && kernel.vec == vec && kernel.out_dtype == out_dtype &&
        kernel.sm == sm) {
      return kernel;
    }
  }
  TORCH_CHECK(false, "ll_bf16_gemm: no compiled kernel ", row.name, " vec", vec, " ", out_dtype,
              " for sm_", sm);
}

// Sizes-one dimensions have arbitrary strides; give them the contiguous one so the
// alignment test below is not fooled by a stride that is never used.
int64_t row_stride(const at::Tensor& t) { return t.size(0) == 1 ? t.size(1) : t.stride(0); }

bool vec8_aligned(const at::Tensor& t) {
  return t.size(1) % 8 == 0 && row_stride(t) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Unit stride along K is the kernels' one layout requirement; other layouts are copied once.
at::Tensor unit_inner_stride(const at::Tensor& t) {
  return (t.stride(1) == 1 || t.size(1) == 1) ? t : t.contiguous();
}

at::Tensor cublas_mm(const at::Tensor& x, const at::Tensor& w, c10::ScalarType out_dtype) {
  // fp32 logits straight from cuBLAS's fp32 accumulator, never rounded through bf16.
  return out_dtype == at::kFloat ? at::mm(x, w.t(), at::kFloat) : at::mm(x, w.t());
}

at::Tensor launch(const VariantRow* row, const at::Tensor& x_in, const at::Tensor& w_in,
                  c10::ScalarType out_dtype) {
  const at::Tensor x = unit_inner_stride(x_in);
  const at::Tensor w = unit_inner_stride(w_in);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  at::Tensor out = at::empty({M, N}, x.options().dtype(out_dtype));
  if (M == 0) {
    return out;
  }
  const int device = x.get_device();
  const int sm = device_sm(device);
  const bool vec8 = vec8_aligned(x) && vec8_aligned(w);
  if (row == nullptr) {
    row = choose_kernel(M, N, K, sm, vec8).row;
  } else {
    TORCH_CHECK_VALUE(M <= row->m_hi, "ll_bf16_gemm_with_variant: variant ", row->name,
                      " handles M <= ", row->m_hi, ", got M = ", M);
    TORCH_CHECK(kernels_support(sm, N, K), "ll_bf16_gemm_with_variant: no kernels for sm_", sm,
                " or for N=", N, " K=", K);
    TORCH_CHECK_VALUE(vec8 || row->scalar_loads, "ll_bf16_gemm_with_variant: variant ", row->name,
                      " needs K % 8 == 0, row strides % 8 == 0 and 16-byte aligned data; got K = ",
                      K);
  }
  if (row == nullptr) {
    return cublas_mm(x, w, out_dtype);
  }
  const CompiledKernel& kernel = find_kernel(*row, vec8 ? 8 : 1, out_dtype, sm);
  ensure_loaded(device);
  TensorArg xa{x.data_ptr(), {int32_t(M), int32_t(K)}, {row_stride(x)}};
  TensorArg wa{w.data_ptr(), {int32_t(N), int32_t(K)}, {row_stride(w)}};
  TensorArg oa{out.data_ptr(), {int32_t(M), int32_t(N)}, {N}};
  const int32_t err = kernel.launch(&xa, &wa, &oa, at::cuda::getCurrentCUDAStream(device));
  check_cuda(static_cast<cudaError_t>(err), "launching", kernel.symbol);
  return out;
}

at::Tensor ll_bf16_gemm_cuda(const at::Tensor& x, const at::Tensor& w, c10::ScalarType out_dtype) {
  check_inputs(x, w, out_dtype);
  const c10::cuda::CUDAGuard guard(x.device());
  return launch(nullptr, x, w, out_dtype);
}

at::Tensor ll_bf16_gemm_with_variant_cuda(const at::Tensor& x, const at::Tensor& w,
                                          const std::string& variant, c10::ScalarType out_dtype) {
  check_inputs(x, w, out_dtype);
  const c10::cuda::CUDAGuard guard(x.device());
  if (variant == "cublas") {
    return cublas_mm(unit_inner_stride(x), unit_inner_stride(w), out_dtype);
  }
  return launch(&variant_by_name(variant), x, w, out_dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("ll_bf16_gemm", &ll_bf16_gemm_cuda);
  m.impl("ll_bf16_gemm_with_variant", &ll_bf16_gemm_with_variant_cuda);
}

}  // namespace kimi
