// torch.ops.vllm_skinny.gemm(Tensor x, Tensor w) -> Tensor: a benchmark peer, never part of the
// package. vLLM 0.33.0's CuTe-DSL skinny GEMM (bf16 [M, N] = x [M, K] @ w [N, K]^T, fp32 sums),
// the kernels Kimi-K3's down-projection runs on SM90 at M = 1..3, compiled ahead of time by
// tools/build_vllm_skinny.py and linked in as C objects (vllm_skinny_kernels.h). The checks are
// vLLM's ShapeDynamicSkinnyGemm.__call__'s; an M without a kernel is an error. Launches on the
// current stream (CUDA-graph capture included, also as the first call of a process).

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <mutex>

#include "vllm_skinny_kernels.h"

namespace vllm_skinny {
namespace {

constexpr int kMaxDevices = 64;

void check_cuda(cudaError_t err, const char* what, const char* symbol) {
  TORCH_CHECK(err == cudaSuccess, "vllm_skinny.gemm: ", what, " ", symbol, " failed: ",
              cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

// Loading a library is not stream work; a first call inside graph capture needs this thread's
// capture mode relaxed for the duration of the load.
void ensure_loaded(int device) {
  static std::once_flag process_once;
  static std::once_flag device_once[kMaxDevices];
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "vllm_skinny.gemm: device ", device);
  std::call_once(device_once[device], [device] {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    TORCH_CHECK(major * 10 + minor == kArchSm, "vllm_skinny.gemm: compiled for sm_90a; device is sm_",
                major, minor);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    std::call_once(process_once, [] {
      for (const CompiledKernel& k : kKernels) check_cuda(k.init(), "loading", k.symbol);
    });
    for (const CompiledKernel& k : kKernels) check_cuda(k.load_to_device(device), "preparing", k.symbol);
    cudaThreadExchangeStreamCaptureMode(&mode);
  });
}

at::Tensor gemm_cuda(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "vllm_skinny.gemm: x [M, K] and w [N, K] must be 2-D");
  TORCH_CHECK(x.is_cuda() && x.device() == w.device(), "vllm_skinny.gemm: x and w on one CUDA device");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16,
              "vllm_skinny.gemm: x and w must be bfloat16");
  TORCH_CHECK(x.size(1) == w.size(1) && w.is_contiguous(), "vllm_skinny.gemm: w [N, K] contiguous, K of x");
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  const CompiledKernel* kernel = nullptr;
  for (const CompiledKernel& k : kKernels) {
    if (k.M == M) kernel = &k;
  }
  TORCH_CHECK(kernel != nullptr, "vllm_skinny.gemm: no kernel for M=", M,
              " (vLLM runs cuBLAS there); rebuild with tools/build_vllm_skinny.py");
  TORCH_CHECK(N % kernel->outputs_per_block == 0 && K % kernel->k_tile == 0,
              "vllm_skinny.gemm: N % ", kernel->outputs_per_block, " and K % ", kernel->k_tile, " must be 0");
  // vLLM's row_stride_ok: unit stride along K, rows and data aligned to 8 elements (16 bytes).
  TORCH_CHECK(x.stride(1) == 1 && x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              "vllm_skinny.gemm: x must be row-major with 16-byte aligned rows");
  const c10::cuda::CUDAGuard guard(x.device());
  ensure_loaded(x.get_device());
  at::Tensor out = at::empty({M, N}, x.options());
  const LaunchArgs args{x.data_ptr(), w.data_ptr(), out.data_ptr(), static_cast<int32_t>(M),
                        static_cast<int32_t>(N), static_cast<int32_t>(K), x.stride(0), K, N};
  const int32_t err = kernel->launch(args, c10::cuda::getCurrentCUDAStream().stream());
  check_cuda(static_cast<cudaError_t>(err), "launching", kernel->symbol);
  return out;
}

}  // namespace
}  // namespace vllm_skinny

TORCH_LIBRARY(vllm_skinny, m) { m.def("gemm(Tensor x, Tensor w) -> Tensor"); }
TORCH_LIBRARY_IMPL(vllm_skinny, CUDA, m) { m.impl("gemm", &vllm_skinny::gemm_cuda); }
